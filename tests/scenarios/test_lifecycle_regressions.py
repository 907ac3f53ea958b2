"""The lifecycle regressions (docs/lifecycle-rules.md): each fails under its shortcut policy as filed (error, step, rank,
text) and passes under the default policy with the backend it names and no residue. The
ring fd exchange is in test_rendezvous_hangs.py (its hang diagnosis is checked there)."""

from __future__ import annotations

from pathlib import Path

import pytest

from commsim.scenario.runner import run_scenario
from commsim.scenario.schema import load

REG = Path(__file__).resolve().parents[2] / "scenarios" / "regressions"

# file -> (error, step, failing rank or None, text in that error, leak expected, default backend)
LIFECYCLE = {
    "flashinfer-2006-lazy-workspace.toml": (
        "cudaErrorInvalidResourceHandle", "capture", 0, "cudaIpcOpenMemHandle failed", False, "fabric"),
    "vllm-42609-expandable-segments.toml": (
        "cudaErrorInvalidValue", "register", 0, "cudaIpcGetMemHandle failed", False, "ipc"),
    "trtllm-mapping-two-trays-one-node.toml": (
        "cudaErrorInvalidResourceHandle", "init", 0, "of rank 4 on host gb200-nvl72-tray01", False, "fabric"),
    "local-rank-workspace-index.toml": (
        "cudaErrorInvalidValue", "op", 4, "cudaMemcpy failed", False, "ipc"),
    "device-ordinal-from-rank.toml": (
        "cudaErrorInvalidDevice", "discover", 4, "cudaSetDevice failed", False, "fabric"),
    "trtllm-forced-oneshot-workspace.toml": (
        "WorkspaceTooSmall", "op", 0, "needs 33554432 B of Lamport workspace; the workspace holds "
        "16777216 B", False, "ipc"),
    "nccl-mnnvl-imex-missing.toml": (
        "ncclSystemError", "init", 0, "a FABRIC handle could not be created or imported on rank 4 "
        "(host gb200-nvl72-tray01)", False, "nccl"),
    "lazy-setup-inside-capture.toml": (
        "cudaErrorStreamCaptureInvalidated", "capture", 0, "cudaStreamEndCapture failed", False, "ipc"),
    "silent-leaky-fallback.toml": (
        "SilentFallback", "init", 0, "silently fell back to multicast (ipc set-up failed", True, "multicast"),
}


@pytest.mark.parametrize("name", sorted(LIFECYCLE))
def test_fails_under_shortcut_policy(name):
    error, step, rank, text, leak, _ = LIFECYCLE[name]
    res = run_scenario(load(REG / name))
    assert res.expects_failure and res.ok, res.failures
    hits = [e for e in res.errors if e.name == error and e.step == step and (rank is None or e.rank == rank)]
    assert hits and text in hits[0].message, [(e.rank, e.step, e.name, e.message[:160]) for e in res.errors]
    assert bool(res.leaks) == leak, res.leaks[:3]


@pytest.mark.parametrize("name", sorted(LIFECYCLE))
def test_passes_under_default_policy(name):
    *_, backend = LIFECYCLE[name]
    res = run_scenario(load(REG / name), policy="default")
    assert res.ok and not res.errors and not res.leaks and not res.flags, res.failures
    assert set(res.backends.values()) == {backend}
