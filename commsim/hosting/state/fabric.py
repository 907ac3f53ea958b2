"""The fabric of a hosted process (procs mode, and processes a hosted program spawns).

A ProcessFabric (memory in /dev/shm segments named by the run's prefix, handles resolved
from their bytes) whose process table also learns the processes that are not ranks: a worker
a rank spawned registers its simulated pid and host in `<run dir>/procs/<pid>` when it builds
its driver, and a peer resolving one of its handles reads the host from there, so the
host rule of a legacy IPC open (row L8) holds for spawned workers too.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from commsim.sim.faults import ProcessFaults
from commsim.sim.fabric import SimProcess
from commsim.sim.process_fabric import _HEAD, PID_BASE, PeerLedger, ProcessFabric
from commsim.topology.model import Cluster, GpuRef
from commsim.hosting.state.session import program_site


class HostedFabric(ProcessFabric):
    def __init__(self, cluster: Cluster, seed: int, slot: int, placement: Sequence[GpuRef],
                 prefix: str, run_dir: str) -> None:
        super().__init__(cluster, seed, slot, placement, prefix)
        self.run_dir = run_dir
        self.where = program_site            # an undefined-behaviour flag names the program's line

    def register(self, pid: int, host: str) -> None:
        d = os.path.join(self.run_dir, "procs")
        fd = os.open(os.path.join(d, str(pid)), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                     0o600)
        with os.fdopen(fd, "w") as f:
            f.write(host)

    def _learn(self, key: Any) -> None:
        if not isinstance(key, (bytes, bytearray)) or len(key) < _HEAD.size:
            return
        pid = _HEAD.unpack(bytes(key[:_HEAD.size]))[2]
        if pid in self.processes or pid < PID_BASE:
            return
        try:
            with open(os.path.join(self.run_dir, "procs", str(int(pid)))) as f:
                host = f.read().strip()
        except OSError:
            return
        if host in self._hosts:
            self.processes[pid] = SimProcess(pid, host, (), PeerLedger(pid, self.prefix),
                                             ProcessFaults())

    def resolve_ipc_handle(self, key: bytes) -> Any:
        self._learn(key)
        return super().resolve_ipc_handle(key)

    def resolve_fabric_handle(self, key: bytes) -> Any:
        self._learn(key)
        return super().resolve_fabric_handle(key)
