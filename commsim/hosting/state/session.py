"""The hosted rank: who the running code is on the simulated machine.

Every hosting surface (identity, torch.distributed, cuda.bindings, libcudart, pynvml,
torch.cuda) answers from `current()`, so one rank's view is consistent across all of them.
In `inproc` mode many ranks share one interpreter as greenlets: `bound(rank)` binds a rank to
the running greenlet and `current()` walks up greenlet parents, so code a rank's greenlet
starts sees that rank. In `procs` mode the bootstrap binds the process's rank on the main
greenlet, which every greenlet of the process reaches as its root.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import traceback
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterator

from greenlet import getcurrent

__all__ = ["NotHosted", "HostedRank", "RankEvents", "CudaErrorRecord", "current", "bound",
           "hosted", "user_site"]


class NotHosted(RuntimeError):
    """Raised by `current()` where no hosted rank is bound (outside `commsim exec` & co)."""


# Frames inside these directories are commsim's or the Python machinery's, never the
# user's: a call site is the first frame outside them.
_COMMSIM_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_MACHINERY = ("<frozen ", os.sep + "ctypes" + os.sep, os.sep + "runpy.py",
              os.sep + "importlib" + os.sep, os.sep + "greenlet" + os.sep,
              os.sep + "cuda" + os.sep + "bindings" + os.sep)


def user_site(depth: int = 1, frames: int = 3, skip: str = _COMMSIM_DIR) -> str:
    """The innermost frames outside commsim's hosting (`skip`) and the import/ctypes
    machinery, innermost first ("prog.py:57 in cudaIpcOpenMemHandle <- prog.py:90 in
    create_shared_buffer")."""
    f: Any = sys._getframe(depth)
    out: list[str] = []
    while f is not None and len(out) < frames:
        fn = f.f_code.co_filename
        if not fn.startswith(skip) and not any(m in fn for m in _MACHINERY):
            out.append(f"{os.path.basename(fn)}:{f.f_lineno} in {f.f_code.co_name}")
        f = f.f_back
    return " <- ".join(out) or "<unknown>"


def program_site() -> str:
    """Where the hosted program is (its frames outside all of commsim): an event the simulator
    flags deep in a simulated kernel or copy is told by the program's line that led to it."""
    return user_site(2, skip=os.path.dirname(_COMMSIM_DIR.rstrip(os.sep)) + os.sep)


@dataclass
class CudaErrorRecord:
    api: str
    code: int
    name: str
    text: str
    site: str
    rule: str | None = None     # the simulator's rule row that refused the call (L8, L10 ...)
    peer: str | None = None     # "host/gpuN" of the memory the call named

    def __str__(self) -> str:
        return f"{self.api} -> {self.name} ({self.code}): {self.text} at {self.site}"


@dataclass
class RankEvents:
    """Where surfaces report what the verdict shows: the first CUDA error (with the user's
    call site) and free-form notes."""

    first_cuda_error: CudaErrorRecord | None = None
    cuda_errors: int = 0
    notes: list[str] = field(default_factory=list)

    def cuda_error(self, api: str, code: int, name: str, text: str, site: str | None = None,
                   why: Any = None) -> None:
        """`why`: the driver's refusal behind the code (SimDriver.refusal: rule row, peer GPU)."""
        self.cuda_errors += 1
        if self.first_cuda_error is None:
            self.first_cuda_error = CudaErrorRecord(api, int(code), name, text,
                                                    site or user_site(2),
                                                    getattr(why, "rule", None),
                                                    getattr(why, "peer", None))

    def note(self, text: str) -> None:
        self.notes.append(text)


@dataclass(eq=False)
class HostedRank:
    rank: int                  # global rank (RANK)
    world_size: int            # WORLD_SIZE
    local_rank: int            # LOCAL_RANK
    local_world_size: int      # LOCAL_WORLD_SIZE
    host: str                  # simulated host name as in the topology; the hostname seen
    driver: Any                # this process's Driver (commsim.driver.Driver protocol)
    cluster: Any               # the topology (ground truth; surfaces read only what NVML/sysfs would)
    visible: tuple             # GPUs this process sees, CUDA ordinal i -> visible[i]
    shm_dir: str               # private directory standing in for this host's /dev/shm
    events: RankEvents = field(default_factory=RankEvents)
    # -- what the launcher and the surfaces keep besides the launcher's environment --
    mode: str = "procs"        # "procs" | "inproc"
    pid: int = 0               # the pid the process observes (simulated in inproc mode)
    env: dict | None = None    # inproc: this rank's os.environ view
    world: Any = None          # inproc: the commsim.group.local.LocalWorld of the run
    slot: int = 0              # this process's index in the run (ranks first, spawned workers after)
    state: dict = field(default_factory=dict)   # per-rank state a surface keeps (by its name)
    # The host GPU indices of this process's container (its device cgroup), which NVML
    # enumerates (row W3, sim/visibility.py); None: every GPU of the host.
    container: tuple | None = None

    @property
    def group_rank(self) -> int:
        """GROUP_RANK as torchrun sets it: the index of this rank's host."""
        return self.rank // max(self.local_world_size, 1)


_lock = threading.Lock()
_bound: "weakref.WeakKeyDictionary[Any, list[HostedRank]]" = weakref.WeakKeyDictionary()
_process_rank: HostedRank | None = None


def hosted() -> HostedRank | None:
    """The running code's rank, or None when it is not hosted."""
    g = getcurrent()
    while g is not None:
        stack = _bound.get(g)
        if stack:
            return stack[-1]
        g = g.parent
    return _process_rank


def current() -> HostedRank:
    """The rank of the running greenlet (inproc) or of the process (procs)."""
    r = hosted()
    if r is None:
        raise NotHosted("commsim hosting: no hosted rank here (run the program under "
                        "`commsim exec`, the pytest plugin or `sweep --exec`)")
    return r


def set_process_rank(rank: HostedRank | None) -> None:
    """Procs mode: the rank of this whole process (every greenlet of it)."""
    global _process_rank
    _process_rank = rank


def hosted_process() -> HostedRank | None:
    return _process_rank


@contextlib.contextmanager
def bound(rank: HostedRank) -> Iterator[HostedRank]:
    """Bind `rank` for the running greenlet and the greenlets it starts."""
    g = getcurrent()
    with _lock:
        _bound.setdefault(g, []).append(rank)
    try:
        yield rank
    finally:
        with _lock:
            stack = _bound.get(g)
            if stack:
                stack.remove(rank)
                if not stack:
                    del _bound[g]


def exception_line(tp: Any, value: BaseException) -> str:
    """The one line a verdict names an exception by: "Type: first line of the message".
    A SyntaxError's source lines come before that line and notes after it; a multi-line
    message (torch's CUDA errors add hints below the error) is named by its first line."""
    entries = traceback.format_exception_only(tp, value)
    head = next((e for e in entries if e.strip() and not e.startswith((" ", "\t"))), entries[-1])
    return head.strip().splitlines()[0]
