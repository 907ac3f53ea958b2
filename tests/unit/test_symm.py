"""The `symm` backend on the machines it must serve and the ones it must decline.

Each run: a communicator whose policy is symm then nccl, every op eager and inside a CUDA-graph
capture, results against a float64 reference, and every rank's ledger at zero after close and
after every injected set-up failure (which the ranks vote, so all fall back to nccl together).
"""

from __future__ import annotations

import pytest
import torch
from cuda.bindings import driver as cu

from commsim.communicator import Communicator
from commsim.group import LocalWorld
from commsim.policy import Policy
from commsim.sim import SimFabric, spawn_driver
from commsim.sim.faults import CallFault, ProcessFaults
from commsim.topology import build_preset
from commsim.topology.model import GpuRef

POLICY = Policy(order=("symm", "nccl"))
KiB, MiB = 1 << 10, 1 << 20


def run_group(preset: str, gpus: list[GpuRef] | None = None, n: int | None = None,
              faults: dict[int, ProcessFaults] | None = None, sizes=(16 * KiB, 512 * KiB),
              capture: bool = True, cluster=None, policy: Policy = POLICY):
    cluster = cluster or build_preset(preset)
    refs = gpus or list(cluster.gpu_refs())[:n]
    fabric = SimFabric(cluster, seed=0)
    drivers = [spawn_driver(fabric, g, (faults or {}).get(r)) for r, g in enumerate(refs)]
    ws = len(refs)
    inputs = {(op, s, r): torch.randint(-8, 9, (s // 2,), generator=torch.Generator().manual_seed(
        hash((op, s, r)) & 0xFFFF)).to(torch.bfloat16)
        for op in ("all_reduce", "all_gather", "reduce_scatter") for s in sizes for r in range(ws)}

    def reference(op, s, r):
        xs = [inputs[(op, s, k)].double() for k in range(ws)]
        if op == "all_gather":
            return torch.cat(xs)
        total = torch.stack(xs).sum(0)
        return total.chunk(ws)[r] if op == "reduce_scatter" else total

    def rank(group):
        comm = Communicator(group, drivers[group.rank], policy)
        got = {}
        for mode in (("capture",) if capture else ()) + ("eager",):
            outs = []
            ctx = comm.capture() if mode == "capture" else None
            if ctx:
                ctx.__enter__()
            for op in ("all_reduce", "all_gather", "reduce_scatter"):
                for s in sizes:
                    outs.append((op, s, getattr(comm, op)(inputs[(op, s, group.rank)])))
            if ctx:
                ctx.__exit__(None, None, None)
            for op, s, y in outs:
                ref = reference(op, s, group.rank)
                assert y.shape == ref.shape and torch.equal(y.double(), ref), (mode, op, s)
                got[(op, s)] = comm.chosen(op, s if op != "reduce_scatter" else s, "bfloat16")
        text = comm.explain()
        comm.close()
        return got, text, drivers[group.rank].ledger.count()

    outs = LocalWorld(ws, seed=0).run(rank)
    for o in outs:
        assert o.ok, o.error
    left = [fabric.exit_process(d.proc.pid) for d in drivers]
    assert all(o.value[2] == 0 for o in outs), [o.value[2] for o in outs]   # zero after close
    assert not any(left), left
    return outs[0].value[0], outs[0].value[1]


def test_hgx_single_host_posix_fd_and_multicast():
    chosen, text = run_group("hgx-h100-8", n=8)
    assert "symm: admitted" in text and "fd handles, multicast object bound" in text
    assert set(chosen.values()) == {"symm"}
    assert "all_reduce 16384 B -> symm multimem" in text
    assert "all_gather 16384 B -> symm direct" in text


def test_gb200_two_trays_fabric_and_multicast_across_hosts():
    chosen, text = run_group("gb200-nvl72:2", n=8)
    assert "group world: 8 ranks on 2 host(s)" in text
    assert "fabric handles, multicast object bound" in text
    assert set(chosen.values()) == {"symm"}


def test_bridge_pair_without_multicast_uses_peer_kernels():
    """A100 NVLink-bridge pair: no multicast (Hopper+), so multicast_ptr is 0 (row M8) and
    all-reduce runs one-shot or two-shot over the peer mappings."""
    chosen, text = run_group("a100-pcie-bridge-8", n=2, sizes=(16 * KiB, 1 * MiB))
    assert "multicast address 0: no multicast for this group (row M8)" in text
    assert "all_reduce 16384 B -> symm one-shot" in text       # bytes x ws <= 1 MiB
    assert "all_reduce 1048576 B -> symm two-shot" in text


@pytest.mark.parametrize("preset,reason", [
    ("l40s-8-pcie", "no P2P from rank 0 to rank 1: peer loads and stores of mapped symmetric "
                    "memory need P2P (row L10)"),
    ("rtx4090-8", "no P2P from rank 0 to rank 1"),
])
def test_pcie_box_is_declined_with_the_reason(preset, reason):
    chosen, text = run_group(preset, n=4, capture=False)
    assert f"symm: declined: {reason}" in text
    assert set(chosen.values()) == {"nccl"}


def test_a100_pairs_without_full_nvlink_are_declined():
    cluster = build_preset("a100-pcie-bridge-8")
    chosen, text = run_group("a100-pcie-bridge-8", gpus=list(cluster.gpu_refs())[:4], capture=False)
    assert "symm: declined: GPUs are not all NVLink-connected" in text


CUDA_OOM = cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY


@pytest.mark.parametrize("preset,api,rank", [
    ("hgx-h100-8", "cuMemCreate", 3),
    ("hgx-h100-8", "cuMemExportToShareableHandle", 0),
    ("hgx-h100-8", "cuMemImportFromShareableHandle", 5),
    ("hgx-h100-8", "cuMemMap", 7),
    ("gb200-nvl72:2", "cuMemImportFromShareableHandle", 6),
    ("gb200-nvl72:2", "cuMemSetAccess", 1),
])
def test_a_failure_on_one_rank_is_voted_and_leaves_nothing(preset, api, rank):
    faults = {rank: ProcessFaults(calls=[CallFault(api, CUDA_OOM, 1)])}
    chosen, text = run_group(preset, n=8, faults=faults, capture=False, sizes=(16 * KiB,))
    assert "symm: declined after set-up failure" in text and f"rank {rank}" in text
    assert set(chosen.values()) == {"nccl"}


def test_rendezvous_keys_are_per_group():
    """Two groups over the same ranks each start their keys at 0: a rank's n-th rendezvous
    in a group meets its peers' n-th, whatever other groups it joined first."""
    cluster = build_preset("hgx-h100-8")
    fabric = SimFabric(cluster, seed=0)
    drivers = [spawn_driver(fabric, g) for g in list(cluster.gpu_refs())[:4]]

    def rank(world):
        sub = world.new_subgroup([0, 1], "pair")
        if sub is not None:
            c = Communicator(sub, drivers[world.rank], POLICY)
            c.close()
        c = Communicator(world, drivers[world.rank], POLICY)
        y = c.all_reduce(torch.ones(64, dtype=torch.bfloat16))
        c.close()
        return float(y[0])

    outs = LocalWorld(4, seed=0).run(rank)
    assert [o.value for o in outs] == [4.0] * 4, [o.error for o in outs]


@pytest.mark.parametrize("preset,api,rank", [
    ("hgx-h100-8", "cuMulticastCreate", 0),
    ("hgx-h100-8", "cuMulticastBindMem", 2),
    ("gb200-nvl72:2", "cuMulticastAddDevice", 4),
])
def test_a_multicast_failure_carries_on_with_address_zero(preset, api, rank):
    """Row S1 (pytorch/pytorch#136577): multicast set-up failing on GPUs whose attribute says
    it is supported leaves the backend up with multicast address 0, and it says so."""
    faults = {rank: ProcessFaults(calls=[CallFault(api, CUDA_OOM, 1)])}
    chosen, text = run_group(preset, n=8, faults=faults, capture=False, sizes=(16 * KiB,))
    assert "symm: admitted" in text and "declined after set-up failure" not in text
    assert "carrying on with multicast address 0 (row S1)" in text and f"rank {rank}" in text
    assert set(chosen.values()) == {"symm"}
    assert "all_reduce 16384 B -> symm one-shot" in text


def test_container_without_nvidia_caps_keeps_symm_without_multicast():
    """Rows MC3/S1: the attribute says multicast, the container refuses the object."""
    from commsim.topology.model import ContainerCaps
    c = build_preset("hgx-h200-8").replace_host("hgx-h200-0", container=ContainerCaps(nvidia_caps=False))
    chosen, text = run_group("hgx-h200-8", n=4, cluster=c, capture=False, sizes=(16 * KiB,))
    assert "CUDA_ERROR_INVALID_VALUE" in text and "multicast address 0 (row S1)" in text
    assert set(chosen.values()) == {"symm"}


def test_multimem_without_checking_the_address_is_a_sticky_illegal_address():
    """Rows S2/MC6: a caller that runs multimem although the address is 0 (the set-up fell
    back, S1) gets cudaErrorIllegalAddress, and the context stays broken."""
    from commsim.driver import CudaError
    from commsim.topology.model import ContainerCaps
    cluster = build_preset("hgx-h200-8").replace_host("hgx-h200-0", container=ContainerCaps(nvidia_caps=False))
    fabric = SimFabric(cluster, seed=0)
    drivers = [spawn_driver(fabric, GpuRef("hgx-h200-0", i)) for i in range(2)]
    pol = Policy(order=("symm", "nccl"), params={"symm_multimem_unchecked": True})

    def rank(group):
        comm = Communicator(group, drivers[group.rank], pol)
        try:
            comm.all_reduce(torch.ones(1024, dtype=torch.bfloat16))
        except CudaError as e:
            return int(e.code), int(drivers[group.rank].cudaMalloc(16)[0])
        return None

    outs = LocalWorld(2, seed=0).run(rank)
    assert [o.value for o in outs] == [(700, 700), (700, 700)], [(o.value, o.error) for o in outs]


def test_multimem_on_gpus_that_never_had_multicast_meets_mc6_at_the_op():
    """Rows MC1/M8/MC6: without NVSwitch the attribute is 0, multicast is never set up (no
    failed set-up, no S1 note); an unchecked multimem kernel still meets address 0 at the op,
    sticky. A caller that checks the address runs the peer kernels instead."""
    from commsim.driver import CudaError
    cluster = build_preset("h200-nvl-4way-8")
    for unchecked, want in ((True, [(700, 700)] * 2), (False, [None] * 2)):
        fabric = SimFabric(cluster, seed=0)
        drivers = [spawn_driver(fabric, GpuRef("h200-nvl-0", i)) for i in range(2)]
        pol = Policy(order=("symm", "nccl"), params={"symm_multimem_unchecked": unchecked})

        def rank(group):
            comm = Communicator(group, drivers[group.rank], pol)
            assert "row M8" in comm.explain() and "row S1" not in comm.explain()
            try:
                comm.all_reduce(torch.ones(1024, dtype=torch.bfloat16))
            except CudaError as e:
                return int(e.code), int(drivers[group.rank].cudaMalloc(16)[0])
            comm.close()
            return None

        outs = LocalWorld(2, seed=0).run(rank)
        assert [o.value for o in outs] == want, [(o.value, o.error) for o in outs]


def test_pidfd_exchange_works_and_is_refused_without_ptrace():
    """Row W7: the pidfd_getfd fd exchange maps peers like SCM_RIGHTS does, and a container
    without CAP_SYS_PTRACE refuses it with EPERM (voted: every rank falls back)."""
    from commsim.topology.model import ContainerCaps
    pol = Policy(order=("symm", "nccl"), params={"symm_fd_exchange": "pidfd"})
    chosen, text = run_group("hgx-h100-8", n=4, capture=False, sizes=(16 * KiB,), policy=pol)
    assert set(chosen.values()) == {"symm"}
    c = build_preset("hgx-h100-8").replace_host("hgx-h100-0", container=ContainerCaps(pidfd_getfd=False))
    chosen, text = run_group("hgx-h100-8", n=4, cluster=c, capture=False, sizes=(16 * KiB,), policy=pol)
    assert set(chosen.values()) == {"nccl"} and "EPERM: pidfd_getfd" in text


def test_a_voted_allocation_failure_leaves_the_rendezvous_keys_where_they_were():
    """The allocation's vote travels with the rendezvous exchange; a failure voted there gives
    the key's number back, so the next set-up in the group meets at key 0 again, as when no
    rank reached the rendezvous (a shifted key on some members would hang them)."""
    cluster = build_preset("hgx-h100-8")
    fabric = SimFabric(cluster, seed=0)
    faults = {2: ProcessFaults(calls=[CallFault("cuMemCreate", CUDA_OOM, 1)])}
    drivers = [spawn_driver(fabric, g, faults.get(r)) for r, g in enumerate(list(cluster.gpu_refs())[:4])]

    def rank(world):
        first = Communicator(world, drivers[world.rank], POLICY)
        first.close()
        second = Communicator(world, drivers[world.rank], POLICY)
        y = second.all_reduce(torch.ones(64, dtype=torch.bfloat16))
        second.close()
        return first.explain(), second.chosen("all_reduce", 128), float(y[0])

    w = LocalWorld(4, seed=0)
    outs = w.run(rank)
    assert all(o.ok for o in outs), [o.error for o in outs]
    assert all("symm: declined after set-up failure: symm init: allocate symmetric buffer: rank 2"
               in o.value[0] for o in outs), outs[0].value[0]
    assert [o.value[1:] for o in outs] == [("symm", 4.0)] * 4
    pid_keys = [e.seq for e in w.scheduler.events() if e.tag == "symm.init: exchange pids"]
    assert pid_keys == ["symm/world/0/fd"] * 8, pid_keys      # both set-ups, every rank
