"""The two fd-exchange transports (docs/lifecycle-rules.md FX1-FX5)."""

from __future__ import annotations

import pytest

from commsim.driver import FD, FdTransportError, alloc_prop, check
from commsim.libmodels.fd_exchange import TRANSPORTS, transport
from commsim.group import LocalWorld
from commsim.runtime import HangDetected
from commsim.sim import SimFabric, spawn_driver
from commsim.topology import build_preset

SLOT = 2 << 20


def run_exchange(preset: str, n: int, name: str, op: str = "all_gather"):
    cluster = build_preset(preset)
    refs = list(cluster.gpu_refs())[:n]
    fabric = SimFabric(cluster, seed=0)
    drivers = [spawn_driver(fabric, g) for g in refs]
    world = LocalWorld(n, seed=3)
    t = transport(name)

    def rank(g):
        d = drivers[g.rank]
        h = check("cuMemCreate", d.cuMemCreate(SLOT, alloc_prop(check("cudaGetDevice", d.cudaGetDevice()), FD), 0))
        fd = check("cuMemExportToShareableHandle", d.cuMemExportToShareableHandle(h, FD, 0))
        pids = g.all_gather_object(d.getpid(), tag="pids")
        hosts = g.all_gather_object(d.gethostname(), tag="hosts")
        try:
            if op == "all_gather":
                fds = t.all_gather(d, g.rank, pids, hosts, fd)
                targets = [d.fd_target(f) for f in fds]
                for f in fds:
                    if f != fd:
                        d.close_fd(f)
            else:
                got = t.broadcast(d, g.rank, 0, pids, hosts, fd if g.rank == 0 else None)
                targets = [d.fd_target(got)]
                if got != fd:
                    d.close_fd(got)
            return targets, d.fd_target(fd)
        finally:
            d.close_fd(fd)
            d.cuMemRelease(h)

    outcomes = world.run(rank)
    return outcomes, world, drivers


@pytest.mark.parametrize("name", sorted(TRANSPORTS))
def test_one_host_every_rank_gets_every_fd(name):
    outcomes, _, drivers = run_exchange("hgx-h100-8", 4, name)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    owns = [o.value[1] for o in outcomes]
    for o in outcomes:
        assert o.value[0] == owns                 # fds[r] resolves to rank r's allocation
    assert all(d.ledger.count() == 0 for d in drivers)


@pytest.mark.parametrize("name", sorted(TRANSPORTS))
def test_one_host_broadcast(name):
    outcomes, _, _ = run_exchange("hgx-h100-8", 3, name, op="broadcast")
    assert all(o.ok for o in outcomes)
    root = outcomes[0].value[1]
    assert all(o.value[0] == [root] for o in outcomes)


def test_ring_across_two_hosts_boundary_ranks_fail_others_hang():
    outcomes, world, drivers = run_exchange("gb200-nvl72:2", 8, "pytorch_ring")
    errors = {o.rank: o.error for o in outcomes}
    failed = sorted(r for r, e in errors.items() if isinstance(e, FdTransportError))
    assert failed == [3, 7]                     # successor on the other tray
    for r in failed:
        assert "Failed to send fd: No such file or directory" in str(errors[r])
        assert errors[r].errno == 2
    hung = sorted(r for r, e in errors.items() if isinstance(e, HangDetected))
    assert hung == [0, 1, 2, 4, 5, 6]
    assert "rank 4 waits in recvmsg" in str(errors[4]) and "from rank 3" in str(errors[4])
    assert "rank 0 waits in recvmsg" in str(errors[0]) and "from rank 7" in str(errors[0])
    assert world.scheduler.now == 0.0           # no timeout involved: an immediate diagnosis
    assert all(d.ledger.count() == 0 for d in drivers)


def test_mesh_across_two_hosts_every_rank_times_out_after_30s():
    outcomes, world, drivers = run_exchange("gb200-nvl72:2", 8, "flashinfer_mesh")
    assert all(isinstance(o.error, FdTransportError) for o in outcomes), [o.error for o in outcomes]
    for o in outcomes:
        assert "[fd_exchange] timed out connecting to /tmp/cuda_fd_xchg_" in str(o.error)
    assert world.scheduler.now == pytest.approx(30.0)
    assert all(d.ledger.count() == 0 for d in drivers)


def test_unknown_transport_is_refused():
    with pytest.raises(ValueError, match="unknown fd transport 'nfs'"):
        transport("nfs")
