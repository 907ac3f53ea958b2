"""Every preset is a valid machine with the attributes its source gives; slicing and faults."""

from __future__ import annotations

import dataclasses

import pytest

from commsim.topology import PRESETS, GpuRef, TopologyError, build_preset, modify
from commsim.topology.model import FabricState, Link
from commsim.topology.render import describe

# name -> (hosts, GPUs per host, sm, all pairs NVLink?, P2P everywhere?, multicast, fabric attr,
#          IMEX on hosts, multi-node domain, arch)
FACTS = {
    "hgx-h100-8": (1, 8, 90, True, True, True, True, False, False, "x86_64"),
    "hgx-h200-8": (1, 8, 90, True, True, True, True, False, False, "x86_64"),
    "dgx-b200-8": (1, 8, 100, True, True, True, True, False, False, "x86_64"),
    "gb200-nvl72": (18, 4, 100, True, True, True, True, True, True, "aarch64"),
    "gb200-nvl36x2": (18, 4, 100, True, True, True, True, True, True, "aarch64"),
    "gh200-nvl32": (16, 2, 90, True, True, True, True, True, True, "aarch64"),
    "l40s-8-pcie": (1, 8, 89, False, False, False, False, False, False, "x86_64"),
    "rtx4090-8": (1, 8, 89, False, False, False, False, False, False, "x86_64"),
    "a100-pcie-bridge-8": (1, 8, 80, False, False, False, False, False, False, "x86_64"),
    "dgx1-v100": (1, 8, 70, False, False, False, False, False, False, "x86_64"),
    # the fidelity rules' machines (docs/fidelity-rules.md rows G)
    "gb300-nvl72": (18, 4, 103, True, True, True, True, True, True, "aarch64"),
    "hgx-b300-8": (1, 8, 103, True, True, True, True, False, False, "x86_64"),
    "h200-nvl-2way-8": (1, 8, 90, False, False, False, False, False, False, "x86_64"),
    "h200-nvl-4way-8": (1, 8, 90, False, False, False, False, False, False, "x86_64"),
    "rtx-pro-6000-4": (1, 4, 120, False, True, False, False, False, False, "x86_64"),
    "rtx5090-2": (1, 2, 120, False, False, False, False, False, False, "x86_64"),
    "rtx3090-2-nvlink": (1, 2, 86, True, True, False, False, False, False, "x86_64"),
    "dgx-spark-2": (2, 1, 121, True, True, False, False, False, False, "aarch64"),
}


def test_every_preset_has_facts_and_a_source():
    assert set(FACTS) == set(PRESETS)
    for name in PRESETS:
        assert build_preset(name).source, name


def test_a_preset_is_named_once_and_its_machine_carries_that_name():
    """The declaration's name is the cluster's: a builder writes no name of its own."""
    for name, preset in PRESETS.items():
        assert preset.name == name and preset.build().name == name
        assert preset.builder("renamed").name == "renamed", name


@pytest.mark.parametrize("name", sorted(FACTS))
def test_preset_attributes(name):
    hosts, per, sm, all_nv, p2p, mc, fab, imex, mnnvl, arch = FACTS[name]
    c = build_preset(name)
    assert len(c.hosts) == hosts and all(len(h.gpus) == per for h in c.hosts)
    refs = list(c.gpu_refs())
    assert all(c.gpu(r).sm == sm for r in refs)
    h = c.hosts[0]
    pairs = [(i, j) for i in range(per) for j in range(per) if i != j]
    assert all(h.link(i, j).is_nvlink for i, j in pairs) == all_nv
    assert all(h.link(i, j).p2p for i, j in pairs) == p2p
    assert all(c.gpu(r).multicast == mc and c.gpu(r).fabric_handle == fab for r in refs)
    assert all(bool(x.imex_channels) == imex and x.arch == arch for x in c.hosts)
    assert any(d.multi_node for d in c.domains) == mnnvl
    describe(c)   # renders


def test_gb200_rack_is_one_domain_of_72_with_one_uuid():
    c = build_preset("gb200-nvl72")
    (d,) = c.domains
    assert len(d.members) == 72 and len(d.hosts) == 18 and any(d.cluster_uuid)
    assert {c.gpu(r).fabric.cluster_uuid for r in c.gpu_refs()} == {d.cluster_uuid}
    assert {c.gpu(r).fabric.state for r in c.gpu_refs()} == {FabricState.COMPLETED}


def test_nvl36x2_has_two_cliques_in_one_domain():
    c = build_preset("gb200-nvl36x2")
    assert len(c.domains) == 1
    assert sorted({c.gpu(r).fabric.clique_id for r in c.gpu_refs()}) == [1, 2]


def test_hgx_reports_completed_fabric_with_zero_uuid():
    c = build_preset("hgx-h100-8")
    g = c.gpu(GpuRef("hgx-h100-0", 0))
    assert g.fabric.state == FabricState.COMPLETED and not any(g.fabric.cluster_uuid)
    assert not c.domains[0].multi_node


def test_bridge_pairs_and_dgx1_mesh():
    a = build_preset("a100-pcie-bridge-8").hosts[0]
    assert a.link(0, 1) == Link("NV", 12) and not a.link(0, 2).is_nvlink and a.link(0, 2).p2p
    assert not a.link(0, 4).p2p            # cross-socket SYS
    v = build_preset("dgx1-v100").hosts[0]
    assert v.link(0, 3).label == "NV2" and v.link(0, 5).label == "SYS" and not v.link(0, 5).p2p
    assert sum(v.link(0, j).is_nvlink for j in range(1, 8)) == 4   # hybrid cube-mesh degree


def test_slicing():
    c = build_preset("gb200-nvl72:2")
    assert [h.name for h in c.hosts] == ["gb200-nvl72-tray00", "gb200-nvl72-tray01"]
    assert len(c.domains[0].members) == 8 and c.domains[0].multi_node
    one = build_preset("gb200-nvl72:1")
    assert not one.domains[0].multi_node and len(one.domains[0].members) == 4
    for bad, msg in (("gb200-nvl72:19", "a slice must keep 1..18"), ("gb200-nvl72:x", "give a host count"),
                     ("gb300", "unknown preset 'gb300'"), ("hgx-h100-8:0", "1..1")):
        with pytest.raises(TopologyError, match=msg.replace(".", r"\.")):
            build_preset(bad)


def test_modifications():
    c = build_preset("gb200-nvl72:2")
    t1 = "gb200-nvl72-tray01"
    assert modify.without_imex(c, t1).host(t1).imex_channels == ()
    ref = GpuRef(t1, 2)
    m = modify.with_fabric_state(c, ref, FabricState.IN_PROGRESS)
    assert m.gpu(ref).fabric.state == FabricState.IN_PROGRESS and c.gpu(ref).fabric.state == FabricState.COMPLETED
    assert not any(modify.with_zero_cluster_uuid(c, ref).gpu(ref).fabric.cluster_uuid)
    p = modify.without_p2p(build_preset("hgx-h100-8"), "hgx-h100-0", 1, 6)
    h = p.hosts[0]
    assert not h.link(1, 6).p2p and not h.link(6, 1).p2p and h.link(1, 5).p2p
    assert not modify.without_multicast(c, ref).gpu(ref).multicast
    with pytest.raises(TopologyError, match="no GPU pair"):
        modify.without_p2p(c, t1, 0, 9)


def test_model_validation():
    with pytest.raises(TopologyError, match="must be symmetric"):
        h = build_preset("hgx-h100-8").hosts[0]
        rows = [list(r) for r in h.links]
        rows[0][1] = Link("PIX")
        dataclasses.replace(h, links=tuple(map(tuple, rows)))
    with pytest.raises(TopologyError, match="unknown link"):
        Link.parse("NVX")
