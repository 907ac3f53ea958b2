"""Each regression fails under its shortcut policy exactly as the report shows (error,
lifecycle step, rank) and passes under the default policy with the right backend and no leak.
The mutation tests switch off the simulator rule each shortcut trips and show the regression
then stops failing: the scenarios test the simulator's semantics, not a fixed answer."""

from __future__ import annotations

from pathlib import Path

import pytest

from commsim.cli import main
from commsim.scenario.runner import run_scenario
from commsim.scenario.schema import load

REG = Path(__file__).resolve().parents[2] / "scenarios" / "regressions"

# file -> (error name, step, failing rank, text the failure must show, rules it trips, fixed backend)
CASES = {
    "flashinfer-2006-fusion-workspace.toml": (
        "cudaErrorInvalidResourceHandle", "init", 0,
        "invalid resource handle [rank 0 on host gb200-nvl72-tray00 opening the workspace IPC "
        "handle of rank 4 on host gb200-nvl72-tray01]", {"L8"}, "fabric"),
    "vllm-52778-graph-registration.toml": (
        "cudaErrorInvalidResourceHandle", "register", 0,
        "opening the graph buffer IPC handle of rank 1 on host gb200-nvl72-tray01", {"L8"}, "fabric"),
    "mnnvl-local-probe-imex.toml": (
        "CUDA_ERROR_NOT_PERMITTED", "init", 4, "cuMemCreate failed: CUDA_ERROR_NOT_PERMITTED (800)",
        {"V3", "V5"}, "nccl"),
    "vllm-46515-profiling-leak.toml": (None, None, None, "discarded capture left 7 IPC mapping(s) open",
                                       {"G5", "L15"}, "ipc"),
}


def test_every_regression_file_is_covered():
    from test_lifecycle_regressions import LIFECYCLE   # beside this file (pytest puts its folder
    from test_rendezvous_hangs import HANGS            # on sys.path)
    assert sorted(p.name for p in REG.glob("*.toml")) == sorted({**CASES, **HANGS, **LIFECYCLE})


@pytest.mark.parametrize("name", sorted(CASES))
def test_fails_under_shortcut_policy(name):
    error, step, rank, text, _, _ = CASES[name]
    res = run_scenario(load(REG / name))
    assert res.expects_failure and res.ok, res.failures
    if error:
        hits = [e for e in res.errors if e.name == error and e.step == step and e.origin == rank]
        assert hits, res.errors
        assert len(res.errors) == load(REG / name).world_size   # every rank reports it, none hangs
        assert any(text in e.message for e in res.errors)
        assert not res.leaks, res.leaks                         # a failed set-up leaves no residue
    else:
        assert any(text in leak for leak in res.leaks), res.leaks
        assert any("row L15" in f for f in res.flags)
    assert "--expect-failure" in res.replay_command()


@pytest.mark.parametrize("name", sorted(CASES))
def test_passes_under_default_policy(name):
    *_, backend = CASES[name]
    res = run_scenario(load(REG / name), policy="default")
    assert not res.expects_failure
    assert res.ok, res.failures
    assert not res.errors and not res.leaks and not res.flags
    assert set(res.backends.values()) == {backend}


@pytest.mark.parametrize("name", sorted(CASES))
def test_mutation_removing_the_rule_hides_the_bug(name):
    error, rules = CASES[name][0], CASES[name][4]
    res = run_scenario(load(REG / name), disabled_rules=frozenset(rules))
    assert res.expects_failure
    assert not res.ok, f"with {rules} switched off the shortcut should no longer fail as expected"
    if error:
        # (vLLM#52778's shortcut then goes on to run its kernel over local buffers, which the
        # scheduler diagnoses as a hang: a different failure, not the reported one.)
        assert not any(e.name == error for e in res.errors), res.errors
    else:
        assert not res.leaks and not res.flags


def test_cli_expect_failure_and_default(capsys):
    assert main(["run", str(REG), "--expect-failure"]) == 0
    out = capsys.readouterr().out
    n = len(list(REG.glob("*.toml")))
    assert f"{n} scenario(s), {n} ok, 0 failed" in out
    assert main(["run", str(REG), "--policy", "default"]) == 0
    # a file without failure expectations cannot be run with --expect-failure
    topo = REG.parent / "topologies" / "hgx-h100-8.toml"
    assert main(["run", str(topo), "--expect-failure"]) == 2
    assert "--expect-failure needs" in capsys.readouterr().err


def test_cli_failure_report_names_rank_call_host_and_replay(capsys):
    rc = main(["run", str(REG / "flashinfer-2006-fusion-workspace.toml"), "--policy", "sglang-nope"])
    assert rc == 2 and "unknown policy 'sglang-nope'" in capsys.readouterr().err
    main(["run", str(REG / "flashinfer-2006-fusion-workspace.toml"), "--expect-failure", "-v"])
    out = capsys.readouterr().out
    # One line for the error all eight ranks hit, not eight copies of it
    assert "ranks 0-7 (GPU gb200-nvl72-tray00/gpu0, " in out
    assert out.count("at step init: cudaErrorInvalidResourceHandle") == 1
    assert "cudaIpcOpenMemHandle failed" in out
    assert "decision trace" in out and "ipc: admitted" in out
    assert "replay: commsim run" in out


def test_a_failure_after_set_up_explains_which_gate_admitted_the_path(capsys):
    """vLLM#52778: graph registration fails at step `register`, long after set-up; the report
    names the policy's shortcut that admitted custom all-reduce and the machine's rule it
    overrode (before: no decision trace at all for a failure past set-up)."""
    main(["explain", str(REG / "vllm-52778-graph-registration.toml")])
    out = capsys.readouterr().out
    assert "at step register: cudaErrorInvalidResourceHandle" in out
    trace = out[out.index("decision trace"):]
    assert ("ipc: admitted by policy vllm-ws2-custom-ar: world size 2 is always eligible "
            "(pre-#55835 shortcut); the machine's rules would decline it: ranks are on 2 hosts "
            "(gb200-nvl72-tray00, gb200-nvl72-tray01)") in trace
