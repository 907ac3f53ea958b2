"""The conformance rig in process mode (COMMSIM_DEVICE=procs): every placement entry of a case
is its own OS process with a SimDriver over a ProcessFabric, so tests/conformance states the
same semantics across real process boundaries and shared memory.

It reuses the CUDA rig's machinery (commsim/devicecheck/rig.py: a worker per placement entry serving
driver calls over a pipe, proxies that let the other ranks run while a call blocks) with a
driver factory that builds the simulated driver. What the CUDA rig cannot observe, this rig
asks the workers: each process's ledger, its live physical allocations and multicast objects
(an allocation counts once while any process still holds or maps it) and its flags. POSIX
fds are simulated numbers, so pass_fd goes through the driver's own send_fd / recv_fd over
the run's store, which refuses another host as row V9 says.
"""

from __future__ import annotations

import atexit
import tempfile
from dataclasses import dataclass
from typing import Any

import numpy as np

from commsim.devicecheck.rig import _OPEN, CudaRig, DriverProxy, _Worker
from commsim.group.seal import new_secret
from commsim.group.torch_dist import ProcessWorld, connect_store, host_store
from commsim.sim import SimDriver, shm
from commsim.sim.process_fabric import ProcessFabric
from commsim.topology.model import Cluster, GpuRef
from commsim.procs import launcher

TIMEOUT = 20.0


@dataclass(frozen=True)
class RigConfig:
    """What a rig worker needs to build its driver (passed where the CUDA rig passes a GPU)."""

    cluster: Cluster
    placement: tuple[GpuRef, ...]
    index: int
    seed: int
    prefix: str
    port: int
    secret: bytes


class RigSimDriver(SimDriver):
    """SimDriver plus the few calls the rig makes on behalf of a conformance case."""

    def rig_send_fd(self, fd: int, dst_pid: int) -> int:
        self.fd_channel().send(fd, dst_pid)
        return 0

    def rig_recv_fd(self, src_pid: int) -> int:
        return self.fd_channel().receive(src_pid)

    def rig_state(self) -> tuple[dict[str, int], set[int], set[int], list[str]]:
        """(ledger summary, ids of live allocations this process owns or still holds,
        ids of multicast objects it created and still holds, flags)."""
        f = self.fabric
        allocs = {aid for aid, a in f.allocs.items()
                  if aid not in f.remote or a.refs > 0 or a.maps > 0}
        return self.ledger.summary(), allocs, set(f.multicasts), list(f.flags)

    def rig_ledger(self) -> Any:
        return self.ledger          # pickled: a snapshot of this process's ledger

    def rig_multimem_read(self, ptr: int, dtype: str, count: int) -> tuple:
        out: list[list[np.ndarray]] = []

        def kernel(ctx: Any, p: int, n: int) -> None:
            out.append([v.copy() for v in ctx.multimem(p, np.dtype(dtype), n)])

        res = self.launch_kernel(kernel, ptr, count)
        return res[0], (out[0] if out else None)

    def rig_exit(self) -> list[str]:
        return self.fabric.exit_process(self.proc.pid)

    def launch_kernel(self, kernel: Any, *args: Any) -> tuple:
        if kernel == "read_bytes":     # the CUDA rig's device kernel, by name
            def read_bytes(ctx: Any, src: int, dst: int, n: int) -> None:
                ctx.array(dst, np.uint8, n)[:] = ctx.array(src, np.uint8, n)
            kernel = read_bytes
        return super().launch_kernel(kernel, *args)


def make_driver(cfg: RigConfig) -> RigSimDriver:
    """The rig worker's driver factory (commsim/devicecheck/rig_worker.py calls it with the config)."""
    store = connect_store("127.0.0.1", cfg.port, TIMEOUT)
    world = ProcessWorld(store, cfg.index, len(cfg.placement), secret=cfg.secret, timeout=TIMEOUT,
                         shm_prefix=cfg.prefix)
    world.install_waiter()
    fabric = ProcessFabric(cfg.cluster, cfg.seed, cfg.index, cfg.placement, cfg.prefix, mailbox=world)
    fabric._rig_world = world      # keep the store connection alive with the driver
    g = cfg.placement[cfg.index]
    host = cfg.cluster.host(g.host)
    proc = fabric.spawn(g.host, [GpuRef(g.host, x.index) for x in host.gpus])
    proc.current = g.index
    return RigSimDriver(fabric, proc)


# Strong references: the CUDA rig's registry is weak, and a rig collected without close()
# would leave its workers and segments. One case at a time: a new rig closes the previous
# ones, and whatever is open at interpreter exit is closed then.
_LIVE: list["ProcSimRig"] = []


@atexit.register
def _close_all() -> None:
    for rig in list(_LIVE):
        rig.close()


class ProcSimRig(CudaRig):
    sim = False   # cases that exercise the simulator's own limits run in thread mode only

    def __init__(self, cluster: Cluster, placement: Any, seed: int = 0) -> None:
        for old in list(_OPEN) + list(_LIVE):
            old.close()
        _LIVE.append(self)
        self.cluster, self.placement, self.seed = cluster, tuple(placement), seed
        self._store = host_store(TIMEOUT)
        self._prefix = shm.new_prefix()
        secret = new_secret()
        refs = tuple(GpuRef(cluster.hosts[h].name, g) for h, g in placement)
        ctx = launcher.context()
        self._dir = tempfile.mkdtemp(prefix="commsim-rig-")
        self._workers: list[_Worker] = []
        _OPEN.add(self)
        try:
            for i in range(len(refs)):
                cfg = RigConfig(cluster, refs, i, seed, self._prefix, self._store.port, secret)
                self._workers.append(_Worker(ctx, cfg, self._dir, i, "commsim.procs.rig:make_driver"))
        except BaseException:
            self.close()
            raise
        self.drivers = [DriverProxy(w) for w in self._workers]

    def close(self) -> None:
        super().close()
        shm.sweep(self._prefix)
        if self in _LIVE:
            _LIVE.remove(self)

    def pass_fd(self, src: int, fd: int, dst: int) -> int:
        src_pid = self.drivers[src].getpid()
        dst_pid = self.drivers[dst].getpid()
        self._workers[src].ask("call", "rig_send_fd", [fd, dst_pid])   # FdTransportError: V9
        return self._workers[dst].ask("call", "rig_recv_fd", [src_pid])

    def pid(self, i: int) -> int:
        return self.drivers[i].getpid()

    def multimem_read(self, i: int, ptr: int, dtype: Any, count: int) -> tuple:
        """multimem.ld in process i: every team member's bytes, read through shared memory."""
        return self._workers[i].ask("call", "rig_multimem_read", [ptr, np.dtype(dtype).str, count])

    def ledger(self, i: int) -> Any:
        return self._workers[i].ask("call", "rig_ledger", [])

    # ---- ground truth, gathered from every process -----------------------------------------
    def _states(self) -> list[tuple]:
        return [w.ask("call", "rig_state", []) for w in self._workers]

    def held(self, i: int) -> dict[str, int]:
        return self._workers[i].ask("call", "rig_state", [])[0]

    @property
    def flags(self) -> list[str]:
        return [f for st in self._states() for f in st[3]]

    def flagged(self, row: str, i: int | None = None) -> bool:
        pid = None if i is None else str(self.pid(i))
        return any(f"row {row}" in f and (pid is None or pid in f) for f in self.flags)

    def flag_count(self, row: str | None = None) -> int:
        return sum(1 for f in self.flags if row is None or f"row {row}" in f)

    def live_allocs(self) -> int:
        return len(set().union(*(st[1] for st in self._states())))

    def live_multicasts(self) -> int:
        # A team table counts while its creator or any importer still holds the object.
        return len(set().union(*(st[2] for st in self._states())))

    def exit_process(self, i: int) -> list[str]:
        return self._workers[i].ask("call", "rig_exit", [])

    def assert_clean(self) -> None:
        states = self._states()
        held = {i: st[0] for i, st in enumerate(states) if st[0]}
        assert not held, f"after teardown, processes still hold: {held}"
        allocs = set().union(*(st[1] for st in states))
        assert not allocs, f"physical allocations left: {sorted(allocs)}"
        mcs = set().union(*(st[2] for st in states))
        assert not mcs, f"multicast objects left: {sorted(mcs)}"
