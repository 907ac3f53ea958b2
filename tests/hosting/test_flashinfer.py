"""The installed flashinfer-python, unmodified, under `commsim exec` (the `peers` extra of
pyproject.toml pins it; `make test` installs it). Skips when it is absent."""

from __future__ import annotations

import importlib.util
import os

import pytest

from hosting_helpers import PROGRAMS, hosted

pytestmark = pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None,
                                reason="flashinfer-python is not installed (make test installs the peers extra)")
PROGRAM = PROGRAMS / "flashinfer_comm.py"
UNDECLARED = ("CompiledExtensionNotServed: commsim hosting: flashinfer JIT module "
              "'comm' is a compiled CUDA extension; served: none; not served: every op "
              "(not declared for flashinfer-python ")


@pytest.mark.parametrize("mode", ["inproc", "procs"])
def test_import_flashinfer_comm_succeeds_in_every_rank(mode):
    v, res, out = hosted(PROGRAM, "hgx-h100-8", "import", mode=mode, nproc_per_host=2)
    assert v.ok, v.format() + out
    assert [res[r]["outcome"] for r in (0, 1)] == ["ok", "ok"], out


@pytest.mark.parametrize("mode", ["inproc", "procs"])
def test_jit_module_load_is_the_served_module_or_the_named_error_and_starts_no_compiler(
        mode, tmp_path, monkeypatch):
    """With JIT left on and an `nvcc` on PATH that records each start: loading trtllm_comm
    gives its served module, loading the all-to-all module 'comm' (not declared) the named
    error, and no compiler ran or is left."""
    ran = tmp_path / "nvcc-ran"
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text(f"#!/bin/sh\necho \"$@\" >> {ran}\nexit 1\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("PATH", f"{nvcc.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    v, res, out = hosted(PROGRAM, "hgx-h100-8", "jit", "gen_trtllm_comm_module",
                         "gen_comm_alltoall_module", mode=mode, nproc_per_host=2)
    assert v.ok, v.format() + out
    for r in (0, 1):
        served, refused = res[r]["outcome"].split(" | ")
        assert served == "ok", res[r]
        assert refused.startswith(UNDECLARED), res[r]
        assert res[r]["compilers"] == []
    assert not ran.exists(), ran.read_text()


def test_trtllm_fusion_on_one_gb200_tray_returns_the_reference():
    """backend="trtllm" on one tray: the workspace is created (SymmDeviceMemory over FABRIC
    handles, trtllm_lamport_initialize served), three rounds of kAllReduce rotate through
    the three Lamport buffers and one kARResidualRMSNorm, each equal to the reference. What
    the processes hold after destroy is FlashInfer's own: TRTLLMAllReduceFusionWorkspace.
    destroy() keeps the symmetric memory in trtllm_ar._symm_workspace_refs and never frees
    the control flags it cudaMalloc'ed (through cuda_ipc.py), so every item was created in
    FlashInfer's code."""
    v, res, out = hosted(PROGRAM, "gb200-nvl72:1", "fusion", "trtllm", nproc_per_host=2)
    assert v.ok, v.format() + out
    assert [res[r]["outcome"] for r in (0, 1)] == ["ok trtllm"] * 2, out
    for p in v.ranks:
        assert p.residue and all("mnnvl.py:" in str(i) or "cuda_ipc.py:" in str(i)
                                 for i in p.residue), v.format()


def test_auto_picks_mnnvl_across_two_gb200_trays_and_returns_the_reference():
    v, res, out = hosted(PROGRAM, "gb200-nvl72:2", "fusion", "auto", nproc_per_host=1)
    assert v.ok, v.format() + out
    assert [res[r]["outcome"] for r in (0, 1)] == ["ok mnnvl"] * 2, out


def test_a_lamport_peer_that_never_writes_is_a_diagnosed_hang():
    """Rank 1 creates the workspace but never enters allreduce_fusion: rank 0's one-shot
    kernel spins on rank 1's Lamport slot, and the run is diagnosed as hung there."""
    v, res, out = hosted(PROGRAM, "gb200-nvl72:1", "fusion", "trtllm", "skip1",
                         nproc_per_host=2, timeout=30)
    assert res[1]["outcome"] == "trtllm: skipped allreduce_fusion", out
    assert res[0]["outcome"] == (
        "HangDetected: hang: rank 0 is waiting until 'trtllm_allreduce_fusion one-shot: "
        "Lamport slot of rank 1 (buffer 0)' \u2014 rank 1 finished"), out


def test_direct_ipc_workspace_across_two_trays_completes_with_0_7_2():
    """trtllm_create_ipc_workspace_for_all_reduce_fusion in 0.7.2.post1 allocates through
    torch symmetric memory (FABRIC handles across the NVLink domain), not through the legacy
    cudaIpc* of 0.4.1's create_shared_buffer: across two trays it completes on every rank.
    The seed's 'invalid resource handle' needs 0.4.1 (see the report)."""
    v, res, out = hosted(PROGRAM, "gb200-nvl72:2", "direct", nproc_per_host=1)
    assert v.ok, v.format() + out
    assert [res[r]["outcome"] for r in (0, 1)] == ["ok", "ok"], out


@pytest.mark.parametrize("machine", ["rtx4090-8", "l40s-8-pcie"])
def test_auto_on_pcie_boxes_stops_at_peer_access_named(machine):
    """No multicast, so auto takes trtllm; its SymmDeviceMemory maps every peer's buffer and
    cuMemSetAccess for a GPU without a P2P path is CUDA_ERROR_INVALID_DEVICE: FlashInfer's
    own error on every rank, the call named in the verdict (the fd exchange runs the ranks
    as processes)."""
    v, res, out = hosted(PROGRAM, machine, "fusion", "auto", mode="procs", nproc_per_host=2)
    assert all(res[r]["outcome"].startswith("RuntimeError: CUDA error code=") for r in (0, 1)), out
    # A rank whose peer already failed and released its buffers may meet the knock-on
    # (CUDA_ERROR_INVALID_VALUE importing a handle that is gone) first: the exit-order race.
    assert "cuMemSetAccess" in [(p.first_cuda_error or {}).get("api") for p in v.ranks], \
        v.format()
    assert "RuntimeError: CUDA error code=101(b'CUDA_ERROR_INVALID_DEVICE')" in \
        [res[r]["outcome"] for r in (0, 1)], out


def test_auto_fusion_on_hgx_completes_in_procs_mode():
    """backend="auto" picks mnnvl on an HGX H100 (multicast, no fabric handles): unicast
    buffers exchanged as POSIX fds over FlashInfer's AF_UNIX sockets, a multicast team whose
    cuMemMap waits for every device to join (row M2), polled in real time across the
    processes; allreduce_fusion returns the reference; destroyed with nothing left behind."""
    v, res, out = hosted(PROGRAM, "hgx-h100-8", "fusion", "auto", mode="procs",
                         nproc_per_host=2)
    assert v.ok, v.format() + out
    assert [res[r]["outcome"] for r in (0, 1)] == ["ok mnnvl", "ok mnnvl"], out
    assert [p.residue for p in v.ranks] == [[], []], v.format()


def test_auto_fusion_in_inproc_mode_runs_as_processes_and_says_so():
    """FlashInfer's fd exchange listens on AF_UNIX sockets: inproc ranks cannot serve it, so
    the run goes to procs (named in the verdict) and completes there."""
    v, res, out = hosted(PROGRAM, "hgx-h100-8", "fusion", "auto", mode="inproc",
                         nproc_per_host=2)
    assert v.ok, v.format() + out
    assert v.cfg.mode == "procs" and "at fd_exchange.py:" in v.needs_procs, v.format()
    assert [res[r]["outcome"] for r in (0, 1)] == ["ok mnnvl", "ok mnnvl"], out


def test_auto_workspace_with_flashinfer_s_default_mpi_backend_says_mpi4py_is_missing():
    """Without a comm_backend FlashInfer's mnnvl workspace all-gathers handles over mpi4py's
    COMM_WORLD; this interpreter has no mpi4py, so under torchrun the real run stops with
    FlashInfer's own "mpi4py is not installed" (it was an unnamed IndexError over a served
    world of one)."""
    from commsim.hosting.surfaces.mpi.mpi4py import installed
    if installed():
        pytest.skip("mpi4py is installed here: its singleton world is the real answer")
    v, res, out = hosted(PROGRAM, "hgx-h100-8", "workspace", "auto", mode="procs",
                         nproc_per_host=2)
    assert [res[r]["outcome"] for r in (0, 1)] == ["ImportError: mpi4py is not installed"] * 2, out


@pytest.mark.parametrize("machine, nproc, mode, handle", [
    ("gb200-nvl72:2", 2, "inproc", "CU_MEM_HANDLE_TYPE_FABRIC"),
    ("hgx-h100-8", 2, "procs", "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR")])
def test_symm_device_memory_maps_every_peer_over_the_handle_type_the_machine_gives(
        machine, nproc, mode, handle):
    """FlashInfer's SymmDeviceMemory: FABRIC handles where NVML reports the fabric (across
    two GB200 trays), POSIX fds over its AF_UNIX exchange on an HGX box; every rank reads
    every peer's value through its unicast mapping (tensors from FlashInfer's own DLPack
    capsules, made after it set ctypes.pythonapi.PyCapsule_New.restype for itself), and the
    memory is released."""
    v, res, out = hosted(PROGRAM, machine, "symm", mode=mode, nproc_per_host=nproc)
    n = v.cfg.world_size
    assert v.ok and v.residue == 0, v.format() + out
    assert {r: d["outcome"] for r, d in res.items()} == {
        r: f"{handle} {list(range(1, n + 1))}" for r in range(n)}, out


@pytest.mark.parametrize("how", ["unified", "direct"])
def test_moe_fusion_patterns_on_the_trtllm_workspace_return_the_reference(how):
    """allreduce_fusion with kMoEReductionARResidualRMSNorm and kMoEFinalizeARResidualRMSNorm
    on a trtllm workspace (or the two ops called by name over the direct workspace) reaches
    the served trtllm_moe_allreduce_fusion and trtllm_moe_finalize_allreduce_fusion: every
    rank's residual_out and norm_out equal the reference of every rank's expert outputs."""
    v, res, out = hosted(PROGRAM, "gb200-nvl72:1", "moe", how, nproc_per_host=2)
    assert v.ok, v.format() + out
    assert [res[r]["outcome"] for r in (0, 1)] == ["ok trtllm moe"] * 2, out


def test_the_moe_check_fails_on_a_planted_wrong_result():
    v, res, out = hosted(PROGRAM, "gb200-nvl72:1", "moe", "plant", nproc_per_host=2)
    assert [res[r]["outcome"] for r in (0, 1)] == [
        "kMoEReductionARResidualRMSNorm residual_out differs from the reference",
        "ok trtllm moe"], out


def test_flashinfer_vllm_custom_all_reduce_returns_the_reference():
    """flashinfer.comm.vllm_ar (the vllm_comm JIT module, served) over legacy-IPC buffers on an
    HGX box: every dtype's all-reduce equals the sum of every rank's input, and so do two
    all-reduces captured in a CUDA graph, registered and replayed as FlashInfer's test does."""
    v, res, out = hosted(PROGRAM, "hgx-h100-8", "vllm_ar", "graph", nproc_per_host=4)
    assert v.ok and v.residue == 0, v.format() + out
    assert {r: d["outcome"] for r, d in res.items()} == {r: "ok vllm_ar" for r in range(4)}, out


def test_the_vllm_ar_check_fails_on_a_planted_wrong_result():
    v, res, out = hosted(PROGRAM, "hgx-h100-8", "vllm_ar", "plant", nproc_per_host=2)
    assert [res[r]["outcome"] for r in (0, 1)] == [
        "vllm_all_reduce torch.float32 differs from the reference", "ok vllm_ar"], out


PEER_REFUSED = "RuntimeError: CUDART error: peer access is not supported between these two devices"


@pytest.mark.parametrize("machine, visible, profile", [
    ("rtx4090-8", "all", "pcieswitch-pairs (rank 0 shares a PCIe switch with group member GPU-"),
    ("l40s-8-pcie", "all", "pcieswitch-pairs (rank 0 shares a PCIe switch with group member GPU-"),
    ("rtx4090-8", "0,2", "rootcplx-noswitch (no switch-local pair observed)")])
def test_pcie_ipc_probe_takes_the_branch_of_the_machine_s_topology(machine, visible, profile):
    """FlashInfer's PCIe IPC probe asks NVML for the common ancestor of the group's GPUs (by
    the UUIDs torch reports): GPUs 0 and 1 of these boxes share a PCIe switch (PIX), GPUs 0
    and 2 only the CPU (NODE). The workspace then gets its size from the served
    pcie_ipc_comm and stops in create_shared_buffer, where the machine refuses the legacy
    IPC mapping between GPUs without P2P: FlashInfer's own error on every rank."""
    v, res, out = hosted(PROGRAM, machine, "pcie", nproc_per_host=2, visible=visible)
    for r in (0, 1):
        got, _, made = res[r]["outcome"].partition(" | ")
        assert got.startswith(profile), res[r]
        assert made == PEER_REFUSED, res[r]


@pytest.mark.parametrize("machine, nproc, handle", [
    ("gb200-nvl72:2", 1, "FABRIC"), ("hgx-h100-8", 2, "POSIX_FILE_DESCRIPTOR")])
def test_mnnvl_memory_maps_every_rank_s_segment(machine, nproc, handle):
    """FlashInfer's MnnvlMemory: FABRIC handles across two GB200 trays, POSIX fds over its
    AF_UNIX exchange on an HGX box (no fabric in NVML); every rank reads every rank's value
    through its mapping, and closing the memory leaves nothing behind. Asked for inproc, the
    run goes to procs and says why: MnnvlMemory keeps its communicator and address
    reservation in class attributes, one value for every in-process rank."""
    v, res, out = hosted(PROGRAM, machine, "mnnvl_memory", mode="inproc", nproc_per_host=nproc)
    assert v.ok and v.residue == 0, v.format() + out
    assert v.cfg.mode == "procs" and v.needs_procs.endswith(
        "MnnvlMemory.open_mnnvl_memory at mnnvl.py:226 in __init__"), v.format()
    assert "class attributes" in v.format()
    assert {r: d["outcome"] for r, d in res.items()} == {r: f"{handle} ok" for r in range(2)}, out


def test_the_mnnvl_memory_check_fails_on_a_planted_wrong_value():
    v, res, out = hosted(PROGRAM, "hgx-h100-8", "mnnvl_memory", "plant", mode="procs",
                         nproc_per_host=2)
    assert [res[r]["outcome"] for r in (0, 1)] == [
        "POSIX_FILE_DESCRIPTOR read [2, 2], not [1, 2]", "POSIX_FILE_DESCRIPTOR ok"], out


def test_auto_takes_the_mnnvl_two_shot_past_its_threshold_and_returns_the_reference():
    """2.25 MiB across two GB200 trays: FlashInfer's select_strategy answers TWOSHOT and the
    served two-shot kernel's result equals the reference."""
    v, res, out = hosted(PROGRAM, "gb200-nvl72:2", "large", nproc_per_host=1)
    assert v.ok, v.format() + out
    assert [res[r]["outcome"] for r in (0, 1)] == ["mnnvl TWOSHOT ok"] * 2, out
