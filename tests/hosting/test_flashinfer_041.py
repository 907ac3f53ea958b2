"""flashinfer-python 0.4.1 (the seed's release), unmodified, under `commsim exec`: its trtllm
fusion workspace (`trtllm_create_ipc_workspace_for_all_reduce_fusion`, buffers from
`cuda_ipc.create_shared_buffer` over legacy CUDA IPC). 0.4.1 pins apache-tvm-ffi 0.1.0b15
where 0.7.x needs 0.1.11+, so it lives in a venv of its own, `.venv-fi041` (`make peers`
builds it over .venv); the test runs commsim with that venv's interpreter and skips without
it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hosting_helpers import PROGRAMS, results

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv-fi041" / "bin" / "python"

pytestmark = pytest.mark.skipif(not PYTHON.exists(),
                                reason=f"{PYTHON.parent.parent.name} is absent (make peers builds it)")


def _exec(machine: str, nproc_per_host: int, *step: str) -> tuple[int, dict[int, dict], str]:
    """`commsim exec` of the FlashInfer program's `step` (default `direct`) in the 0.4.1 venv:
    (exit status, RESULT lines by rank, output)."""
    p = subprocess.run([str(PYTHON), "-c", "import sys; from commsim.cli import main; "
                        "sys.exit(main(sys.argv[1:]))", "exec", "--machine", machine,
                        "--nproc-per-host", str(nproc_per_host), "--mode", "inproc", "--",
                        "python", str(PROGRAMS / "flashinfer_comm.py"), *(step or ("direct",))],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    out = p.stdout + p.stderr
    return p.returncode, results(out), out


def test_the_seed_fails_on_every_rank_across_two_trays():
    """Legacy IPC handles do not cross trays: every rank's cudaIpcOpenMemHandle of a peer on
    the other tray fails, and FlashInfer's cuda_ipc raises its CUDART error."""
    code, res, out = _exec("gb200-nvl72:2", 2)
    assert sorted(res) == [0, 1, 2, 3], out
    assert {d["version"] for d in res.values()} == {"0.4.1"}, out
    assert {d["outcome"] for d in res.values()} == {
        "RuntimeError: CUDART error: invalid resource handle"}, out


def test_the_workspace_on_one_tray_is_created_and_its_destroy_leaks():
    """On one tray the handles open and the Lamport buffers are initialised by the served
    `trtllm_lamport_initialize` of 0.4.1's trtllm_comm. 0.4.1's destroy (`free_shared_buffer`)
    frees each rank's own three buffers while its peers still have them open (it never calls
    cudaIpcCloseMemHandle) and never frees the 20-byte flag word
    (`trtllm_create_ipc_workspace_for_all_reduce_fusion` allocates it with cudaMalloc(5 * 4)):
    flagged per buffer, residue per rank."""
    code, res, out = _exec("gb200-nvl72:1", 4)
    assert code == 0, out
    assert {r: d["outcome"] for r, d in res.items()} == {r: "ok" for r in range(4)}, out
    assert all(d["compilers"] == [] for d in res.values()), out
    flagged = [ln for ln in out.splitlines() if "still had it open (row L15" in ln]
    assert len(flagged) == 4 * 3, out
    assert sorted(ln.split(" on ")[1].split(" ")[0] for ln in out.splitlines()
                  if "allocation: cudaMalloc(20) on " in ln) == [
        f"gb200-nvl72-tray00/gpu{g}" for g in range(4)], out


def test_allreduce_fusion_on_one_tray_returns_the_reference():
    """0.4.1's 21-argument trtllm_allreduce_fusion (no block_quant_group_size, weight_bias)
    over its legacy-IPC workspace: three one-shot kAllReduce rounds (every Lamport buffer),
    a two-shot one and a kARResidualRMSNorm, each equal to the reference on every rank."""
    code, res, out = _exec("gb200-nvl72:1", 4, "direct-fusion")
    assert code == 0, out
    assert {r: (d["version"], d["outcome"]) for r, d in res.items()} == {
        r: ("0.4.1", "ok trtllm") for r in range(4)}, out


def test_the_fusion_check_fails_on_a_planted_wrong_result():
    """The same run with one wrong element planted in rank 0's first result: that rank's
    check names the round, the others still pass."""
    code, res, out = _exec("gb200-nvl72:1", 4, "direct-fusion", "plant")
    assert {r: d["outcome"] for r, d in res.items()} == {
        0: "trtllm: kAllReduce round 0 differs from the reference",
        **{r: "ok trtllm" for r in (1, 2, 3)}}, out



def test_moe_fusions_on_one_tray_return_the_reference():
    """0.4.1's 20-argument trtllm_moe_allreduce_fusion and 13-argument
    trtllm_moe_finalize_allreduce_fusion over its legacy-IPC workspace, called by name (0.4.1
    has no unified allreduce_fusion): every rank's residual_out and norm_out equal the
    reference."""
    code, res, out = _exec("gb200-nvl72:1", 4, "moe", "direct")
    assert code == 0, out
    assert {r: (d["version"], d["outcome"]) for r, d in res.items()} == {
        r: ("0.4.1", "ok trtllm moe") for r in range(4)}, out
