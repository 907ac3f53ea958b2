"""The CUDA Rig: tests/conformance cases against real GPUs (COMMSIM_DEVICE=cuda).

Same surface as the simulator's SimRig (tests/conformance/conftest.py): `rig[i]` is a Driver
for placement entry i, here a proxy to a CudaDriver in its own process (commsim/devicecheck/rig_worker.py);
`write` / `read` are cudaMemcpy, `kernel_read` is a real kernel load (device kernel
`read_bytes`), `pass_fd` sends a real fd over AF_UNIX with SCM_RIGHTS, `run_ranks` runs the
ranks under the same seeded scheduler, a proxy call inside a rank polls its pipe with virtual
sleeps so the other ranks keep running while a call blocks in the driver (cuMulticastBindMem
waits for every device, row M2).

A case runs only where this machine can stand in for the case's topology: one host, enough
GPUs, and the same discovery view (`commsim.discovery.probe` through both drivers: device
attributes, fabric info, IMEX, P2P / NVLink between the placement's GPUs). Otherwise
`CaseNotRunnable` says what differs and the factory skips the case. Ground truth that only the
simulator has answers UNKNOWN (equal to anything) for counts and True for `flagged`; the
ledger, per-device multicast views and process exit skip the case.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import weakref
from typing import Any, Callable, Sequence

from commsim.topology.model import Cluster, GpuRef

from device import handles

Placement = Sequence[tuple[int, int]]
_COMPARED = ("vmm", "posix_fd", "fabric_handle", "multicast", "imex", "fabric_state",
             "nvlinks_up")


class CaseNotRunnable(Exception):
    """This machine is not the case's topology; the message says how it differs."""


class _Unknown:
    """A count only the simulator knows: equal to anything, holds nothing."""

    def __eq__(self, other: object) -> bool:
        return True

    def __ne__(self, other: object) -> bool:
        return False

    def __getitem__(self, key: object) -> "_Unknown":
        return self

    def __contains__(self, key: object) -> bool:
        return False

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "UNKNOWN (only the simulator counts this)"


UNKNOWN = _Unknown()


def _skip(why: str) -> None:
    import pytest
    pytest.skip(why)


class _Worker:
    def __init__(self, ctx: Any, gpu: int, sock_dir: str, index: int, factory: str):
        from commsim.devicecheck import rig_worker

        self.sock_path = os.path.join(sock_dir, f"w{index}.sock")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=rig_worker.main,
                                args=(child, gpu, self.sock_path, factory),
                                daemon=True, name=f"commsim-rig-{index}")
        self.proc.start()
        child.close()
        self.pid = self._answer()

    def _answer(self) -> Any:
        from commsim.runtime import scheduler
        if scheduler.in_rank():
            # Let the other ranks run while this process's call blocks in the driver.
            while not self.conn.poll(0.0005):
                scheduler.sleep(0.001)
        try:
            status, value = self.conn.recv()
        except EOFError:
            self.proc.join(5)
            raise RuntimeError(f"rig worker pid {self.proc.pid} died (exit code "
                               f"{self.proc.exitcode}) during a call") from None
        if status == "raise":
            raise value
        return value

    def send(self, op: str, *args: Any) -> None:
        self.conn.send((op, args))

    def ask(self, op: str, *args: Any) -> Any:
        self.send(op, *args)
        return self._answer()

    def close(self) -> None:
        if self.proc.is_alive():
            try:
                self.ask("exit")
            except Exception:
                pass
            self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


class DriverProxy:
    """A Driver whose every call runs in the placement entry's process."""

    def __init__(self, worker: _Worker):
        self._w = worker

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_"):
            raise AttributeError(name)

        def call(*args: Any) -> Any:
            return self._w.ask("call", name, [handles.describe(a) for a in args])
        call.__name__ = name
        return call


def _mismatch(case: Any, real: Any, peers: Sequence[int]) -> list[str]:
    out = [f"{f}: case {getattr(case, f)!r}, here {getattr(real, f)!r}"
           for f in _COMPARED if getattr(case, f) != getattr(real, f)]
    if case.fabric_state == real.fabric_state == 3 and (case.fabric_status == 0) != (real.fabric_status == 0):
        out.append(f"fabric status: case {case.fabric_status}, here {real.fabric_status}")
    if any(case.fabric_uuid) != any(real.fabric_uuid):
        out.append(f"cluster UUID {'non-zero' if any(case.fabric_uuid) else 'zero'} in the "
                   f"case, {'non-zero' if any(real.fabric_uuid) else 'zero'} here")
    for j in peers:
        if j >= len(real.p2p):
            out.append(f"no GPU {j} here")
            continue
        for what in ("p2p", "nvlink"):
            if getattr(case, what)[j] != getattr(real, what)[j]:
                out.append(f"{what} to GPU {j}: case {getattr(case, what)[j]}, here "
                           f"{getattr(real, what)[j]}")
    return out


def _case_view(cluster: Cluster, placement: Placement) -> list[Any]:
    from commsim.discovery import probe
    from commsim.sim import SimFabric, spawn_driver

    fabric = SimFabric(cluster, seed=0)
    return [probe(spawn_driver(fabric, GpuRef(cluster.hosts[h].name, g)), 0) for h, g in placement]


_OPEN: "weakref.WeakSet[CudaRig]" = weakref.WeakSet()


class CudaRig:
    sim = False

    def __init__(self, cluster: Cluster, placement: Placement, seed: int = 0,
                 driver_factory: str = "device.driver:CudaDriver.create"):
        """`driver_factory` ("module:callable", called with the GPU ordinal in each worker)
        is for testing the rig itself without a GPU."""
        for old in list(_OPEN):   # one case at a time: the previous case's processes go
            old.close()
        hosts = sorted({h for h, _ in placement})
        if hosts != [0]:
            raise CaseNotRunnable(f"the case places processes on {len(hosts)} hosts "
                                  f"({', '.join(cluster.hosts[h].name for h in hosts)}); the "
                                  f"CUDA rig runs on this one host only")
        self.cluster, self.placement, self.seed = cluster, tuple(placement), seed
        ctx = multiprocessing.get_context("spawn")   # CUDA contexts do not survive fork
        self._dir = tempfile.mkdtemp(prefix="commsim-rig-")
        self._workers: list[_Worker] = []
        _OPEN.add(self)
        try:
            for i, (_, g) in enumerate(placement):
                self._workers.append(_Worker(ctx, g, self._dir, i, driver_factory))
            self._check_machine()
        except BaseException:
            self.close()
            raise
        self.drivers = [DriverProxy(w) for w in self._workers]

    def _check_machine(self) -> None:
        case = _case_view(self.cluster, self.placement)
        gpus = sorted({g for _, g in self.placement})
        diffs = []
        for i, (_, g) in enumerate(self.placement):
            real = self._workers[i].ask("discover")
            diffs += [f"GPU {g}: {d}" for d in _mismatch(case[i], real, [j for j in gpus if j != g])]
        if diffs:
            raise CaseNotRunnable(f"this machine is not {self.cluster.name} for this case: "
                                  + "; ".join(dict.fromkeys(diffs)))

    def close(self) -> None:
        for w in getattr(self, "_workers", []):
            w.close()
        self._workers = []
        _OPEN.discard(self)
        try:
            os.rmdir(self._dir)
        except OSError:
            pass

    def __getitem__(self, i: int) -> Any:
        return self.drivers[i]

    def __len__(self) -> int:
        return len(self.drivers)

    # ---- host <-> device bytes, device access ----------------------------------------------
    def write(self, i: int, ptr: int, data: Any) -> tuple:
        raw = bytes(data) if isinstance(data, (bytes, bytearray)) else data.tobytes()
        return self._workers[i].ask("write", ptr, raw)

    def read(self, i: int, ptr: int, nbytes: int) -> tuple:
        return self._workers[i].ask("read", ptr, nbytes)

    def kernel_read(self, i: int, ptr: int, nbytes: int) -> tuple:
        """A kernel load through process i's mapping. A fault answers 700 and, on hardware,
        leaves that process's context unusable (sticky error), which the simulator does not
        model; later calls of the same process then fail too."""
        return self._workers[i].ask("kernel_read", ptr, nbytes)

    def multimem_read(self, i: int, ptr: int, dtype: Any, count: int) -> tuple:
        _skip("per-device values behind a multicast address are not observable on hardware "
              "(a multimem load returns only their reduction)")
        return (None, None)

    # ---- processes ----------------------------------------------------------------------
    def pass_fd(self, src: int, fd: int, dst: int) -> int:
        """sendmsg(SCM_RIGHTS) from process src to process dst; the fd number in dst."""
        receiver = self._workers[dst]
        receiver.send("recv_fd")
        self._workers[src].ask("send_fd", receiver.sock_path, fd)
        return receiver._answer()

    def close_fd(self, i: int, fd: int) -> int:
        return self._workers[i].ask("call", "close_fd", [fd])

    def run_ranks(self, fn: Callable[[int], Any], seed: int = 0, n: int | None = None):
        from commsim.runtime.scheduler import Scheduler
        return Scheduler(seed).run_ranks(len(self._workers) if n is None else n, fn)

    def pid(self, i: int) -> int:
        return self._workers[i].pid

    # ---- simulator ground truth: not observable here ----------------------------------------
    def ledger(self, i: int) -> Any:
        _skip("the ledger is simulator ground truth; a CUDA process has none")

    def held(self, i: int) -> Any:
        return UNKNOWN

    @property
    def flags(self) -> list[str]:
        return []

    def flagged(self, row: str, i: int | None = None) -> bool:
        return True

    def flag_count(self, row: str | None = None) -> Any:
        return UNKNOWN

    def live_allocs(self) -> Any:
        return UNKNOWN

    def live_multicasts(self) -> Any:
        return UNKNOWN

    def exit_process(self, i: int) -> list[str]:
        _skip("process exit with residue is checked against the simulator's ledger")
        return []

    def assert_clean(self) -> None:
        return None
