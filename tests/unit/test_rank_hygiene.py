"""Rank numbering, failure hygiene and algorithm/workspace agreement as policy knobs (issue
18 items 4-6; docs/lifecycle-rules.md RN1-RN4, FH1-FH3, AW1-AW2). Each knob's mistake shows
under its knob; the default policy never makes it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from commsim.policy import Policy
from commsim.scenario.runner import run_scenario
from commsim.scenario.schema import load

REG = "scenarios/regressions/"


def run(name: str, **params):
    sc = load(REG + name + ".toml")
    pol = Policy(name="t", order=("ipc", "fabric", "multicast", "symm", "nccl"),
                 params={"max_size": 8 << 20, **params}, fallback_on_setup_error=False)
    return sc, run_scenario(sc, pol)


def test_local_rank_index_is_harmless_for_the_first_group_only():
    _, res = run("local-rank-workspace-index", workspace_index="local_rank")
    assert sorted(e.rank for e in res.errors) == [4, 5, 6, 7]
    assert not [m for m in res.mismatches if "tp0" in m]


def test_gpus_per_node_from_device_count_also_calls_two_trays_one_node():
    # 4 devices visible per tray: TP 8 > 4 is multi-node, so ipc is declined (right answer by
    # luck); TP 4 across trays (ranks 2-5) fits in 4 and is "one node".
    sc = load(REG + "trtllm-mapping-two-trays-one-node.toml")
    from commsim.scenario.model import Group
    sc = replace(sc, groups=(Group("tp", (2, 3, 4, 5)),))
    pol = Policy(name="t", order=("ipc", "nccl"), params={"max_size": 8 << 20, "gpus_per_node": "device_count"},
                 fallback_on_setup_error=False)
    res = run_scenario(sc, pol)
    assert {e.name for e in res.errors} == {"cudaErrorInvalidResourceHandle"}


def test_forced_one_shot_without_the_check_overruns_the_workspace():
    _, res = run("trtllm-forced-oneshot-workspace", force_algorithm="one-shot", workspace_check="none")
    faulted = sorted(e.rank for e in res.errors if e.name == "cudaErrorIllegalAddress")
    assert faulted == [4, 5, 6, 7]                  # slots 4-7 of 4 MiB end past 16 MiB
    assert all(e.step == "op" for e in res.errors)


def test_forced_one_shot_that_fits_runs_and_is_exact():
    sc = load(REG + "trtllm-forced-oneshot-workspace.toml")
    sc = replace(sc, workload=replace(sc.workload, sizes=(1 << 20,)))
    res = run_scenario(sc, Policy(name="t", order=("ipc", "nccl"),
                                  params={"max_size": 8 << 20, "force_algorithm": "one-shot"}))
    assert not res.errors and not res.mismatches and not res.leaks


def test_rollback_and_reported_fallback_are_the_defaults():
    sc = load(REG + "silent-leaky-fallback.toml")
    quiet = run_scenario(sc, Policy(name="t", params={"max_size": 8 << 20, "report_fallback": False}))
    assert {e.name for e in quiet.errors} == {"SilentFallback"} and not quiet.leaks
    assert "declined after set-up failure" not in quiet.explain["world"]
    leaky = run_scenario(sc, Policy(name="t", params={"max_size": 8 << 20, "rollback": False}))
    assert not leaky.errors and len(leaky.leaks) == 7
    clean = run_scenario(sc, "default")
    assert clean.ok and "ipc: declined after set-up failure" in clean.explain["world"]
