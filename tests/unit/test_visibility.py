"""What a process can see (rows W1, W2 of docs/fidelity-rules.md): CUDA_VISIBLE_DEVICES per
process remaps ordinals; NVML still sees the whole host; discovery indexes peers by NVML
index and, where cuDeviceCanAccessPeer cannot be asked, trusts the functional probe."""

from __future__ import annotations

import torch

from commsim.communicator import Communicator
from commsim.discovery import probe
from commsim.driver import LAZY_ENABLE_PEER_ACCESS, check
from commsim.group import LocalWorld
from commsim.policy import Policy
from commsim.sim import SimFabric, spawn_driver
from commsim.topology import build_preset
from commsim.topology.model import GpuRef


def test_one_visible_gpu_per_process_remaps_ordinals_but_not_nvml() -> None:
    fabric = SimFabric(build_preset("hgx-h100-8"))
    d = spawn_driver(fabric, GpuRef("hgx-h100-0", 5), visible=[5])
    assert check("count", d.cudaGetDeviceCount()) == 1 and check("dev", d.cudaGetDevice()) == 0
    assert d.nvmlDeviceGetCount() == (0, 8) and d.nvml_index(0) == 5
    info = probe(d, 0)
    assert info.gpu == 5 and info.p2p[5] is True
    assert info.p2p[0] is None                   # not visible: cuDeviceCanAccessPeer cannot say
    assert info.p2p_probe[0] == ""               # the probe's helper processes can


def test_legacy_ipc_between_single_gpu_processes_still_works() -> None:
    """Row W2: the driver maps a peer that has no ordinal in the importer."""
    fabric = SimFabric(build_preset("hgx-h100-8"))
    a = spawn_driver(fabric, GpuRef("hgx-h100-0", 2), visible=[2])
    b = spawn_driver(fabric, GpuRef("hgx-h100-0", 6), visible=[6])
    p = check("cudaMalloc", a.cudaMalloc(4096))
    h = check("handle", a.cudaIpcGetMemHandle(p))
    q = check("open", b.cudaIpcOpenMemHandle(h, LAZY_ENABLE_PEER_ACCESS))
    check("close", b.cudaIpcCloseMemHandle(q))
    check("free", a.cudaFree(p))


def test_a_tp4_group_of_single_gpu_processes_chooses_ipc_for_the_right_reason() -> None:
    cluster = build_preset("hgx-h100-8")
    fabric = SimFabric(cluster)
    gpus = [GpuRef("hgx-h100-0", i) for i in (1, 3, 5, 7)]
    drivers = [spawn_driver(fabric, g, visible=[g.index]) for g in gpus]
    x = [torch.full((2048,), float(r + 1), dtype=torch.bfloat16) for r in range(4)]

    def rank(group):
        comm = Communicator(group, drivers[group.rank], Policy(order=("ipc", "nccl")))
        y = comm.all_reduce(x[group.rank])
        text = comm.explain()
        comm.close()
        return y, text

    outs = LocalWorld(4, seed=0).run(rank)
    assert all(o.ok for o in outs), [o.error for o in outs]
    y, text = outs[0].value
    assert torch.equal(y, torch.full((2048,), 10.0, dtype=torch.bfloat16))
    assert "ipc: admitted" in text
    assert not any(fabric.exit_process(d.proc.pid) for d in drivers)


# ---- CUDA_VISIBLE_DEVICES lists and device cgroups (sim/visibility.py, row W3) ----------------

from commsim.sim.visibility import cuda_visible, process_view  # noqa: E402
from commsim.topology.preset_parts import gpu_uuid  # noqa: E402

UUIDS = [gpu_uuid("hgx-h100-0", i) for i in range(8)]


def test_visible_list_orders_ordinals_and_stops_at_the_first_invalid_entry() -> None:
    """The programming guide's own examples: 2,1 puts device 2 first; 0,2,-1,1 shows 0 and 2."""
    assert cuda_visible("2,1", UUIDS) == (2, 1)
    assert cuda_visible("0,2,-1,1", UUIDS) == (0, 2)
    assert cuda_visible("7,9,1", UUIDS) == (7,)           # 9: no such device
    assert cuda_visible(None, UUIDS) == tuple(range(8))
    assert cuda_visible("", UUIDS) == ()


def test_visible_list_takes_full_and_abbreviated_uuids_and_refuses_mig_entries() -> None:
    assert cuda_visible(f"{UUIDS[5]},3", UUIDS) == (5, 3)
    assert cuda_visible(f"{UUIDS[6][:12]},0", UUIDS) == (6, 0)       # "GPU-" + 8 hex digits
    assert cuda_visible("GPU-,1", UUIDS) == ()
    assert cuda_visible(f"1,MIG-{UUIDS[2]}/1/0,2", UUIDS) == (1,)   # no MIG instance modelled
    assert cuda_visible("3,3,4", UUIDS) == (3,)                      # a repeat ends the list


def test_a_container_renumbers_what_cuda_and_nvml_see() -> None:
    """Row W3: a container holding /dev/nvidia5 and /dev/nvidia2 sees two GPUs, numbered in host
    order in both CUDA and NVML; its CUDA_VISIBLE_DEVICES indices are the container's."""
    assert process_view(UUIDS, "5,2", None) == (2, 5)
    assert process_view(UUIDS, "5,2", "1") == (5,)
    assert process_view(UUIDS, "5,2", f"{UUIDS[5]},{UUIDS[2]}") == (5, 2)
    assert process_view(UUIDS, "5,2", f"{UUIDS[0]}") == ()           # not in the container
    fabric = SimFabric(build_preset("hgx-h100-8"))
    d = spawn_driver(fabric, GpuRef("hgx-h100-0", 5), container=(2, 5))
    assert check("count", d.cudaGetDeviceCount()) == 2 and check("dev", d.cudaGetDevice()) == 1
    assert d.nvmlDeviceGetCount() == (0, 2) and d.nvml_index(1) == 1 and d.nvml_host_index(1) == 5
    info = probe(d, 0)
    assert info.gpu == 5 and info.p2p[2] is True
    assert info.p2p[0] is None and info.p2p_probe[0] is None   # outside the container: unknowable


def test_two_processes_on_one_gpu_share_its_memory_through_legacy_ipc() -> None:
    """Several processes on one GPU (MPS off, time-sliced): each has its own context, and an
    IPC handle opens in the other process on the same device."""
    fabric = SimFabric(build_preset("hgx-h100-8"))
    a = spawn_driver(fabric, GpuRef("hgx-h100-0", 3), visible=[3])
    b = spawn_driver(fabric, GpuRef("hgx-h100-0", 3), visible=[3])
    p = check("cudaMalloc", a.cudaMalloc(4096))
    q = check("open", b.cudaIpcOpenMemHandle(check("handle", a.cudaIpcGetMemHandle(p)),
                                             LAZY_ENABLE_PEER_ACCESS))
    check("close", b.cudaIpcCloseMemHandle(q))
    check("free", a.cudaFree(p))


def test_placement_lists_that_hide_a_ranks_own_gpu_are_refused_by_field() -> None:
    import pytest
    from commsim.scenario.fields import ScenarioError
    from commsim.scenario.schema import loads
    head = ('[scenario]\nname = "v"\n[topology]\npreset = "hgx-h100-8"\n'
            '[placement]\ngpus = ["hgx-h100-0/0", "hgx-h100-0/3"]\n')
    with pytest.raises(ScenarioError, match=r"\[placement\] visible: rank 1 drives hgx-h100-0/3"):
        loads(head + 'visible = ["", "0,-1,3"]\n')
    with pytest.raises(ScenarioError, match=r"devices: rank 0: '9' is not a GPU of the host"):
        loads(head + 'devices = ["9", ""]\n')
    with pytest.raises(ScenarioError, match=r"visible: lists 1 entries for 2 rank"):
        loads(head + 'visible = ["0"]\n')
    sc = loads(head + 'devices = ["0,1", "2,3"]\nvisible = ["", "1"]\n')
    assert sc.view(1).devices == "2,3" and sc.view(0).visible is None


def test_the_shipped_uuid_list_is_cut_at_its_mig_entry() -> None:
    """scenarios/fidelity/visible-devices-uuid-cut.toml: GPU 6 by an abbreviated UUID, then 2,
    then a MIG entry that ends the list, so GPU 0 after it stays hidden."""
    from pathlib import Path
    from commsim.scenario.runner import spawn_rank
    from commsim.scenario.schema import load
    sc = load(Path(__file__).parents[2] / "scenarios" / "fidelity" / "visible-devices-uuid-cut.toml")
    d = spawn_rank(SimFabric(sc.cluster), sc, 1)
    assert [g.index for g in d.proc.gpus] == [6, 2] and check("dev", d.cudaGetDevice()) == 1
    assert d.nvmlDeviceGetCount() == (0, 8)
