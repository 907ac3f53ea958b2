"""Row W6 (docs/fidelity-rules.md): a container per process on one host. The generator draws
the fault, and the oracle agrees with what the run chose on the scenarios that carry it."""

from __future__ import annotations

import itertools

from commsim.scenario.generate import build, sample_plan
from commsim.scenario.oracle import judge
from commsim.scenario.runner import run_scenario
from commsim.topology.model import ContainerCaps, GpuRef
from commsim.topology.presets import build as build_topology
from commsim.topology.truth import IPC, POSIX_FD, importable


def test_oracle_refuses_ipc_and_fds_between_containers_of_one_host() -> None:
    c = build_topology("hgx-h100-8")
    a, b = GpuRef(c.hosts[0].name, 0), GpuRef(c.hosts[0].name, 1)
    assert {IPC, POSIX_FD} <= importable(c, a, b)
    c = c.replace_host(c.hosts[0].name, container=ContainerCaps(container_per_process=True))
    assert not {IPC, POSIX_FD} & importable(c, a, b)


def test_generator_draws_containers_and_the_oracle_agrees() -> None:
    plans = (sample_plan(7, i) for i in itertools.count())
    hits = [p for p in itertools.islice(plans, 4000)
            if any(f.kind == "container_per_process" for f in p.faults)][:3]
    assert hits, "no container_per_process fault in 4000 generated plans"
    for plan in hits:
        sc = build(plan)
        res = run_scenario(sc)
        v = judge(sc, res)
        assert v.ok, (plan.id, v.render())
