"""Machine description -> scenario text, on made-up probes (no GPU): the file loads, the
cluster answers as the probed machine did, and the simulator's predictions follow."""

from __future__ import annotations

import dataclasses

import pytest

from commsim.driver import GpuFabricInfo
from commsim.scenario import schema
from commsim.topology.model import FabricState, GpuRef
from cuda.bindings import driver as cu
from commsim.devicecheck import predict
from commsim.probe.machine import GpuProbe, MachineProbe
from commsim.probe.scenario import host_prefix, scenario_text

R = cu.CUresult
ZERO = bytes(16)
UUID = bytes(range(1, 17))


def gpu(i: int, name: str, cc=(9, 0), fabric=True, multicast=True, state=3, uuid=ZERO,
        status=0, **kw) -> GpuProbe:
    info = None if state is None else GpuFabricInfo(uuid, status, 0, state)
    return GpuProbe(i, name, f"GPU-{i}", cc, 80 << 30, fabric_handle=fabric, multicast=multicast,
                    fabric=info, fabric_rc=0 if info else 3, **kw)


def machine(gpus, cell="NV18", p2p=True, host="box", imex=(), links=None) -> MachineProbe:
    n = len(gpus)
    links = links or tuple(tuple("X" if i == j else cell for j in range(n)) for i in range(n))
    return MachineProbe(host, tuple(gpus), links,
                        tuple(tuple(i == j or p2p for j in range(n)) for i in range(n)),
                        imex_channels=imex, driver_version="580.82.07", cuda_driver_version=13000)


def load(probe: MachineProbe):
    text = scenario_text(probe)
    return text, schema.loads(text, "probe.toml")


def test_single_h200_is_one_nvswitch_node_without_imex():
    text, s = load(machine([gpu(0, "NVIDIA H200")], host="h200.example.com"))
    host = s.cluster.hosts[0]
    assert host.name == "h200.example.com-0" and len(host.gpus) == 1
    g = host.gpus[0]
    assert (g.fabric_handle, g.multicast, g.fabric.state) == (True, True, FabricState.COMPLETED)
    assert host.imex_channels == () and not s.faults
    assert 'domain = "node"' in text and "# GPU 0: NVIDIA H200 sm_90" in text
    assert int(predict.fabric_create(text)) == int(R.CUDA_ERROR_NOT_PERMITTED)   # row V3: no IMEX
    assert int(predict.multicast_create(text)) == 0


def test_hgx_h100_board_matrix_and_p2p():
    probe = machine([gpu(i, "NVIDIA H100 80GB HBM3") for i in range(8)])
    _, s = load(probe)
    host = s.cluster.hosts[0]
    assert all(host.link(i, j).label == "NV18" and host.link(i, j).p2p
               for i in range(8) for j in range(8) if i != j)
    assert len(s.cluster.domains) == 1 and not s.cluster.domains[0].multi_node


def test_geforce_pair_without_p2p_keeps_the_measured_answer():
    gs = [gpu(i, "NVIDIA GeForce RTX 4090", cc=(8, 9), fabric=False, multicast=False, state=None)
          for i in range(2)]
    text, s = load(machine(gs, cell="PHB", p2p=False))
    host = s.cluster.hosts[0]
    assert host.link(0, 1).label == "PHB" and not host.link(0, 1).p2p
    assert 'domain = "none"' in text and not s.cluster.domains
    assert int(predict.fabric_create(text)) != 0


def test_gb200_tray_without_imex_gets_the_fault():
    gs = [gpu(i, "NVIDIA GB200", cc=(10, 0), uuid=UUID) for i in range(4)]
    text, s = load(machine(gs, host="tray07"))
    assert 'domain = "rack"' in text
    assert [f.kind for f in s.faults] == ["imex_missing"]
    assert s.cluster.hosts[0].imex_channels == ()
    assert int(predict.fabric_create(text)) == int(R.CUDA_ERROR_NOT_PERMITTED)
    text, s = load(machine(gs, host="tray07", imex=(0,)))
    assert not s.faults and s.cluster.hosts[0].imex_channels == (0,)
    assert int(predict.fabric_create(text)) == 0             # row V2: fabric works on the tray


def test_fabric_state_status_and_links_become_faults():
    gs = [gpu(0, "NVIDIA H100 80GB HBM3", state=2), gpu(1, "NVIDIA H100 80GB HBM3", status=7),
          gpu(2, "NVIDIA H100 80GB HBM3", multicast=False),
          gpu(3, "NVIDIA H100 80GB HBM3", nvlinks_up=False)]
    text, s = load(machine(gs))
    kinds = {(f.kind, f.gpu.index if f.gpu else None) for f in s.faults}
    assert kinds == {("fabric_state", 0), ("fabric_status_error", 1), ("no_multicast", 2),
                     ("nvlinks_down", 3)}
    c, h = s.cluster, s.cluster.hosts[0].name
    assert c.gpu(GpuRef(h, 0)).fabric.state == FabricState.IN_PROGRESS
    assert c.gpu(GpuRef(h, 1)).fabric.status != 0
    assert not c.gpu(GpuRef(h, 2)).multicast and not c.gpu(GpuRef(h, 3)).nvlinks_up


def test_imex_on_an_nvswitch_node_is_modelled_as_a_rack_member():
    text, s = load(machine([gpu(0, "NVIDIA H200")], imex=(0,)))
    assert 'domain = "rack"' in text
    assert [f.kind for f in s.faults] == ["zero_cluster_uuid"]
    assert int(predict.fabric_create(text)) == 0


def test_what_cannot_be_expressed_is_written_down():
    gs = [gpu(0, "NVIDIA H200", fabric=False), gpu(1, "Some Future GPU", cc=(12, 0))]
    text, s = load(machine(gs))
    assert "# Not expressible in the scenario format, or not readable:" in text
    assert "GPUs differ" in text
    assert "HANDLE_TYPE_FABRIC_SUPPORTED is 0 here, 1 in the scenario" in text
    gs = [gpu(0, "Some Future GPU", cc=(12, 0))]
    text, s = load(machine(gs))
    assert "is not one the simulator knows" in text and "gpu_model" not in text


def test_mixed_links_and_unknown_fabric():
    links = (("X", "NV4", "SYS"), ("NV4", "X", "SYS"), ("SYS", "SYS", "X"))
    gs = [gpu(i, "NVIDIA A100 80GB PCIe", cc=(8, 0), fabric=False, multicast=False, state=None)
          for i in range(3)]
    gs[2] = dataclasses.replace(gs[2], fabric_rc=999)            # NVML could not say
    text, s = load(machine(gs, links=links))
    host = s.cluster.hosts[0]
    assert host.link(0, 1).label == "NV4" and host.link(0, 2).label == "SYS"
    assert "NVML fabric info unknown (return code 999)" in text


@pytest.mark.parametrize("name, want", [("node-1.cluster", "node-1.cluster"), ("a b/c", "a-b-c"),
                                        ("_x_", "x"), ("!!!", "host")])
def test_host_prefix_is_a_valid_hostname(name, want):
    assert host_prefix(name) == want


def test_empty_probe_is_refused():
    with pytest.raises(ValueError):
        scenario_text(MachineProbe("h", (), (), ()))
