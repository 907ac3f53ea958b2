"""The running hosted rank: who this process (or greenlet) is on the simulated machine.

Contract shared with the hosting core (/work/coord/HOSTING-INTERFACE.md): `current()` gives
the HostedRank of the running greenlet (walking up greenlet parents, so ranks started by the
group scheduler inside a bound block see it) or of the process; `bound(rank)` binds one.
Surfaces answer every call from `current().driver`.

This is the minimal version the module surfaces (cuda-python, libcudart, NVML, torch.cuda)
need for their own tests; the hosting core owns the full one.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

from greenlet import getcurrent

if TYPE_CHECKING:
    from ..driver import Driver
    from ..topology.model import Cluster, GpuRef


class NotHosted(RuntimeError):
    """Raised by current() outside a hosted rank."""


@dataclass
class CudaErrorEvent:
    api: str
    code: int
    name: str
    text: str
    site: str


@dataclass
class RankEvents:
    """Where surfaces report: the first CUDA error (with the user's call site) and notes."""

    first_error: CudaErrorEvent | None = None
    notes: list[str] = field(default_factory=list)

    def cuda_error(self, api: str, code: int, name: str, text: str) -> None:
        if self.first_error is None:
            from ..sim.ledger import call_site
            self.first_error = CudaErrorEvent(api, int(code), name, text, call_site(3))

    def note(self, text: str) -> None:
        self.notes.append(text)


@dataclass(eq=False)
class HostedRank:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    host: str
    driver: "Driver"
    cluster: "Cluster"
    visible: tuple["GpuRef", ...]
    shm_dir: str = ""
    events: RankEvents = field(default_factory=RankEvents)


_lock = threading.RLock()
_by_greenlet: "weakref.WeakKeyDictionary[Any, list[HostedRank]]" = weakref.WeakKeyDictionary()
_process: list[HostedRank] = []


def current() -> HostedRank:
    g = getcurrent()
    while g is not None:
        stack = _by_greenlet.get(g)
        if stack:
            return stack[-1]
        g = g.parent
    if _process:
        return _process[-1]
    raise NotHosted("not inside a hosted rank (commsim.hosting.session.bound)")


def maybe_current() -> HostedRank | None:
    try:
        return current()
    except NotHosted:
        return None


def set_process_rank(rank: HostedRank | None) -> None:
    """Procs mode: the rank of this whole process (every thread and greenlet of it)."""
    with _lock:
        _process.clear()
        if rank is not None:
            _process.append(rank)


@contextlib.contextmanager
def bound(rank: HostedRank, process: bool = False) -> Iterator[HostedRank]:
    """Bind `rank` for the running greenlet and the greenlets it starts, or (process=True)
    for every thread of the process."""
    g = getcurrent()
    with _lock:
        if process:
            _process.append(rank)
        else:
            _by_greenlet.setdefault(g, []).append(rank)
    try:
        yield rank
    finally:
        with _lock:
            if process:
                _process.remove(rank)
            else:
                stack = _by_greenlet.get(g)
                if stack:
                    stack.remove(rank)
                    if not stack:
                        del _by_greenlet[g]
