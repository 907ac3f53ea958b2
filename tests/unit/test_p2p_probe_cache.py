"""The functional P2P probe's verdicts are kept per host value across fabrics
(commsim/sim/p2p_probe.py): a later fabric of an equal machine answers the same, leaves its
counters where a real round trip would, and a machine that differs for that pair (a refused
open, writes that do not land, a full GPU) still gets a round trip of its own."""

from __future__ import annotations

import dataclasses

import pytest

from commsim.sim import SimFabric, p2p_probe, spawn_driver
from commsim.sim.host_memory import MemoryProvider
from commsim.topology import build_preset
from commsim.topology.model import GpuRef

HOST = "hgx-h100-0"
A, B = GpuRef(HOST, 1), GpuRef(HOST, 6)


@pytest.fixture(autouse=True)
def _empty_cache():
    p2p_probe._by_host_id.clear()
    p2p_probe._by_host_value.clear()
    yield
    p2p_probe._by_host_id.clear()
    p2p_probe._by_host_value.clear()


def _counting(monkeypatch) -> list:
    runs: list = []
    real = p2p_probe._run

    def run(fabric, me, peer):
        runs.append((me, peer))
        return real(fabric, me, peer)
    monkeypatch.setattr(p2p_probe, "_run", run)
    return runs


def _state(f: SimFabric) -> tuple:
    return f._next_pid, f._next_aid, f.memory.touched


def _counted(cluster, seed: int = 0) -> SimFabric:
    return SimFabric(cluster, seed, memory=MemoryProvider(count_touched=True))


def _with_link(cluster, i: int, j: int, **facts):
    h = cluster.host(HOST)
    rows = [list(r) for r in h.links]
    rows[i][j] = dataclasses.replace(h.link(i, j), **facts)
    rows[j][i] = dataclasses.replace(h.link(j, i), **facts)
    return cluster.replace_host(HOST, links=tuple(tuple(r) for r in rows))


def test_a_second_fabric_takes_the_verdict_and_moves_its_counters_the_same(monkeypatch) -> None:
    runs = _counting(monkeypatch)
    c = build_preset("hgx-h100-8")
    first, second = _counted(c, seed=1), _counted(c, seed=2)
    assert p2p_probe.probe_pair(first, A, B) == ""
    assert p2p_probe.probe_pair(second, A, B) == ""
    assert runs == [(A, B)]
    assert _state(second) == _state(first) and _state(first)[0] > 1000
    # What follows is the same as after a real probe: the next process gets the same pid.
    assert spawn_driver(first, A).proc.pid == spawn_driver(second, A).proc.pid
    # An equal machine built anew (another Cluster object) finds it by value.
    assert p2p_probe.probe_pair(_counted(build_preset("hgx-h100-8")), A, B) == "" and len(runs) == 1


@pytest.mark.parametrize("facts, says", [({"ipc_refused": "acs"}, "cudaIpcOpenMemHandle"),
                                         ({"peer_writes": "corrupt"}, "differ")])
def test_a_machine_that_differs_for_the_pair_is_probed_again(monkeypatch, facts, says) -> None:
    runs = _counting(monkeypatch)
    c = build_preset("hgx-h100-8")
    assert p2p_probe.probe_pair(SimFabric(c), A, B) == ""
    bad = _with_link(c, 1, 6, **facts)
    got = p2p_probe.probe_pair(SimFabric(bad), A, B)
    assert says in got and len(runs) == 2
    # Another pair of the faulted machine keeps the sound machine's verdict ...
    assert p2p_probe.probe_pair(SimFabric(c), GpuRef(HOST, 0), GpuRef(HOST, 2)) == ""
    assert p2p_probe.probe_pair(SimFabric(bad), GpuRef(HOST, 0), GpuRef(HOST, 2)) == ""
    assert len(runs) == 3
    # ... and the faulted pair's own verdict is kept for the next equal faulted machine.
    assert p2p_probe.probe_pair(SimFabric(_with_link(c, 1, 6, **facts)), A, B) == got
    assert len(runs) == 3


def test_a_peer_without_room_for_the_buffer_runs_the_probe(monkeypatch) -> None:
    runs = _counting(monkeypatch)
    c = build_preset("hgx-h100-8")
    assert p2p_probe.probe_pair(SimFabric(c), A, B) == ""
    full = SimFabric(c)
    full._used[B] = c.gpu(B).memory_bytes         # every byte of the peer GPU in use
    got = p2p_probe.probe_pair(full, A, B)
    assert got.startswith("the probe could not allocate") and len(runs) == 2
    # That answer came from the run's state: it is never handed to another fabric.
    assert p2p_probe.probe_pair(SimFabric(c), A, B) == "" and len(runs) == 2


def test_switched_off_rules_are_part_of_the_key(monkeypatch) -> None:
    runs = _counting(monkeypatch)
    c = build_preset("hgx-h100-8")
    p2p_probe.probe_pair(SimFabric(c), A, B)
    p2p_probe.probe_pair(SimFabric(c, disabled_rules=frozenset({"L10"})), A, B)
    assert len(runs) == 2


def test_a_verdict_moves_the_touched_count_only_where_it_was_counted(monkeypatch) -> None:
    runs = _counting(monkeypatch)
    c = build_preset("hgx-h100-8")
    p2p_probe.probe_pair(SimFabric(c), A, B)            # no count kept: nothing to replay
    counted = _counted(c)
    p2p_probe.probe_pair(counted, A, B)
    assert len(runs) == 2 and counted.memory.touched == p2p_probe.PROBE_BYTES
    again = _counted(c)
    p2p_probe.probe_pair(again, A, B)
    assert len(runs) == 2 and _state(again) == _state(counted)
