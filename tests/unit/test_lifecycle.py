"""When set-up happens (docs/lifecycle-rules.md LC1-LC2): lazy workspaces
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
    # Rule LC3: a set-up still pending when the capture begins runs at the library's capture
    # hook, outside the stream capture, where its cudaMalloc is allowed (CG1).
    assert ("deferred to the capture hook, before the stream capture began" if capture
            else "deferred to the first op, which ran at step op") in res.explain["world"]


def test_unknown_setup_value_is_refused():
    with pytest.raises(ScenarioError, match=r"\[workload\] setup: unknown setup 'later'.*accepted: init, lazy"):
        loads(toml("later", False))


@pytest.mark.parametrize("line, words", [
    ('allocator = "slab"', "[workload] allocator: unknown allocator 'slab'"),
    ('nccl_env = { NCCL_NVLS_ENABLE = "maybe" }', "NCCL_NVLS_ENABLE='maybe': accepted values are 0, 1, 2"),
    ('nccl_env = { NCCL_FOO = "1" }', "NCCL_FOO: not an NCCL variable commsim models"),
    ('nccl_env = "NCCL_P2P_DISABLE=1"', "expected a table of NCCL_* ="),
])
def test_workload_knob_errors_name_the_field(line, words):
    text = toml("init", False, policy="default").replace('setup = "init"', line)
    with pytest.raises(ScenarioError) as ei:
        loads(text)
    assert words in str(ei.value)


def test_workload_knobs_parse():
    text = toml("init", False, policy="default").replace(
        'setup = "init"', 'allocator = "expandable_segments"\nnccl_env = { NCCL_P2P_LEVEL = "NVL", NCCL_ALGO = "Ring" }')
    wl = loads(text).workload
    assert wl.allocator == "expandable_segments"
    assert wl.nccl_env == (("NCCL_ALGO", "Ring"), ("NCCL_P2P_LEVEL", "NVL"))


def test_generator_samples_the_knobs_from_their_own_stream():
    from commsim.scenario.generate import sample
    wls = [sc.workload for sc in sample(0, 200)]
    assert {w.setup for w in wls} == {"init", "lazy"}
    assert {w.allocator for w in wls} == {"caching", "expandable_segments"}
    assert any(w.nccl_env for w in wls)


def test_a_policy_can_set_up_lazily_too():
    from commsim.policy import resolve
    shortcut = resolve(SHORTCUT)
    import dataclasses
    lazy = dataclasses.replace(shortcut, params={**shortcut.params, "setup": "lazy"})
    res = run_scenario(loads(toml("init", False)), lazy)
    assert {e.step for e in res.errors} == {"op"}
    bad = dataclasses.replace(shortcut, params={**shortcut.params, "setup": "soon"})
    res = run_scenario(loads(toml("init", False)), bad)
    assert {e.name for e in res.errors} == {"ValueError"} and "setup 'soon'" in res.errors[0].message


def test_workload_fd_transport_reaches_the_symm_backend():
    text = """
[scenario]
name = "fd"
policy = "scenarios/policies/symm_ring_fd_across_hosts.py:POLICY"
[topology]
preset = "gb200-nvl72"
hosts = 2
[workload]
ops = ["all_gather"]
sizes = ["1MiB"]
fd_transport = "flashinfer_mesh"
"""
    res = run_scenario(loads(text))
    assert {e.name for e in res.errors} == {"FdTransportError"} and len(res.errors) == 8
    assert all("[fd_exchange] timed out connecting to" in e.message for e in res.errors)
    with pytest.raises(ScenarioError, match="fd_transport: unknown fd_transport 'carrier_pigeon'"):
        loads(text.replace("flashinfer_mesh", "carrier_pigeon"))
