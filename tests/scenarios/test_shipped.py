"""Every shipped machine scenario (scenarios/topologies/) passes under its own policy: the
backend it expects per group, op and size, exact results and a zero ledger. `make run` runs
the same files; this keeps a change to the default policy from silently contradicting them.
The rack-sized files (more than 16 ranks, about a minute each on 2 cores) are left to
`make run`, which runs every file; their groups' shapes are in the generated sweep too."""

from __future__ import annotations

from pathlib import Path

import pytest

from commsim.scenario.runner import run_scenario
from commsim.scenario.schema import load

TOPOLOGIES = Path(__file__).resolve().parents[2] / "scenarios" / "topologies"


SMALL = sorted(p.name for p in TOPOLOGIES.glob("*.toml") if load(p).world_size <= 16)


@pytest.mark.parametrize("name", SMALL)
def test_shipped_machine_scenario_passes(name):
    res = run_scenario(load(TOPOLOGIES / name))
    assert res.ok, res.failures
    assert not res.errors and not res.leaks and not res.flags
