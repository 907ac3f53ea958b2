"""The module surfaces under `commsim exec`, both modes: cuda.bindings (runtime and driver),
pynvml, torch.cuda and torch.distributed, as one unmodified program (programs/surfaces.py)
sees them on a 2-tray GB200 slice, an HGX host and a PCIe box without P2P. Two ranks per run
(one per tray on the slice). Each machine's answers are what its hardware would say, and the
in-process and real-process runs give every rank the same answers."""

import pynvml
import pytest

from hosting_helpers import PROGRAMS, hosted

PROG = PROGRAMS / "surfaces.py"
MiB = 1 << 20


def both_modes(machine: str, nproc_per_host: int, first_error: str) -> dict[int, dict]:
    """Each rank's RESULT, after checking the two modes agree on all of it and that each
    rank's first CUDA error (the verdict's) is the first call that failed on hardware: a
    query answered successfully must not count as one."""
    seen = {}
    for mode in ("inproc", "procs"):
        v, res, out = hosted(PROG, machine, mode=mode, nproc_per_host=nproc_per_host)
        assert v.ok and v.residue == 0, v.format()
        assert sorted(res) == [0, 1], out
        assert [p.first_cuda_error["api"] for p in v.ranks] == [first_error] * 2, v.format()
        seen[mode] = res
    for r in (0, 1):
        assert seen["inproc"][r] == seen["procs"][r], f"rank {r}: the modes disagree"
    return seen["inproc"]


def check_common(res: dict[int, dict], gpus: int, cc: list[int]) -> None:
    """What holds on every machine: the surfaces agree with one another about the device."""
    ids = [[res[r]["hostname"], res[r]["nvml"]["uuid"]] for r in (0, 1)]
    for r, d in res.items():
        assert d["world"] == 2 and d["everyone"] == ids          # all_gather_object
        assert d["rt"]["count"] == d["nvml"]["count"] == d["torch"]["count"] == gpus
        assert d["rt"]["cc"] == d["torch"]["cc"] == cc and d["torch"]["available"]
        assert d["cu"]["ctx_device"] == d["dev"] and d["cu"]["ctx_is_primary"]
        # the same device by PCI address: NVML spells the domain in 8 digits, upper case
        assert d["nvml"]["bus_id"][4:].lower() == d["rt"]["bus_id"]
        # cudaMalloc'd 1 MiB is held; the IPC mappings and the cuMem allocation are gone
        assert d["torch"]["mem_used"] == MiB
        assert bool(d["rt"]["can_access_peer"]) is d["torch"]["can_access_peer"]
    assert res[0]["nvml"]["uuid"] != res[1]["nvml"]["uuid"]


def check_nvlink_peer(d: dict) -> None:
    """The rank's GPU reaches its peer over NVLink: link up, P2P status OK, peer access."""
    assert d["torch"]["can_access_peer"] and d["nvml"]["nvlink0"] == pynvml.NVML_FEATURE_ENABLED
    assert d["nvml"]["p2p"] == {"nvlink": pynvml.NVML_P2P_STATUS_OK,
                                "write": pynvml.NVML_P2P_STATUS_OK}


def test_two_gb200_trays():
    res = both_modes("gb200-nvl72:2", 1, "cudaIpcOpenMemHandle")
    check_common(res, gpus=4, cc=[10, 0])
    assert [res[r]["hostname"] for r in (0, 1)] == ["gb200-nvl72-tray00", "gb200-nvl72-tray01"]
    fabric = [res[r]["nvml"]["fabric"] for r in (0, 1)]
    # one NVLink domain: the same cluster UUID and clique on both trays, registration done
    assert fabric[0] == fabric[1] and fabric[0]["cluster"] != "00" * 16
    assert fabric[0]["state"] == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    for r, d in res.items():
        # legacy IPC does not cross trays (the first seed); FABRIC handles do
        assert d["rt"]["ipc_open"] == {str(1 - r): "cudaErrorInvalidResourceHandle"}
        assert d["cu"]["fabric_supported"] and d["cu"]["create"] == "CUDA_SUCCESS"
        assert d["cu"]["export"] == "CUmemFabricHandle"
        assert d["cu"]["fabric_imports"] == ["CUDA_SUCCESS"]
        check_nvlink_peer(d)        # the peer GPU of the same tray


def test_hgx_host():
    res = both_modes("hgx-h100-8", 2, "cuMemCreate")
    check_common(res, gpus=8, cc=[9, 0])
    assert res[0]["hostname"] == res[1]["hostname"]
    for r, d in res.items():
        assert d["rt"]["ipc_open"] == {str(1 - r): "cudaSuccess"}
        check_nvlink_peer(d)
        # no multi-node NVLink domain: a zero cluster UUID; a FABRIC allocation without an
        # IMEX channel is not permitted (row V3)
        assert d["nvml"]["fabric"]["cluster"] == "00" * 16
        assert d["cu"]["fabric_supported"] and d["cu"]["create"] == "CUDA_ERROR_NOT_PERMITTED"
        assert "export" not in d["cu"] and d["cu"]["fabric_imports"] == []


def test_pcie_box_without_p2p():
    res = both_modes("l40s-8-pcie", 2, "cudaIpcOpenMemHandle")
    check_common(res, gpus=8, cc=[8, 9])
    assert res[0]["hostname"] == res[1]["hostname"]
    for r, d in res.items():
        assert d["rt"]["ipc_open"] == {str(1 - r): "cudaErrorPeerAccessUnsupported"}
        assert d["rt"]["can_access_peer"] == 0 and d["torch"]["can_access_peer"] is False
        assert d["nvml"]["nvlink0"] == "not supported"
        assert d["nvml"]["p2p"] == {"nvlink": pynvml.NVML_P2P_STATUS_NOT_SUPPORTED,
                                    "write": pynvml.NVML_P2P_STATUS_NOT_SUPPORTED}
        assert d["nvml"]["fabric"]["state"] == pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
        # no FABRIC handles: the allocation is exported as a real POSIX fd
        assert not d["cu"]["fabric_supported"] and d["cu"]["posix_fd_supported"]
        assert d["cu"]["create"] == "CUDA_SUCCESS" and d["cu"]["export"] == "int"
        assert d["cu"]["fd_is_real"]
