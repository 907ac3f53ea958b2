"""The installed flashinfer-python, unmodified, under `commsim exec` (the `peers` extra of
pyproject.toml pins it; `make peers` installs it). Skips when it is absent."""

from __future__ import annotations

import importlib.util

import pytest

from hosting_helpers import PROGRAMS, hosted

pytestmark = pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None,
                                reason="flashinfer-python is not installed (make peers)")
PROGRAM = PROGRAMS / "flashinfer_comm.py"
NOT_SERVED = ("CompiledExtensionNotServed: commsim hosting: flashinfer JIT module 'trtllm_comm' "
              "is a compiled CUDA extension; served: none; not served: ")


@pytest.mark.parametrize("mode", ["inproc", "procs"])
def test_import_flashinfer_comm_succeeds_in_every_rank(mode):
    v, res, out = hosted(PROGRAM, "hgx-h100-8", "import", mode=mode, nproc_per_host=2)
    assert v.ok, v.format() + out
    assert [res[r]["outcome"] for r in (0, 1)] == ["ok", "ok"], out


@pytest.mark.parametrize("mode", ["inproc", "procs"])
def test_jit_module_load_is_the_named_error_and_starts_no_compiler(mode):
    v, res, out = hosted(PROGRAM, "hgx-h100-8", "jit", mode=mode, nproc_per_host=2)
    assert v.ok, v.format() + out
    for r in (0, 1):
        assert res[r]["outcome"].startswith(NOT_SERVED), res[r]
        assert res[r]["compilers"] == []


def test_trtllm_workspace_on_one_host_stops_at_its_kernels_named():
    """Workspace creation runs its IPC set-up, then trtllm_lamport_initialize needs the
    trtllm_comm kernels: the named error on every rank, no compiler started."""
    v, res, out = hosted(PROGRAM, "hgx-h100-8", "workspace", "trtllm", mode="procs",
                         nproc_per_host=2)
    assert v.ok, v.format() + out
    for r in (0, 1):
        assert res[r]["outcome"].startswith(NOT_SERVED), res[r]
        assert res[r]["compilers"] == []


def test_auto_workspace_on_hgx_completes_in_procs_mode():
    """backend="auto" picks mnnvl on an HGX H100 (multicast, no fabric handles): unicast
    buffers exchanged as POSIX fds over FlashInfer's AF_UNIX sockets, a multicast team whose
    cuMemMap waits for every device to join (row M2), polled in real time across the
    processes; created and destroyed with nothing left behind."""
    v, res, out = hosted(PROGRAM, "hgx-h100-8", "workspace", "auto", "torch", mode="procs",
                         nproc_per_host=2)
    assert v.ok, v.format() + out
    assert [res[r]["outcome"] for r in (0, 1)] == ["ok", "ok"], out
    assert [p.residue for p in v.ranks] == [[], []], v.format()


def test_auto_workspace_in_inproc_mode_runs_as_processes_and_says_so():
    """FlashInfer's fd exchange listens on AF_UNIX sockets: inproc ranks cannot serve it, so
    the run goes to procs (named in the verdict) and completes there."""
    v, res, out = hosted(PROGRAM, "hgx-h100-8", "workspace", "auto", "torch", mode="inproc",
                         nproc_per_host=2)
    assert v.ok, v.format() + out
    assert v.cfg.mode == "procs" and "at fd_exchange.py:" in v.needs_procs, v.format()
    assert [res[r]["outcome"] for r in (0, 1)] == ["ok", "ok"], out


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
