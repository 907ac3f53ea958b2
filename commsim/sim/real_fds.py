"""POSIX-fd shareable handles as real OS file descriptors.

`cuMemExportToShareableHandle(..., CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)` returns an fd
the program owns (cuda.h: "a file descriptor ... the application must close it"). Here it is
a real one: a memfd holding a sealed token that names the allocation or multicast object in
the run (the fabric's own handle seal, so process mode resolves it against shared memory).
Being real, it passes over Unix sockets (SCM_RIGHTS) and through pidfd_getfd, os.close
closes it, and the OS closes it at exit.

An open fd keeps the memory alive until closed. The program closes fds
behind our back, so the table notices lazily: before every fd operation of its process and
at process exit, an fd whose number no longer refers to the same open file (inode) is
treated as closed, its ledger item dropped and its reference released.

Import of an fd this process did not export (one received over a socket, or taken with
pidfd_getfd) reads the token and adopts the descriptor: from then on the process holds it,
as the receiver of SCM_RIGHTS does. A descriptor that names memory of another simulated
host cannot exist on real hardware (an fd never leaves its host); it is
refused and flagged.

In-process ranks (inproc mode) share one OS fd table. So that a number one simulated
process holds is never confused with one another received over a socket, exported fds live
high in the table (F_DUPFD from half the fd limit), while the kernel gives received ones the
lowest free number: an import of a number another simulated process still holds was never
passed (row X4), as on hardware where the number means nothing in the importer.
"""

from __future__ import annotations

import fcntl
import os
import resource
import weakref
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    from commsim.sim.driver import SimDriver

MAGIC = b"commsim posix-fd handle v1\n"
TOKEN = 64


def _identity(fd: int) -> tuple[int, int] | None:
    try:
        st = os.fstat(fd)
    except (OSError, OverflowError, ValueError):     # not open, or no fd number at all
        return None
    return st.st_dev, st.st_ino


def _close_all(entries: dict[int, tuple[Any, tuple[int, int]]]) -> None:
    for fd, (_, ident) in list(entries.items()):
        if _identity(fd) == ident:
            os.close(fd)
    entries.clear()


class FdTable:
    """The POSIX-fd handles one simulated process holds: fd -> ("mem"|"mc", id)."""

    def __init__(self, driver: "SimDriver"):
        self._driver = weakref.ref(driver)
        self._entries: dict[int, tuple[tuple[str, int], tuple[int, int]]] = {}
        self._key = (id(driver.fabric), driver.proc.pid)
        self._armed = False

    def _hold(self, fabric: Any) -> None:
        """The table takes an fd: reaps of `fabric` visit it from now on. At the first one it
        joins the tables other processes ask (`_held_by`) and gets its finalizer: a table that
        never held an fd answers like an absent one (most processes of a run hold none, and a
        finalizer per process was a tenth of spawning a driver)."""
        held = _holding.get(fabric)
        if held is None:            # (setdefault would build a WeakSet at every fd)
            held = _holding[fabric] = weakref.WeakSet()
        held.add(self)
        if self._armed:
            return
        self._armed = True
        _tables[self._key] = self
        # Whatever the owner never closed is closed when the table goes (a dropped driver
        # must not leak descriptors into the test process).
        # Not at interpreter exit: the OS closes them then, and the exit report (run from
        # atexit, maybe after this finalizer's own atexit hook) must still see the table to
        # tell an fd the program closed itself from one it leaked.
        weakref.finalize(self, _close_all, self._entries).atexit = False

    # -- the dict surface the driver uses --------------------------------------------------
    def __iter__(self) -> Iterator[int]:
        return iter(list(self._entries))

    def __contains__(self, fd: object) -> bool:
        return fd in self._entries

    def get(self, fd: int, default: Any = None) -> tuple[str, int] | Any:
        self.reap()
        ent = self._entries.get(fd)
        return ent[0] if ent is not None else default

    def pop(self, fd: int, default: Any = None) -> tuple[str, int] | Any:
        """Close `fd` (if still ours) and forget it; its target, or `default`."""
        ent = self._entries.pop(fd, None)
        if ent is None:
            return default
        if _identity(fd) == ent[1]:
            os.close(fd)
        return ent[0]

    # -- real descriptors --------------------------------------------------------------------
    def open(self, target: tuple[str, int]) -> int:
        """A new fd naming `target`, owned by this process."""
        self.reap()
        drv = self._driver()
        token = drv.fabric.fabric_handle_for(*target)
        fd = _high(os.memfd_create(f"commsim-{target[0]}{target[1]}", os.MFD_CLOEXEC))
        os.write(fd, MAGIC + token)
        self._entries[fd] = (target, _identity(fd))
        self._hold(drv.fabric)
        return fd

    def reap(self) -> None:
        """Drop what the program closed itself: ledger item and reference go."""
        drv = self._driver()
        for fd, (target, ident) in list(self._entries.items()):
            if _identity(fd) != ident:
                del self._entries[fd]
                if drv is not None:
                    drv.ledger.remove("exported_fd", fd, all_refs=True)
                    drv._unref_target(target)

    def for_import(self, fd: Any) -> tuple[str, int] | None:
        """The target an import of `fd` names, adopting a descriptor received from
        elsewhere; None when `fd` is no handle this process may use."""
        self.reap()
        try:
            fd = int(fd)
        except (TypeError, ValueError):
            return None
        ent = self._entries.get(fd)
        if ent is not None:
            return ent[0]
        drv = self._driver()
        ident = _identity(fd)
        if ident is None or drv is None:
            return None
        try:
            data = os.pread(fd, len(MAGIC) + TOKEN, 0)
        except OSError:
            return None
        if not data.startswith(MAGIC):
            return None
        for other in drv.fabric.processes.values():
            if other.pid != drv.proc.pid and _held_by(drv.fabric, other.pid, fd, ident):
                return None          # another simulated process's number, never passed here
        target = drv.fabric.resolve_fabric_handle(data[len(MAGIC):])
        if target is None:
            return None
        host = _host_of(drv, target)
        if host is not None and host != drv.proc.host:
            drv.fabric.flag(f"pid {drv.proc.pid}: a POSIX fd of host {host} reached host "
                            f"{drv.proc.host}; fds never leave their host (row V9)")
            return None
        self._entries[fd] = (target, ident)
        self._hold(drv.fabric)
        obj = drv._obj(target)
        obj.refs += 1                 # the received descriptor keeps the memory alive
        drv.ledger.add("exported_fd", fd, "POSIX fd {} received for {} {}", fd, target[0], target[1])
        return target


def contents(fd: int) -> bytes:
    """What an exported descriptor holds (its magic and token): for a process that hands it
    to another OS process by other means than SCM_RIGHTS (hosted symm_mem in procs mode),
    the bytes `from_contents` turns back into a descriptor there."""
    return os.pread(fd, len(MAGIC) + TOKEN, 0)


def from_contents(data: bytes) -> int:
    """A new descriptor in this OS process holding `data` (from `contents` in another): what
    SCM_RIGHTS delivers, a descriptor naming the same memory, at the lowest free number as
    the kernel gives a received one. The import adopts it (FdTable.for_import); the caller
    owns it and closes it."""
    if not data.startswith(MAGIC):
        raise ValueError("not the contents of a commsim POSIX-fd handle")
    fd = os.memfd_create("commsim-received", os.MFD_CLOEXEC)
    os.write(fd, data)
    return fd


_tables: "weakref.WeakValueDictionary[tuple[int, int], FdTable]" = weakref.WeakValueDictionary()
# Per fabric, the tables that held an fd since they were last reaped empty, so a memory query
# reaps those only: a walk over every table of the interpreter made each query O(all drivers
# ever made), and one over every process of the fabric O(ranks), quadratic over a 576-rank
# run where no process holds an fd. Keyed by the fabric itself, not id(), so a new fabric at
# a freed fabric's address never inherits its tables.
_holding: "weakref.WeakKeyDictionary[Any, weakref.WeakSet[FdTable]]" = weakref.WeakKeyDictionary()


def table_for(driver: "SimDriver") -> FdTable:
    """The fd table of `driver`'s process (registered for other processes' lookups once it
    holds an fd, FdTable._hold)."""
    return FdTable(driver)


def _held_by(fabric: Any, pid: int, fd: int, ident: tuple[int, int]) -> bool:
    t = _tables.get((id(fabric), pid))
    drv = t._driver() if t is not None else None
    if t is None or (drv is not None and drv.fabric is not fabric):
        # No table holds an fd for that process (or only one of a collected fabric that
        # had the same id: a table registers when it first holds an fd, FdTable._hold).
        return False
    t.reap()
    ent = t._entries.get(fd)
    return ent is not None and ent[1] == ident


_BASE: list[int] = []      # the upper half's start, read once per process


def _high(fd: int) -> int:
    """Move a new descriptor to the upper half of the fd table (see the module doc). The
    limit is read once: should a program lower it below the half read, F_DUPFD refuses and
    the descriptor keeps its number; one raised later leaves the half read still valid."""
    if not _BASE:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        _BASE.append(max(64, min(soft, 1 << 20) // 2))
    base = _BASE[0]
    try:
        high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, base)
    except OSError:
        return fd                     # table full up there: keep the number we have
    os.close(fd)
    return high


def _host_of(drv: "SimDriver", target: tuple[str, int]) -> str | None:
    kind, oid = target
    if kind == "mem":
        a = drv.fabric.allocs.get(oid)
        return a.gpu.host if a is not None else None
    m = drv.fabric.multicasts.get(oid)
    return m.creator.host if m is not None else None


def reap_fabric(fabric: Any) -> None:
    """Drop what any process of `fabric` living in this interpreter closed itself, so memory
    counts see a closed fd's release at once, as the hardware does (the last
    reference going frees the memory). In process mode another OS process reaps its own."""
    held = _holding.get(fabric)
    for t in list(held or ()):
        t.reap()
        if not t._entries:
            held.discard(t)


def reap_at_exit(driver: "SimDriver") -> None:
    t = driver._fds
    if isinstance(t, FdTable):
        t.reap()
