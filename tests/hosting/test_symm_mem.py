"""PyTorch symmetric memory in hosted ranks: a vLLM-style program (symm_mem.empty, rendezvous
over a group, get_buffer, one_shot / two_shot / multimem all-reduce) under `commsim exec`,
numbers checked on every rank; on machines that cannot, the failure a real run shows; and
PyTorch's refusals of misuse."""

import pytest

import sim_ranks as S
from hosting_helpers import PROGRAMS, hosted

PROG = PROGRAMS / "symm_mem_allreduce.py"


def _ok(res: dict, n: int, multicast: bool) -> None:
    assert sorted(res) == list(range(n))
    for r, got in res.items():
        assert got["world"] == n and got["me"] == r
        assert got["own_ptr_ok"] and got["distinct"]
        assert got["nvshmem"] is False
        assert got["buffer_size"] == 1024 * 2 and got["pad_size"] > 0
        assert got["peer_value"] == [float((r + 1) % n)] * 4     # the right neighbour's bytes
        assert got["one_shot"] is True and got["two_shot"] is True
        assert got["one_shot_device"].startswith("cuda:")
        assert got["multicast"] is multicast
        if multicast:
            assert got["multimem"] is True
        else:
            # CUDASymmetricMemoryOps.cu: multimem needs a multicast object.
            assert got["multimem"] == "multimem_all_reduce_: multicast support is required."


@pytest.mark.parametrize("machine, per_host, mode, n", [
    ("hgx-h100-8", 4, "inproc", 4),          # POSIX fds over PyTorch's IpcChannel, NVSwitch multicast
    ("gb200-nvl72:2", 2, "inproc", 4),       # FABRIC handles across two trays
    ("gb200-nvl72:2", 1, "procs", 2),        # real processes, FABRIC handles
    ("hgx-h100-8", 2, "procs", 2),           # real processes, POSIX fds around the ring
])
def test_vllm_style_allreduce_moves_the_bytes(machine, per_host, mode, n):
    v, res, out = hosted(PROG, machine, mode=mode, nproc_per_host=per_host, timeout=60)
    assert v.ok, v.format() + out
    _ok(res, n, multicast=True)


def test_without_multicast_the_pointer_is_zero():
    """PCIe P2P without NVSwitch: rendezvous works, multicast_ptr is 0 (what vLLM checks)."""
    v, res, out = hosted(PROG, "rtx-pro-6000-4", mode="inproc", nproc_per_host=2)
    assert v.ok, v.format() + out
    _ok(res, 2, multicast=False)


def test_no_p2p_fails_in_rendezvous_as_pytorch_does():
    """No P2P (RTX 4090): mapping a peer's buffer is refused, cuMemSetAccess ->
    CUDA_ERROR_INVALID_DEVICE, which PyTorch raises as "CUDA driver error: invalid device
    ordinal" (pytorch/pytorch#174030)."""
    v, res, out = hosted(PROG, "rtx4090-8", "--expect-fail", mode="inproc", nproc_per_host=2)
    assert sorted(res) == [0, 1], out
    assert res[0]["error"].startswith("CUDA driver error: invalid device ordinal"), res
    assert all(res[r]["error"].startswith("CUDA driver error: ") for r in res)
    assert "world" not in res[0]                     # nothing ran after the rendezvous


def test_two_hosts_without_mnnvl_fail_sending_fds():
    """Two hosts without an NVLink domain: no fabric access, so POSIX fds, whose socket does
    not exist on the other host: IpcChannel's "Failed to send fd" on every rank."""
    v, res, out = hosted(PROG, "dgx-spark-2", "--expect-fail", mode="inproc", nproc_per_host=1)
    assert sorted(res) == [0, 1], out
    for r in res:
        assert res[r]["error"].startswith("Failed to send fd: No such file or directory"), res


def test_unhandled_rendezvous_failure_fails_the_run():
    v, res, out = hosted(PROG, "rtx4090-8", mode="inproc", nproc_per_host=2)
    assert not v.ok
    assert "RuntimeError: CUDA driver error: invalid device ordinal" in v.format()


def test_misuse_gets_pytorchs_refusals():
    v, res, out = hosted(PROG, "hgx-h100-8", "--misuse", mode="inproc", nproc_per_host=2)
    assert v.ok, v.format() + out
    for r in (0, 1):
        m = res[r]["misuse"]
        assert m["plain_rendezvous"] is True           # a warning and no handle
        assert m["bad_group"] == "TypeError: rendezvous: unsupported group type: <class 'int'>"
        assert m["plain_op"] == ("RuntimeError: one_shot_all_reduce: input must be allocated "
                                 "with empty_strided_p2p().")
        assert m["max_op"] == "RuntimeError: two_shot_all_reduce: only sum is supported for now."
        assert m["half_op"] == "NotImplementedError: \"one_shot_all_reduce\" not implemented for 'Half'"
        assert m["odd_size"] == ("RuntimeError: one_shot_all_reduce<BFloat16>: input size must be "
                                 "at least 4-byte aligned.")
        assert m["cpu_empty"] == "RuntimeError: SymmetricMemory does not support device type cpu"
        assert m["too_big"].startswith("RuntimeError: SymmetricMemory::get_buffer: the requested size")
        assert m["is_symm"] == [True, False]
        assert m["not_simulated"] == ("NotImplementedError: commsim hosting: "
                                      "torch.distributed._symmetric_memory.get_mem_pool is not simulated")


def test_two_hosts_without_mnnvl_fail_sending_fds_in_procs_mode_too():
    """Real rank processes: the same IpcChannel refusal as in-process, on every rank (each
    rank's successor is on the other host)."""
    v, res, out = hosted(PROG, "dgx-spark-2", "--expect-fail", mode="procs", nproc_per_host=1,
                         timeout=60)
    assert sorted(res) == [0, 1], out
    for r in res:
        assert res[r]["error"].startswith("Failed to send fd: No such file or directory"), res


def test_outside_a_rank_the_module_is_torchs():
    import torch
    import torch.distributed._symmetric_memory as symm_mem
    from commsim.hosting.surfaces.torch_distributed import symm_mem as torch_symm_mem
    torch_symm_mem.install()
    try:
        with pytest.raises(RuntimeError, match="SymmetricMemory does not support device type cpu"):
            symm_mem.empty(4, device="cpu")                   # the CPU build's own answer
        if torch.version.cuda is None:                         # a CUDA wheel ships NVSHMEM
            assert symm_mem.is_nvshmem_available() is False
        assert symm_mem.is_symm_mem_tensor(torch.zeros(2)) is False
    finally:
        torch_symm_mem.uninstall()
