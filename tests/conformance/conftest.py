"""The one place where tests/conformance gets its drivers: `make_rig(topology, placement)`.

Every conformance case is written against the Driver protocol (commsim/driver.py) plus
`check`; the few things a case needs beyond CUDA calls (read/write bytes from the host, pass a
POSIX fd between processes, launch a device access, run processes as ranks, and, for the
simulator only, the ledger and the fabric's ground truth) go through the Rig this factory
returns. A later GPU run swaps the factory (and only it) for one that builds CUDA drivers.

Factory choice: the environment variable COMMSIM_DEVICE.
- unset or `sim`: SimFabric + `spawn_driver` (commsim/sim), one simulated process per
  placement entry;
- `procs`: the simulator in process mode (commsim/procs/rig.py): one OS process per
  placement entry, each with its own ProcessFabric, device memory in /dev/shm;
- `cuda`: the real driver: commsim.devicecheck.rig.CudaRig, one OS process with a device.driver.CudaDriver
  per placement entry. Without a GPU every conformance test is skipped with the reason, never
  silently passed; with one, a case whose topology this machine cannot stand in for (more
  hosts, other attributes, P2P, fabric info) is skipped with what differs.

Placement: a sequence of (host index, GPU index) pairs, one per process; the same pair twice
is two processes on one GPU. Host indices count the topology's hosts in order, so
`gb200-nvl72:2` with [(0, 0), (1, 0)] is one process on GPU 0 of each of two trays.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import numpy as np
import pytest

from commsim.driver import Driver
from commsim.runtime.scheduler import Scheduler
from commsim.topology.model import Cluster, GpuRef
from commsim.topology.presets import build

DEVICE = os.environ.get("COMMSIM_DEVICE", "sim").strip().lower() or "sim"
Placement = Sequence[tuple[int, int]]


def _cuda_unavailable() -> str:
    """Why the CUDA factory cannot run here; "" when it can."""
    try:
        from device.driver import unavailable_reason
    except ImportError as exc:
        return f"COMMSIM_DEVICE=cuda but the device layer cannot be imported ({exc})"
    why = unavailable_reason()
    return f"COMMSIM_DEVICE=cuda but {why}" if why else ""


class SimRig:
    """Drivers of one simulated cluster, one per placement entry, and what a case needs
    beyond CUDA calls.

    Device-independent part (a CUDA Rig implements it for real): `drivers` / `rig[i]`,
    `write`, `read`, `kernel_read`, `multimem_read`, `pass_fd`, `close_fd`, `run_ranks`.
    Ground truth (`held`, `ledger`, `flagged`, `flag_count`, `live_allocs`,
    `live_multicasts`, `exit_process`, `assert_clean`) exists only in the simulator: a CUDA
    Rig answers UNKNOWN (equal to anything) for counts, True for `flagged`, and
    `assert_clean` does nothing; cases that exercise the simulator itself are `sim_only`.
    """

    sim = True

    def __init__(self, cluster: Cluster, placement: Placement, seed: int = 0):
        from commsim.sim import SimFabric, spawn_driver

        self.cluster = cluster
        self.fabric = SimFabric(cluster, seed=seed)
        self.drivers: list[Driver] = []
        for h, g in placement:
            host = cluster.hosts[h]
            self.drivers.append(spawn_driver(self.fabric, GpuRef(host.name, g)))

    def __getitem__(self, i: int) -> Driver:
        return self.drivers[i]

    def __len__(self) -> int:
        return len(self.drivers)

    # ---- host <-> device bytes, device access ----------------------------------------------
    def write(self, i: int, ptr: int, data: bytes | np.ndarray) -> Any:
        """cudaMemcpy HostToDevice of `data` at `ptr` in process i; the result tuple."""
        return self.drivers[i].memcpy_htod(ptr, np.frombuffer(bytes(data), np.uint8)
                                           if isinstance(data, (bytes, bytearray)) else data)

    def read(self, i: int, ptr: int, nbytes: int) -> tuple:
        """cudaMemcpy DeviceToHost: (err, bytes or None)."""
        err, arr = self.drivers[i].memcpy_dtoh(ptr, nbytes)
        return err, (None if arr is None else arr.tobytes())

    def kernel_read(self, i: int, ptr: int, nbytes: int) -> tuple:
        """A kernel in process i loads `nbytes` at `ptr`: (err, bytes or None). A fault is
        cudaErrorIllegalAddress (700), as a real kernel launch reports it."""
        out: list[bytes] = []

        def kernel(ctx, p, n):
            out.append(ctx.array(p, np.uint8, n).tobytes())

        res = self.drivers[i].launch_kernel(kernel, ptr, nbytes)
        return res[0], (out[0] if out else None)

    def multimem_read(self, i: int, ptr: int, dtype: Any, count: int) -> tuple:
        """multimem.ld of `count` elements at multicast address `ptr` in process i: (err,
        list of per-device arrays, in team join order)."""
        out: list[list[np.ndarray]] = []

        def kernel(ctx, p, n):
            out.append([v.copy() for v in ctx.multimem(p, dtype, n)])

        res = self.drivers[i].launch_kernel(kernel, ptr, count)
        return res[0], (out[0] if out else None)

    # ---- processes ----------------------------------------------------------------------
    def pass_fd(self, src: int, fd: int, dst: int) -> int:
        """Send a POSIX fd over AF_UNIX + SCM_RIGHTS; raises FdTransportError across hosts."""
        from commsim.sim.fd_channel import pass_fd

        return pass_fd(self.drivers[src], fd, self.drivers[dst])

    def close_fd(self, i: int, fd: int) -> int:
        return self.drivers[i].close_fd(fd)

    def run_ranks(self, fn: Callable[[int], Any], seed: int = 0, n: int | None = None):
        """fn(rank) for every process (or the first n) as cooperative ranks; the outcomes."""
        return Scheduler(seed).run_ranks(len(self.drivers) if n is None else n, fn)

    # ---- simulator ground truth (sim only) ----------------------------------------------
    def ledger(self, i: int):
        return self.drivers[i].ledger

    def held(self, i: int) -> dict[str, int]:
        """What process i holds, by ledger kind (empty dict = nothing)."""
        return self.drivers[i].ledger.summary()

    def pid(self, i: int) -> int:
        return self.drivers[i].proc.pid

    @property
    def flags(self) -> list[str]:
        return self.fabric.flags

    def flagged(self, row: str, i: int | None = None) -> bool:
        """The fabric flagged undefined behaviour of `row` (by process i, if given)."""
        pid = None if i is None else str(self.pid(i))
        return any(f"row {row}" in f and (pid is None or pid in f) for f in self.fabric.flags)

    def flag_count(self, row: str | None = None) -> int:
        return sum(1 for f in self.fabric.flags if row is None or f"row {row}" in f)

    def live_allocs(self) -> int:
        return len(self.fabric.allocs)

    def live_multicasts(self) -> int:
        return len(self.fabric.multicasts)

    def exit_process(self, i: int) -> list[str]:
        return self.fabric.exit_process(self.drivers[i].proc.pid)

    def assert_clean(self) -> None:
        """Every process holds nothing and no physical memory is left (full teardown)."""
        held = {i: self.held(i) for i in range(len(self.drivers)) if self.held(i)}
        assert not held, "after teardown, processes still hold: " + "; ".join(
            self.drivers[i].ledger.report() for i in held)
        assert not self.fabric.allocs, f"physical allocations left: {sorted(self.fabric.allocs)}"
        assert not self.fabric.multicasts, f"multicast objects left: {sorted(self.fabric.multicasts)}"


def make_rig(topology: str | Cluster, placement: Placement, seed: int = 0) -> SimRig:
    """THE factory: drivers for `topology` (a preset spec such as `gb200-nvl72:2`, or an
    edited Cluster) with one process per placement entry."""
    if DEVICE not in ("sim", "cuda", "procs"):
        raise pytest.UsageError(f"COMMSIM_DEVICE={DEVICE!r}: use 'sim' (default), 'procs' or 'cuda'")
    cluster = build(topology) if isinstance(topology, str) else topology
    if DEVICE == "procs":
        from commsim.procs.rig import ProcSimRig
        return ProcSimRig(cluster, placement, seed)
    if DEVICE == "cuda":
        why = _cuda_unavailable()
        if why:
            pytest.skip(why)
        from commsim.devicecheck.rig import CaseNotRunnable, CudaRig
        try:
            return CudaRig(cluster, placement, seed)
        except CaseNotRunnable as exc:
            pytest.skip(str(exc))
    return SimRig(cluster, placement, seed)


@pytest.fixture
def rig_factory() -> Callable[..., SimRig]:
    return make_rig


def pytest_collection_modifyitems(config, items):
    if DEVICE != "cuda":
        return
    reason = _cuda_unavailable()
    if not reason:
        return
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.skip(reason=reason))
