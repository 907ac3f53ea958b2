"""SGLang 0.5.23, unmodified, under `commsim exec`: its own communication set-up
(tests/hosting/programs/sglang_comm.py): the FlashInfer all-reduce-fusion workspace manager
and its custom all-reduce. SGLang pins torch 2.14.1 and flashinfer-python 0.7.2 and imports
triton at module level (sglang/srt/utils/common.py), so it lives in the layered
.venv-sglang (`make peers` builds it: sglang and the pure packages its communication modules
import, --no-deps; the FlashInfer it finds is .venv's 0.7.2.post1). The tests skip without it.
Each run is `commsim exec` in that venv's interpreter, as a user runs it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hosting_helpers import PROGRAMS, results

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv-sglang" / "bin" / "python"

pytestmark = pytest.mark.skipif(not PYTHON.exists(),
                                reason=f"{PYTHON.parent.parent.name} is absent (make peers builds it)")


def _exec(machine: str, nproc_per_host: int, *args: str, mode: str = "inproc",
          env: dict[str, str] | None = None, extra: tuple[str, ...] = ()
          ) -> tuple[int, dict[int, dict], str]:
    """(exit status, RESULT lines by rank, output) of the program under `commsim exec`."""
    p = subprocess.run([str(PYTHON), "-c", "import sys; from commsim.cli import main; "
                        "sys.exit(main(sys.argv[1:]))", "exec", "--machine", machine,
                        "--nproc-per-host", str(nproc_per_host), "--mode", mode, *extra, "--",
                        "python", str(PROGRAMS / "sglang_comm.py"), *args],
                       capture_output=True, text=True, timeout=600, cwd=ROOT,
                       env={**os.environ, **(env or {})})
    out = p.stdout + p.stderr
    return p.returncode, results(out), out


@pytest.mark.parametrize("machine, per_host, backend, got", [
    ("gb200-nvl72:1", 4, "trtllm", "trtllm"),
    ("gb200-nvl72:1", 4, "auto", "mnnvl"),
    # Two trays of one NVL72: SGLang's own gate (is_one_nvlink_clique over NVML's fabric
    # clique) admits the group, and the mnnvl workspace maps every peer over FABRIC.
    ("gb200-nvl72:2", 2, "mnnvl", "mnnvl"),
])
def test_the_fusion_workspace_manager_returns_the_reference(machine, per_host, backend, got):
    """FlashInferWorkspaceManager.initialize as ensure_workspace_initialized calls it (its
    preflight cuMemCreate probe and BAND vote included), then allreduce_fusion with the
    arguments flashinfer_allreduce_residual_rmsnorm passes, against the reference; cleanup."""
    code, res, out = _exec(machine, per_host, "fusion", backend)
    assert code == 0 and "commsim exec: ok" in out, out
    assert res == {r: {"rank": r, "outcome": f"ok {got}"} for r in range(len(res))}, out
    assert len(res) == per_host * int(machine.partition(":")[2]), out


def test_trtllm_on_an_hgx_box_runs_as_processes_and_says_so():
    """On H100s FlashInfer exchanges POSIX fds over blocking AF_UNIX sockets, which in-process
    ranks cannot serve: the run goes on in procs mode, names why, and passes."""
    code, res, out = _exec("hgx-h100-8", 4, "fusion", "trtllm")
    assert code == 0 and "running again in procs mode" in out, out
    assert "mode procs" in out, out
    assert res == {r: {"rank": r, "outcome": "ok trtllm"} for r in range(4)}, out


def test_custom_all_reduce_goes_to_procs_and_stops_at_its_p2p_check_named(tmp_path):
    """SGLang's CustomAllreduce over sglang-kernel's served `sgl_kernel` ops (the 373 MB
    wheel, not in the Makefile's venv: without it custom_all_reduce_ops cannot import
    sgl_kernel.allreduce and SGLang leaves custom all-reduce off). Asked for inproc, the run
    goes to procs and says why: SGLang keeps its world group in a module global
    (`parallel_state._WORLD`), which in-process ranks would share. In procs mode SGLang's own
    P2P check (custom_all_reduce_utils.py at 0.5.23, run in a subprocess by local rank 0)
    resets the producer's device after the barrier while its consumer may still read the
    buffer through its IPC mapping: when the consumer loses that race (the OS schedules the
    two processes), commsim names the access to freed memory (row L15) and the check never
    answers; when it wins, the all-reduce runs exactly."""
    # Two visible GPUs (the check tries every ordered pair of them), a fresh SGLang cache
    # (the check writes its verdict there and a later run would only read it).
    code, res, out = _exec("hgx-h100-8", 2, "custom", extra=("--visible", "0,1", "--timeout", "60"),
                           env={"SGLANG_CACHE_DIR": str(tmp_path)})
    if any(d["outcome"].startswith("no kernels") for d in res.values()):
        assert {d["outcome"] for d in res.values()} == {
            "no kernels (ModuleNotFoundError: No module named 'sgl_kernel')"}, out
        return
    assert "parallel_state.init_distributed_environment at sglang_comm.py" in out, out
    assert "running again in procs mode" in out and "module globals" in out, out
    if code == 0:
        assert res == {r: {"rank": r, "outcome": "kernels (meta_size 3456); enabled, "
                              "all-reduce exact"} for r in range(2)}, out
    else:
        assert ("access to memory its exporter freed while mapped (undefined behaviour, row "
                "L15)") in out and "custom_all_reduce_utils.py:140 in consumer" in out, out


# SGLang's own switch for its P2P check (custom_all_reduce_utils.can_p2p: "Skipping P2P check
# and trusting the driver's P2P report"). With the check on, its producer process
# cudaDeviceReset()s its buffer while the consumer may still read it through the IPC mapping
# (custom_all_reduce_utils.py producer/consumer at 0.5.23: both read after the same barrier),
# which commsim reports as row L15 when the consumer loses the race (the OS's scheduling of
# the two processes decides it; with eight GPUs visible it lost in every run tried), so these
# runs trust the driver's report.
_TRUST_DRIVER = {"SGLANG_SKIP_P2P_CHECK": "1"}


@pytest.mark.parametrize("per_host", [2, 4, 8])
def test_custom_all_reduce_runs_exact_on_tp_2_to_8(per_host):
    """SGLang's CustomAllreduce over sglang-kernel's served ops on hgx-h100-8: enabled, and
    its custom_all_reduce of every rank's input equals their sum exactly. Its close() frees
    its buffers while the peers still map them (free_shared_buffer: cudaFree only), which
    commsim flags as row L15 without failing the run."""
    code, res, out = _exec("hgx-h100-8", per_host, "custom", mode="procs", env=_TRUST_DRIVER)
    if any(d["outcome"].startswith("no kernels") for d in res.values()):
        pytest.skip("sglang-kernel is not installed in .venv-sglang")
    assert code == 0 and "mode procs" in out, out
    assert res == {r: {"rank": r, "outcome": "kernels (meta_size 3456); enabled, all-reduce exact"}
                   for r in range(per_host)}, out
    assert "row L15" in out and "free_shared_buffer" in out, out


def test_the_seed_shape_disables_custom_all_reduce_at_sglang_s_node_gate():
    """The seed's shape, TP 2 across two GB200 trays with one GPU visible per process: SGLang
    0.5.23 never reaches legacy IPC there. can_use_custom_all_reduce_with_nvlink
    (custom_all_reduce_utils.py:460, `if not all(in_the_same_node_as(group, source_rank=0))`)
    sees two nodes (no shared /dev/shm between trays) and leaves CustomAllreduce disabled."""
    code, res, out = _exec("gb200-nvl72:2", 1, "custom", mode="procs", extra=("--visible", "one"))
    if any(d["outcome"].startswith("no kernels") for d in res.values()):
        pytest.skip("sglang-kernel is not installed in .venv-sglang")
    assert code == 0, out
    assert res == {r: {"rank": r, "outcome": "kernels (meta_size 3456); disabled"} for r in range(2)}, out
    assert "CustomAllreduce is disabled because this process group spans across nodes." in out, out
