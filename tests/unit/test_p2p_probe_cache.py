"""The functional P2P probe's verdicts are kept by the value its round trip reads, across
fabrics (commsim/sim/p2p_probe.py): a later fabric of an equal machine answers the same, leaves
its counters where a real round trip would, a machine that differs for that pair (a refused
open, writes that do not land, a full GPU) still gets a round trip of its own, and nothing
else of the machine changes a round trip's outcome (what makes the key sound)."""

from __future__ import annotations

import dataclasses

import pytest

from commsim.sim import SimFabric, p2p_probe, spawn_driver
from commsim.sim.host_memory import MemoryProvider
from commsim.topology import build_preset
from commsim.topology.model import FabricInfo, FabricState, Gpu, GpuRef, Host

HOST = "hgx-h100-0"
A, B = GpuRef(HOST, 1), GpuRef(HOST, 6)


@pytest.fixture(autouse=True)
def _empty_cache():
    p2p_probe._verdicts.clear()
    yield
    p2p_probe._verdicts.clear()


def _counting(monkeypatch) -> list:
    runs: list = []
    real = p2p_probe._run

    def run(fabric, me, peer, spawn):
        runs.append((me, peer))
        return real(fabric, me, peer, spawn)
    monkeypatch.setattr(p2p_probe, "_run", run)
    return runs


def _probe(fabric: SimFabric, me: GpuRef, peer: GpuRef) -> str:
    return p2p_probe.probe_pair(fabric, me, peer, spawn_driver)


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
    assert _probe(first, A, B) == ""
    assert _probe(second, A, B) == ""
    assert runs == [(A, B)]
    assert _state(second) == _state(first) and _state(first)[0] > 1000
    # What follows is the same as after a real probe: the next process gets the same pid.
    assert spawn_driver(first, A).proc.pid == spawn_driver(second, A).proc.pid
    # An equal machine built anew (another Cluster object) finds it by value.
    assert _probe(_counted(build_preset("hgx-h100-8")), A, B) == "" and len(runs) == 1


@pytest.mark.parametrize("facts, says", [({"ipc_refused": "acs"}, "cudaIpcOpenMemHandle"),
                                         ({"peer_writes": "corrupt"}, "differ")])
def test_a_machine_that_differs_for_the_pair_is_probed_again(monkeypatch, facts, says) -> None:
    runs = _counting(monkeypatch)
    c = build_preset("hgx-h100-8")
    assert _probe(SimFabric(c), A, B) == ""
    bad = _with_link(c, 1, 6, **facts)
    got = _probe(SimFabric(bad), A, B)
    assert says in got and len(runs) == 2
    # Another pair with a sound link, of either machine, takes the sound verdict ...
    assert _probe(SimFabric(c), GpuRef(HOST, 0), GpuRef(HOST, 2)) == ""
    assert _probe(SimFabric(bad), GpuRef(HOST, 0), GpuRef(HOST, 2)) == ""
    assert len(runs) == 2
    # ... and the faulted pair's own verdict is kept for the next equal faulted link, its
    # message written for the pair it is about.
    assert _probe(SimFabric(_with_link(c, 1, 6, **facts)), A, B) == got
    other = _with_link(c, 2, 5, **facts)
    mine = _probe(SimFabric(other), GpuRef(HOST, 2), GpuRef(HOST, 5))
    assert len(runs) == 2
    assert mine == got.replace(str(A), str(GpuRef(HOST, 2))).replace(str(B), str(GpuRef(HOST, 5)))


def test_a_peer_without_room_for_the_buffer_runs_the_probe(monkeypatch) -> None:
    runs = _counting(monkeypatch)
    c = build_preset("hgx-h100-8")
    assert _probe(SimFabric(c), A, B) == ""
    full = SimFabric(c)
    full._used[B] = c.gpu(B).memory_bytes         # every byte of the peer GPU in use
    got = _probe(full, A, B)
    assert got.startswith("the probe could not allocate") and len(runs) == 2
    # That answer came from the run's state: it is never handed to another fabric.
    assert _probe(SimFabric(c), A, B) == "" and len(runs) == 2


def test_switched_off_rules_are_part_of_the_key(monkeypatch) -> None:
    runs = _counting(monkeypatch)
    c = build_preset("hgx-h100-8")
    _probe(SimFabric(c), A, B)
    _probe(SimFabric(c, disabled_rules=frozenset({"L10"})), A, B)
    assert len(runs) == 2


def test_a_verdict_moves_the_touched_count_only_where_it_was_counted(monkeypatch) -> None:
    runs = _counting(monkeypatch)
    c = build_preset("hgx-h100-8")
    _probe(SimFabric(c), A, B)            # no count kept: nothing to replay
    counted = _counted(c)
    _probe(counted, A, B)
    assert len(runs) == 2 and counted.memory.touched == p2p_probe.PROBE_BYTES
    again = _counted(c)
    _probe(again, A, B)
    assert len(runs) == 2 and _state(again) == _state(counted)


# Another value for every field of a GPU and of a host but those the key holds (the host's
# container, the link between the pair): none may change what the round trip finds. A field
# added to Gpu or Host fails the check of coverage below until it is given one here (or is
# put in the key, commsim/sim/p2p_probe.py, if the round trip reads it).
GPU_CHANGES = {
    "model": "NVIDIA A100-SXM4-80GB", "compute_capability": (8, 0), "memory_bytes": 1 << 34,
    "vmm": False, "posix_fd": False, "fabric_handle": True, "multicast": True,
    "gpu_direct_rdma": False, "ipc_event": False, "nvlinks_up": False, "uuid": "GPU-other",
    "fabric": FabricInfo(b"\x01" * 16, 7, FabricState.IN_PROGRESS),
}
HOST_CHANGES = {
    "name": "elsewhere-0", "imex_channels": (0, 1), "driver_version": "470.57.02",
    "shm_namespace": "shared-ns", "arch": "aarch64",
}


def test_the_changes_cover_every_field_outside_the_key() -> None:
    assert set(GPU_CHANGES) == {f.name for f in dataclasses.fields(Gpu)} - {"index"}
    assert set(HOST_CHANGES) == {f.name for f in dataclasses.fields(Host)} - {"gpus", "links",
                                                                              "container"}


def _machines(base):
    """(what changed, cluster, me, peer) for the pair (A, B) of `base`."""
    h = base.host(HOST)
    for name, value in GPU_CHANGES.items():
        yield f"gpu {name}", base.replace_gpu(A, **{name: value}).replace_gpu(B, **{name: value}), A, B
    for name, value in HOST_CHANGES.items():
        if name == "name":       # the domains name the old host: the probe reads none
            moved = dataclasses.replace(h, name=value)
            yield "host name", dataclasses.replace(base, hosts=(moved,), domains=()), \
                GpuRef(value, A.index), GpuRef(value, B.index)
        else:
            yield f"host {name}", base.replace_host(HOST, **{name: value}), A, B
    rows = [list(r) for r in h.links]
    rows[B.index][A.index] = dataclasses.replace(h.link(B.index, A.index), ipc_refused="acs",
                                                  peer_writes="dropped")
    yield "the reverse link", base.replace_host(HOST, links=tuple(tuple(r) for r in rows)), A, B
    yield "another pair's writes lost", _with_link(base, 0, 2, peer_writes="corrupt"), A, B


def _round_trip(cluster, me: GpuRef, peer: GpuRef) -> tuple:
    f = SimFabric(cluster, memory=MemoryProvider(count_touched=True))
    before = _state(f)
    outcome = p2p_probe._run(f, me, peer, spawn_driver)
    return outcome, tuple(b - a for a, b in zip(before, _state(f))), tuple(f.flags)


@pytest.mark.parametrize("facts", [{}, {"ipc_refused": "acs"}, {"ipc_refused": "iommu"},
                                   {"peer_writes": "corrupt"}, {"p2p": False}])
def test_nothing_outside_the_key_changes_the_round_trip(facts) -> None:
    base = _with_link(build_preset("hgx-h100-8"), A.index, B.index, **facts) if facts \
        else build_preset("hgx-h100-8")
    want = _round_trip(base, A, B)
    for what, cluster, me, peer in _machines(base):
        assert _round_trip(cluster, me, peer) == want, what
