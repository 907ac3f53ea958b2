"""The oracle on hand-built scenarios: handle types per pair and legal backends per group."""

from __future__ import annotations

from commsim.scenario.generate import build_shape
from commsim.scenario.model import Group, Scenario, Workload
from commsim.scenario.legal import group_truth, legal_backends, op_legal
from commsim.scenario.oracle import judge
from commsim.scenario.runner import run_scenario
from commsim.topology import modify
from commsim.topology.model import FabricState, GpuRef
from commsim.topology.presets import build
from commsim.topology.truth import FABRIC, IPC, POSIX_FD, importable

Mi = 1 << 20


def scen(cluster, world, ops=("all_reduce",), sizes=(4096,), dtypes=("bfloat16",), placement=None):
    pl = tuple(placement or list(cluster.gpu_refs())[:world])
    return Scenario(name="t", cluster=cluster, placement=pl, groups=(Group("tp", tuple(range(len(pl)))),),
                    workload=Workload(ops=ops, sizes=sizes, dtypes=dtypes))


def legal(sc):
    return group_truth(sc, sc.groups[0].ranks, "tp").legal


def test_handle_types_per_pair() -> None:
    gb = build("gb200-nvl72:2")
    a, b, c = GpuRef("gb200-nvl72-tray00", 0), GpuRef("gb200-nvl72-tray00", 1), GpuRef("gb200-nvl72-tray01", 0)
    assert importable(gb, a, b) == {IPC, POSIX_FD, FABRIC}
    assert importable(gb, a, c) == {FABRIC}                 # across trays: fabric only (L8, V8)
    assert FABRIC not in importable(modify.without_imex(gb, "gb200-nvl72-tray01"), a, c)
    assert FABRIC not in importable(modify.with_zero_cluster_uuid(gb, c), a, c)
    assert FABRIC not in importable(modify.with_fabric_state(gb, c, FabricState.IN_PROGRESS), a, c)
    assert FABRIC not in importable(modify.with_nvlinks_down(gb, a), a, c)
    assert IPC not in importable(modify.without_p2p(gb, "gb200-nvl72-tray00", 0, 1), a, b)
    h = build("hgx-h100-8")
    x, y = GpuRef("hgx-h100-0", 0), GpuRef("hgx-h100-0", 1)
    assert importable(h, x, y) == {IPC, POSIX_FD}           # no IMEX, zero UUID: no fabric
    r = build("rtx4090-8")
    assert importable(r, GpuRef("rtx4090-0", 0), GpuRef("rtx4090-0", 1)) == {POSIX_FD}


def test_legal_backends_per_machine() -> None:
    assert legal(scen(build("hgx-h100-8"), 8)) == ("ipc", "multicast", "symm", "nccl")
    assert legal(scen(build("gb200-nvl72:2"), 8)) == ("fabric", "multicast", "symm", "nccl")
    assert legal(scen(build("gb200-nvl72:1"), 4)) == ("ipc", "fabric", "multicast", "symm", "nccl")
    assert legal(scen(build("rtx4090-8"), 4)) == ("nccl",)
    assert legal(scen(build("a100-pcie-bridge-8"), 2)) == ("ipc", "symm", "nccl")      # a bridged pair
    assert legal(scen(build("a100-pcie-bridge-8"), 4)) == ("nccl",)            # not all NVLink
    assert legal(scen(build("dgx1-v100"), 1)) == ("nccl",)
    assert legal(scen(build_shape("hgx-h100-8*2"), 16)) == ("nccl",)          # two domains
    assert legal(scen(build("gb200-nvl72:4"), 16)) == ("fabric", "multicast", "symm", "nccl")   # ws 16: no ipc
    hgx = build("hgx-h100-8")
    assert legal(scen(modify.with_fabric_state(hgx, GpuRef("hgx-h100-0", 0), FabricState.IN_PROGRESS), 8)) \
        == ("ipc", "symm", "nccl")                                           # row M3
    assert legal(scen(modify.without_multicast(hgx, GpuRef("hgx-h100-0", 3)), 8)) == ("ipc", "symm", "nccl")


def test_per_call_limits() -> None:
    p = {"max_size": 8 * Mi}
    assert op_legal("ipc", "all_reduce", 8 * Mi - 16, 8, p)
    assert not op_legal("ipc", "all_reduce", 8 * Mi, 8, p)
    assert not op_legal("fabric", "all_reduce", 24, 8, p)
    assert not op_legal("ipc", "all_gather", 1 * Mi, 8, p)            # 8 MiB gathered
    assert op_legal("ipc", "all_gather", 1 * Mi - 16, 8, p)
    assert op_legal("multicast", "all_reduce_rmsnorm", 24, 8, p)
    assert not op_legal("multicast", "all_gather", 16, 8, p)
    assert op_legal("nccl", "reduce_scatter", 3, 8, p)


def test_per_op_legality_and_a_clean_verdict() -> None:
    sc = scen(build("hgx-h100-8"), 8, ops=("all_reduce", "all_gather"), sizes=(4096, 24, 1 * Mi))
    lb = legal_backends(sc)
    assert lb[("tp", "all_reduce", 4096, "bfloat16")][0] == "ipc"
    assert lb[("tp", "all_reduce", 24, "bfloat16")][0] == "multicast"
    assert lb[("tp", "all_gather", 24, "bfloat16")] == ("nccl",)
    assert lb[("tp", "all_gather", 1 * Mi, "bfloat16")] == ("symm", "nccl")   # 8 MiB gathered
    v = judge(sc, run_scenario(sc))
    assert v.ok, v.render()


def test_verdict_names_a_wrong_choice() -> None:
    sc = scen(build("hgx-h100-8"), 2)
    res = run_scenario(sc)
    key = ("tp", "all_reduce", 4096, "bfloat16")
    res.backends[key] = "fabric"
    assert judge(sc, res).kinds == ("illegal-backend",)
    res.backends[key] = "nccl"
    assert judge(sc, res).kinds == ("not-best",)
    res.backends[key] = "ipc"
    res.leaks.append("rank 0: allocation: cudaMalloc(16)")
    assert judge(sc, res).kinds == ("leak",)
