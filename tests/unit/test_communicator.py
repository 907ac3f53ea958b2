"""The communicator picks the right backend per machine, op and size; results equal
a float64 reference; the ledger is zero after close — also with graph capture and discard."""

from __future__ import annotations

import pytest

from commsim.scenario.model import Fault, Group, Scenario, Workload
from commsim.scenario.runner import run_scenario
from commsim.topology import GpuRef, build_preset, modify
from commsim.topology.model import FabricState

KiB, MiB = 1 << 10, 1 << 20


def scenario(preset: str, ranks: list[int] | None = None, sizes=(4 * KiB,), ops=("all_reduce",),
             capture=False, discard=False, cluster=None, faults=(), dtypes=("bfloat16",)) -> Scenario:
    c = cluster or build_preset(preset)
    refs = list(c.gpu_refs())
    ranks = ranks if ranks is not None else list(range(len(refs)))
    placement = tuple(refs[i] for i in ranks)
    return Scenario(name=f"{preset}-{len(ranks)}", cluster=c, placement=placement,
                    groups=(Group("tp", tuple(range(len(ranks)))),),
                    workload=Workload(ops=tuple(ops), sizes=tuple(sizes), dtypes=tuple(dtypes),
                                      graph_capture=capture, discard_capture=discard),
                    faults=tuple(faults), seed=7)


def chosen(res, op="all_reduce", dtype="bfloat16") -> dict[int, str]:
    return {k[2]: b for k, b in res.backends.items() if k[1] == op and k[3] == dtype}


def assert_clean(res) -> None:
    assert not res.errors, res.errors
    assert not res.mismatches, res.mismatches
    assert not res.leaks, res.leaks
    assert not res.flags, res.flags
    assert res.ok, res.failures


CASES = [
    # (id, preset, ranks, {size: expected backend for all_reduce})
    ("hgx-h100-tp8", "hgx-h100-8", None, {4 * KiB: "ipc", 1 * MiB: "ipc", 10 * MiB: "multicast"}),
    ("gb200-tp4-tray", "gb200-nvl72:1", None, {4 * KiB: "ipc", 10 * MiB: "multicast"}),
    ("gb200-tp8-2trays", "gb200-nvl72:2", None, {4 * KiB: "fabric", 2 * MiB: "fabric", 10 * MiB: "multicast"}),
    ("gb200-tp2-across", "gb200-nvl72:2", [0, 4], {4 * KiB: "fabric"}),
    ("l40s-tp4", "l40s-8-pcie", [0, 1, 2, 3], {4 * KiB: "nccl", 10 * MiB: "nccl"}),
    ("a100-tp2-pair", "a100-pcie-bridge-8", [0, 1], {4 * KiB: "ipc"}),
    ("a100-tp4-pairs", "a100-pcie-bridge-8", [0, 1, 2, 3], {4 * KiB: "nccl"}),
    ("rtx4090-tp2", "rtx4090-8", [0, 1], {4 * KiB: "nccl"}),
]


@pytest.mark.parametrize("mode", ["eager", "capture", "discard"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_backend_choice_numerics_and_ledger(case, mode):
    _, preset, ranks, expect = case
    res = run_scenario(scenario(preset, ranks, sizes=tuple(expect), capture=mode != "eager",
                                discard=mode == "discard"))
    assert_clean(res)
    assert chosen(res) == expect


def test_all_ops_and_dtypes_on_gb200_two_trays():
    ops = ("all_reduce", "all_gather", "reduce_scatter", "all_reduce_rmsnorm")
    res = run_scenario(scenario("gb200-nvl72:2", sizes=(4 * KiB, 512 * KiB), ops=ops,
                                dtypes=("float32", "float16", "bfloat16")))
    assert_clean(res)
    assert set(chosen(res, "all_gather", "float16").values()) == {"fabric"}
    assert set(chosen(res, "reduce_scatter", "float32").values()) == {"fabric"}


def test_rack_tp72_uses_fabric():
    res = run_scenario(scenario("gb200-nvl72", sizes=(64 * KiB,)))
    assert_clean(res)
    assert chosen(res) == {64 * KiB: "fabric"}


def test_explain_gives_reasons():
    res = run_scenario(scenario("gb200-nvl72:2"))
    text = res.explain["tp"]
    assert "ipc: declined: ranks are on 2 hosts" in text
    assert "legacy IPC handles are host-local" in text
    assert "fabric: admitted" in text


# --- faults: a correct fallback, never a hang, no leak --------------------------------------

def test_imex_missing_on_one_tray_falls_back_to_nccl():
    c = modify.without_imex(build_preset("gb200-nvl72:2"), "gb200-nvl72-tray01")
    res = run_scenario(scenario("gb200-nvl72:2", cluster=c, sizes=(4 * KiB, 10 * MiB)))
    assert_clean(res)
    assert chosen(res) == {4 * KiB: "nccl", 10 * MiB: "nccl"}
    assert "have no IMEX channel" in res.explain["tp"]


def test_fabric_state_not_completed_on_one_gpu():
    c = modify.with_fabric_state(build_preset("gb200-nvl72:2"), GpuRef("gb200-nvl72-tray00", 2),
                                 FabricState.IN_PROGRESS)
    res = run_scenario(scenario("gb200-nvl72:2", cluster=c))
    assert_clean(res)
    assert chosen(res) == {4 * KiB: "nccl"}
    assert "rank(s) 2 report fabric state not COMPLETED" in res.explain["tp"]


def test_p2p_disabled_on_hgx_pair_declines_ipc():
    c = modify.without_p2p(build_preset("hgx-h100-8"), "hgx-h100-0", 2, 5)
    res = run_scenario(scenario("hgx-h100-8", cluster=c))
    assert_clean(res)
    # Rows N1/N3: the NVLinks stay up, so NVML still reports the NVSwitch board and the
    # multicast object (no peer access needed) is used; ipc is declined for the P2P fact,
    # not misnamed as "not fully NVLink-connected".
    assert chosen(res) == {4 * KiB: "multicast"}
    assert "some pair of GPUs has no P2P access" in res.explain["tp"]
    assert "not fully NVLink-connected" not in res.explain["tp"]


def test_oom_during_ipc_workspace_falls_back_without_leak():
    sc = scenario("hgx-h100-8", faults=(Fault("oom", rank=3, at_allocation=1),), sizes=(4 * KiB,))
    res = run_scenario(sc)
    assert_clean(res)
    assert chosen(res) == {4 * KiB: "multicast"}
    assert "ipc: declined after set-up failure" in res.explain["tp"]
    assert "rank 3" in res.explain["tp"] and "cudaErrorMemoryAllocation" in res.explain["tp"]


def test_same_seed_same_trace():
    a = run_scenario(scenario("gb200-nvl72:2"))
    b = run_scenario(scenario("gb200-nvl72:2"))
    assert a.trace_hash == b.trace_hash and a.trace_hash


def test_driver_call_fault_during_peer_open_falls_back_everywhere():
    sc = scenario("hgx-h100-8", faults=(Fault("call_fails", rank=2, api="cudaIpcOpenMemHandle",
                                              code="cudaErrorTooManyPeers", nth=3),))
    res = run_scenario(sc)
    assert_clean(res)                       # no hang, no residue on any rank
    assert chosen(res) == {4 * KiB: "multicast"}
    assert "rank 2: cudaIpcOpenMemHandle failed: cudaErrorTooManyPeers" in res.explain["tp"]


def test_close_is_idempotent_and_safe_after_failed_init():
    from commsim.communicator import Communicator
    from commsim.group import LocalWorld
    from commsim.policy import Policy
    from commsim.sim import SimFabric, spawn_driver
    from commsim.sim.faults import ProcessFaults

    c = build_preset("gb200-nvl72:2")
    fabric = SimFabric(c)
    drivers = [spawn_driver(fabric, g, ProcessFaults(oom_at=1) if i == 5 else None)
               for i, g in enumerate(c.gpu_refs())]
    strict = Policy(order=("fabric",), fallback_on_setup_error=False)

    def rank(g):
        try:
            Communicator(g, drivers[g.rank], strict)
        except Exception as e:
            return type(e).__name__, getattr(e, "commsim_step", None)
        return None

    out = LocalWorld(8, 0).run(rank)
    assert [o.value for o in out] == [("SetupFailed", "init")] * 8
    assert all(not d.ledger.summary() for d in drivers) and not fabric.allocs

    def twice(g):
        comm = Communicator(g, drivers[g.rank])
        comm.close()
        comm.close()
        return comm.closed

    fabric2 = SimFabric(c)
    drivers[:] = [spawn_driver(fabric2, g) for g in c.gpu_refs()]
    assert all(o.value for o in LocalWorld(8, 0).run(twice))
    assert not fabric2.allocs


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_all_reduce_rmsnorm_is_the_formula_and_leaves_its_arguments(dtype):
    """out = rmsnorm(all_reduce(x) + residual) * weight and r = all_reduce(x) + residual, in
    float32 cast back, against a float64 evaluation; x, residual and weight stay as given."""
    import torch

    from commsim.communicator import Communicator
    from commsim.group import LocalWorld
    from commsim.sim import SimFabric, spawn_driver

    c = build_preset("hgx-h100-8")
    fabric = SimFabric(c)
    drivers = [spawn_driver(fabric, g) for g in list(c.gpu_refs())[:2]]
    dt = getattr(torch, dtype)
    n = 4096
    xs = [torch.arange(n, dtype=torch.float32).remainder(13).sub(6 - r).to(dt) for r in range(2)]
    residual = torch.linspace(-2, 2, n).to(dt)
    weight = torch.linspace(0.5, 1.5, n).to(dt)

    def rank(g):
        comm = Communicator(g, drivers[g.rank])
        x, res0, w0 = xs[g.rank].clone(), residual.clone(), weight.clone()
        out, r = comm.all_reduce_rmsnorm(x, residual, weight)
        comm.close()
        assert torch.equal(x, xs[g.rank]) and torch.equal(residual, res0) and torch.equal(weight, w0)
        return out, r

    outs = LocalWorld(2, 0).run(rank)
    s = sum(x.double() for x in xs) + residual.double()
    want = s * torch.rsqrt(s.pow(2).mean() + 1e-6) * weight.double()
    tol = 1e-6 if dtype == "float32" else 8e-3
    for o in outs:
        out, r = o.value
        assert out.dtype == r.dtype == dt
        assert torch.equal(r, s.to(dt))
        assert float((out.double() - want).abs().max()) <= tol * float(want.abs().max()) + 1e-6
