"""A rank that fails keeps what it found before failing: a wrong result checked in one group
still counts when the same rank's next group then fails (runner.run_rank / collect), in thread
mode and in process mode alike."""

from __future__ import annotations

import textwrap
from pathlib import Path

from commsim.procs.launcher import run_scenario_procs
from commsim.scenario.runner import run_scenario
from commsim.scenario.schema import load

# IPC admitted on cuDeviceCanAccessPeer alone (no functional probe) over a P2P-patched pair
# whose peer writes land corrupted (row P3): group a's all-reduce returns wrong data. Group b
# then fails its set-up on every rank (each one's second legacy IPC open is refused), and the
# policy allows no fallback, so every rank ends in SetupFailed after group a's mismatch.
POLICY = textwrap.dedent("""
    from commsim.policy import Policy
    POLICY = Policy(name="flag-trusted-no-fallback", order=("ipc", "nccl"),
                    params={"max_size": 8 << 20, "p2p_check": "flag"},
                    fallback_on_setup_error=False)
""")

SCENARIO = textwrap.dedent("""
    [scenario]
    name = "mismatch-then-setup-failure"
    seed = 0
    policy = "policy.py:POLICY"

    [topology]
    preset = "rtx5090-2"

    [[fault]]
    kind = "p2p_writes_lost"
    host = "rtx5090-0"
    gpus = [0, 1]
    cause = "corrupt"
    %s
    [[group]]
    name = "a"
    ranks = "0..1"

    [[group]]
    name = "b"
    ranks = "0..1"

    [workload]
    ops = ["all_reduce"]
    sizes = ["4KiB"]
    dtypes = ["bfloat16"]
""") % "".join(f"""
    [[fault]]
    kind = "call_fails"
    rank = {r}
    api = "cudaIpcOpenMemHandle"
    code = "cudaErrorTooManyPeers"
    nth = 2
""" for r in (0, 1))


def _scenario(tmp_path: Path):
    (tmp_path / "policy.py").write_text(POLICY)
    (tmp_path / "s.toml").write_text(SCENARIO)
    return load(tmp_path / "s.toml")


def test_mismatch_before_a_failure_is_reported(tmp_path: Path) -> None:
    sc = _scenario(tmp_path)
    res = run_scenario(sc)
    assert sorted(e.rank for e in res.errors) == [0, 1]
    assert {e.step for e in res.errors} == {"init"}
    assert len(res.mismatches) == 2
    assert all(m.startswith(f"group a rank {r}: all_reduce 4096 B") for r, m in enumerate(res.mismatches))
    assert any("all_reduce 4096 B" in f for f in res.failures)

    procs = run_scenario_procs(sc, timeout=30)
    assert procs.mismatches == res.mismatches
    assert [(e.rank, e.step, e.name) for e in procs.errors] == [(e.rank, e.step, e.name) for e in res.errors]
