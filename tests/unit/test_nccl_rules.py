"""NCCL's eligibility rules as a pure function of the machine and NCCL_* variables 
(docs/lifecycle-rules.md NC1-NC12)."""

from __future__ import annotations

import re

import pytest

from commsim.errors import UserError
from commsim.libmodels.nccl_rules import (decide, env_sensitivity, machine_from_cluster, machine_from_view,
                                parse_env)
from commsim.topology import build_preset
from commsim.topology.model import GpuRef


def machine(preset: str, n: int | None = None, refs: list[GpuRef] | None = None, cluster=None):
    c = cluster or build_preset(preset)
    return machine_from_cluster(c, refs or list(c.gpu_refs())[:n])


def d(m, **env):
    return decide(m, parse_env({k: str(v) for k, v in env.items()}))


def kinds(dec) -> set[str]:
    return {t.kind for t in dec.transports}


def test_hgx_p2p_over_nvlink_via_cumem_and_nvls():
    dec = d(machine("hgx-h100-8"))
    assert dec.init_error is None and dec.cumem and dec.nvls and not dec.mnnvl
    assert {t.via for t in dec.transports} == {"cuMem POSIX fd over NVLink"}
    assert dec.algorithms("all_reduce") == ("Ring", "Tree", "NVLS")
    assert dec.algorithms("all_gather") == ("Ring", "NVLS")         # single-node NVLS AG
    assert "PAT" not in dec.algorithms("reduce_scatter")             # 8 GPUs on one node


def test_cumem_off_uses_legacy_ipc():
    dec = d(machine("hgx-h100-8", 2), NCCL_CUMEM_ENABLE=0)
    assert [t.via for t in dec.transports] == ["legacy IPC over NVLink"]
    assert not dec.nvls                                              # multicast needs cuMem


def test_p2p_disable_and_level():
    m = machine("hgx-h100-8", 4)
    assert kinds(d(m, NCCL_P2P_DISABLE=1)) == {"SHM"}
    assert kinds(d(m, NCCL_P2P_LEVEL="LOC")) == {"SHM"}
    assert kinds(d(m, NCCL_P2P_LEVEL="NVL")) == {"P2P"}              # NVLink is within NVL


def test_shm_disable_falls_to_net():
    assert kinds(d(machine("hgx-h100-8", 2), NCCL_P2P_DISABLE=1, NCCL_SHM_DISABLE=1)) == {"NET"}


def test_pcie_box_without_peer_access_uses_shm():
    dec = d(machine("l40s-8-pcie"))
    assert kinds(dec) == {"SHM"} and not dec.nvls
    assert all("cudaDeviceCanAccessPeer" in t.why or "beyond P2P level PXB" in t.why
               for t in dec.transports)
    assert dec.algorithms("all_reduce") == ("Ring", "Tree")


def test_p2p_stops_at_the_host_bridge_by_default():
    """NC3 (src/graph/paths.cc ncclTopoCheckP2p, v2.27.3-1: p2pLevel = PATH_PXB): a pair
    across host bridges (NODE = NCCL's PHB) uses SHM unless NCCL_P2P_LEVEL reaches it; a
    pair behind one PCIe switch (PIX) uses P2P."""
    c = build_preset("a100-pcie-bridge-8")
    m = machine(None, cluster=c, refs=[GpuRef(c.hosts[0].name, i) for i in (0, 2)])
    assert kinds(d(m)) == {"SHM"} and "path PHB is beyond P2P level PXB" in d(m).transports[0].why
    assert [t.via for t in d(m, NCCL_P2P_LEVEL="PHB").transports] == ["cuMem POSIX fd over PCIe PHB"]
    c = build_preset("rtx-pro-6000-4")
    pix = machine(None, cluster=c, refs=[GpuRef(c.hosts[0].name, i) for i in (0, 1)])
    assert [t.via for t in d(pix).transports] == ["cuMem POSIX fd over PCIe PIX"]
    assert kinds(d(pix, NCCL_P2P_LEVEL="LOC")) == {"SHM"}


def test_the_simulated_nccl_reads_the_pcie_path_from_the_driver():
    """The simulated NCCL's topology (libmodels/nccl/topo.py) asks the driver for the PCIe
    path, so on the machine it decides as the rules do over the topology: P2P on the PIX
    pair, SHM across the host bridges."""
    from commsim.libmodels.nccl import topo
    from commsim.sim import SimFabric, spawn_driver
    c = build_preset("rtx-pro-6000-4")
    refs = list(c.gpu_refs())
    fabric = SimFabric(c, seed=0)
    infos = [topo.local_info(spawn_driver(fabric, g), r) for r, g in enumerate(refs)]
    assert infos[0].pci[1:] == ("PIX", "PHB", "PHB")
    assert decide(topo.machine(infos)).transport_summary() == \
        decide(machine_from_cluster(c, refs)).transport_summary()


def test_gb200_two_trays_mnnvl_one_clique():
    dec = d(machine("gb200-nvl72", 8))
    assert dec.mnnvl and dec.nodes == 1 and dec.nvls
    assert kinds(dec) == {"P2P"}
    assert any(t.via == "cuMem FABRIC over multi-node NVLink" for t in dec.transports)
    assert dec.algorithms("all_reduce") == ("Ring", "Tree", "NVLS")
    off = d(machine("gb200-nvl72", 8), NCCL_MNNVL_ENABLE=0)
    assert not off.mnnvl and "NET" in kinds(off) and off.algorithms("all_reduce") == ("Ring", "Tree", "NVLSTree")


def test_gb200_imex_missing_is_a_hard_init_error():
    c = build_preset("gb200-nvl72:2")
    c = c.replace_host(c.hosts[1].name, imex_channels=())
    dec = d(machine(None, cluster=c, refs=list(c.gpu_refs())))
    assert dec.init_error[0] == "ncclSystemError" and "NCCL_MNNVL_ENABLE=0" in dec.init_error[1]
    assert dec.algorithms("all_reduce") == ()
    ok = d(machine(None, cluster=c, refs=list(c.gpu_refs())), NCCL_MNNVL_ENABLE=0)
    assert ok.init_error is None and not ok.mnnvl


def test_nvl36x2_cross_clique_needs_the_variable():
    c = build_preset("gb200-nvl36x2")
    cliques = {}
    for r in c.gpu_refs():
        cliques.setdefault(c.gpu(r).fabric.clique_id, r)
    assert len(cliques) == 2
    refs = list(cliques.values())
    assert kinds(d(machine(None, cluster=c, refs=refs))) == {"NET"}
    assert kinds(d(machine(None, cluster=c, refs=refs), NCCL_MNNVL_CROSS_CLIQUE=1)) == {"P2P"}


def test_pat_only_with_one_gpu_per_node():
    c = build_preset("gh200-nvl32")
    one_each = [GpuRef(h.name, 0) for h in c.hosts[:4]]
    dec = d(machine(None, cluster=c, refs=one_each), NCCL_MNNVL_ENABLE=0)
    assert "PAT" in dec.algorithms("all_gather") and "PAT" not in dec.algorithms("all_reduce")
    assert "PAT" not in d(machine(None, cluster=c, refs=one_each), NCCL_MNNVL_ENABLE=0,
                          NCCL_PAT_ENABLE=0).algorithms("all_gather")


def test_duplicate_gpu_is_invalid_usage():
    c = build_preset("hgx-h100-8")
    g = GpuRef(c.hosts[0].name, 3)
    dec = d(machine(None, cluster=c, refs=[GpuRef(c.hosts[0].name, 0), g, g]))
    assert dec.init_error[0] == "ncclInvalidUsage"
    assert "Duplicate GPU detected : rank 2 and rank 1" in dec.init_error[1]


def test_nccl_algo_filter():
    m = machine("hgx-h100-8")
    assert d(m, NCCL_ALGO="Ring").algorithms("all_reduce") == ("Ring",)
    assert d(m, NCCL_ALGO="^NVLS").algorithms("all_reduce") == ("Ring", "Tree")


@pytest.mark.parametrize("env, words", [
    ({"NCCL_P2P_LEVEL": "FAR"}, "NCCL_P2P_LEVEL='FAR'"),
    ({"NCCL_NVLS_ENABLE": "yes"}, "NCCL_NVLS_ENABLE='yes'"),
    ({"NCCL_ALGO": "Ring,Fast"}, "unknown Fast"),
    ({"NCCL_IB_HCA": "mlx5"}, "NCCL_IB_HCA: not an NCCL variable commsim models"),
])
def test_bad_environment_is_a_user_error(env, words):
    with pytest.raises(UserError, match=re.escape(words)):
        parse_env(env)


def test_p2p_level_numeric_form():
    assert parse_env({"NCCL_P2P_LEVEL": "0"}).p2p_level == "LOC"
    assert parse_env({"NCCL_P2P_LEVEL": "4"}).p2p_level == "SYS"


def test_env_sensitivity_is_computed():
    s = dict(env_sensitivity(machine("hgx-h100-8")))
    assert "NCCL_NVLS_ENABLE=0" in s and "NVLS" not in s["NCCL_NVLS_ENABLE=0"].split("->")[-1]
    assert "NCCL_P2P_DISABLE=1" in s and "SHM" in s["NCCL_P2P_DISABLE=1"]
    assert "NCCL_MNNVL_ENABLE=0" not in s                            # one host: no effect
    g = dict(env_sensitivity(machine("gb200-nvl72", 8)))
    assert "NCCL_MNNVL_ENABLE=0" in g and "NET" in g["NCCL_MNNVL_ENABLE=0"]


def test_machine_from_view_agrees_on_shipped_shapes():
    from commsim.discovery import discover
    from commsim.group import LocalWorld
    from commsim.sim import SimFabric, spawn_driver
    for preset, n in (("hgx-h100-8", 4), ("gb200-nvl72", 8), ("rtx4090-8", 2)):
        c = build_preset(preset)
        refs = list(c.gpu_refs())[:n]
        fabric = SimFabric(c, seed=0)
        drivers = [spawn_driver(fabric, g) for g in refs]
        views = LocalWorld(len(refs), seed=0).run(lambda grp: discover(drivers[grp.rank], grp))
        got, want = decide(machine_from_view(views[0].value)), decide(machine_from_cluster(c, refs))
        assert got.transport_summary() == want.transport_summary(), preset
        assert got.algorithms("all_reduce") == want.algorithms("all_reduce"), preset


def test_the_cost_model_sees_nccls_nvls_eligibility():
    from commsim import cost_model as model
    from commsim.policy import ModelPolicy
    c = build_preset("hgx-h100-8")
    refs = list(c.gpu_refs())
    on = ModelPolicy().for_truth(c, refs).fabric
    off = ModelPolicy(params={"nccl_env": {"NCCL_NVLS_ENABLE": "0"}}).for_truth(c, refs).fabric
    assert on.nccl_nvls is True and off.nccl_nvls is False
    big = 64 << 20
    assert model.best("nccl", big, on)[0] == "multicast"
    assert model.best("nccl", big, off)[0] == "ring"
    assert model.predict("multicast", "multicast", big, off) < float("inf")   # not NCCL's switch
