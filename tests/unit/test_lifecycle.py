"""When set-up happens (issue 18 item 1; docs/lifecycle-rules.md LC1-LC2): lazy workspaces
move a set-up failure to the step of the first op."""

from __future__ import annotations

import pytest

from commsim.scenario.fields import ScenarioError
from commsim.scenario.runner import run_scenario
from commsim.scenario.schema import loads

SHORTCUT = "scenarios/policies/sglang_no_dp_fusion.py:POLICY"


def toml(setup: str, capture: bool, policy: str = SHORTCUT) -> str:
    return f"""
[scenario]
name = "lazy"
policy = "{policy}"
[topology]
preset = "gb200-nvl72"
hosts = 2
[workload]
ops = ["all_reduce"]
sizes = ["64KiB"]
graph_capture = {str(capture).lower()}
setup = "{setup}"
"""


@pytest.mark.parametrize("setup, capture, step", [("init", True, "init"), ("lazy", False, "op"),
                                                  ("lazy", True, "capture")])
def test_failure_step_follows_the_set_up_time(setup, capture, step):
    res = run_scenario(loads(toml(setup, capture)))
    assert {e.name for e in res.errors} == {"cudaErrorInvalidResourceHandle"}
    assert {e.step for e in res.errors} == {step}
    assert not res.leaks and not res.flags


@pytest.mark.parametrize("capture", [False, True])
def test_lazy_set_up_under_the_default_policy_is_clean(capture):
    res = run_scenario(loads(toml("lazy", capture, policy="default")))
    assert res.ok, res.failures
    assert set(res.backends.values()) == {"fabric"}
    assert "deferred to the first op, which ran at step " + ("capture" if capture else "op") \
        in res.explain["world"]


def test_unknown_setup_value_is_refused():
    with pytest.raises(ScenarioError, match=r"\[workload\] setup: unknown setup 'later'.*accepted: init, lazy"):
        loads(toml("later", False))
