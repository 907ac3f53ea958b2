"""The run's versions flip real outcomes, one layer at a time: the same program under two
versions, two verdicts, each the one its source gives (docs/fidelity-rules.md, Versions).
Inproc mode: the rules are the same in procs mode, which tests/hosting/test_symm_mem.py and
the driver's conformance tests cover."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from commsim.scenario.runner import run_scenario
from commsim.scenario.schema import load
from hosting_helpers import PROGRAMS, hosted

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize("versions,verdict", [
    ({"driver": "580.82.07"}, {"second": 0, "same": True}),           # row H1: refcount
    ({"driver": "460.32.03", "cuda": "11.2"}, {"second": 208, "same": False}),   # row H2
])
def test_driver_answers_a_second_ipc_open_by_its_branch(versions: dict, verdict: dict) -> None:
    v, res, out = hosted(PROGRAMS / "ipc_reopen.py", "hgx-h100-8:1", nproc_per_host=2,
                         versions=versions)
    assert {k: res[0][k] for k in verdict} == verdict, out
    if verdict["same"]:
        assert v.exit_code == 0, out
    else:
        assert v.exit_code == 1 and "cudaIpcOpenMemHandle -> cudaErrorAlreadyMapped (208)" in v.format()


@pytest.mark.parametrize("torch,enabled", [("2.10", True), ("2.13", False)])
def test_rendezvous_enables_the_group_only_before_torch_2_11(torch: str, enabled: bool) -> None:
    # Row TV1: 2.10's rendezvous called enable_symm_mem_for_group; 2.11 (pytorch#172163)
    # stopped, so the async-TP gate is False after a rendezvous alone (pytorch#193027).
    v, res, out = hosted(PROGRAMS / "symm_mem_enabled.py", "hgx-h100-8:1", nproc_per_host=2,
                         versions={"torch": torch})
    assert [res[r]["enabled"] for r in (0, 1)] == [enabled, enabled], out
    assert v.exit_code == (0 if enabled else 1), out
    if not enabled:
        assert "symmetric memory is not enabled for group world" in out


@pytest.mark.parametrize("torch,warned", [("2.10", []), ("2.11", ["FutureWarning"])])
def test_the_deprecation_warning_comes_with_2_11(torch: str, warned: list, monkeypatch) -> None:
    monkeypatch.setenv("CALL_ENABLE", "1")
    v, res, out = hosted(PROGRAMS / "symm_mem_enabled.py", "hgx-h100-8:1", nproc_per_host=2,
                         versions={"torch": torch})
    assert res[0]["warned"] == warned, out                           # row TV2


def test_a_scenario_driver_version_decides_graph_registration() -> None:
    sc = load(ROOT / "scenarios/fidelity/ipc-graph-segment-driver-version.toml")
    assert sc.cluster.versions.driver_major == 450 and not sc.faults
    old = run_scenario(sc)
    assert [e.name for e in old.errors][:1] == ["cudaErrorAlreadyMapped"] and not old.failures
    current = sc.cluster.versions.with_fields({"driver": "580.82.07", "cuda": "13.0"})
    new = run_scenario(dataclasses.replace(
        sc, cluster=dataclasses.replace(sc.cluster, versions=current)))
    assert not new.errors and set(new.backends.values()) == {"ipc"}
