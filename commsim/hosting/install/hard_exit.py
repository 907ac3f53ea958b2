"""os._exit inside commsim's own process, turned into an exception while commsim owes a verdict.

Code commsim runs in its own interpreter (an inproc rank's program, a policy file, a pytest
test under the plugin) may call os._exit. Unpatched, that ends commsim at once: no verdict, no
cleanup, and the exit status the code chose, often 0, so a run that hit an error reads as a
pass. While `exits_unwind()` is active, os._exit in this process's main thread raises
HardExit instead, a SystemExit carrying the status, which the caller accounts for (an inproc
rank: that rank exited with it; a policy: a named error). Unlike a real os._exit, `finally`
blocks of the caller run on the way out.

A process forked meanwhile (multiprocessing's fork start method ends its children with
os._exit) gets the real call back at once (a fork hook: hosting answers os.getpid with a
simulated pid, so the pid cannot tell). Another thread of this process cannot
unwind the main thread; it ends the process as os._exit would, but never with status 0 and
always saying why on stderr.
"""

from __future__ import annotations

import os
import posix
import sys
import threading
from contextlib import contextmanager
from typing import Iterator, NoReturn

from commsim.hosting.install.patches import Patches

_real_exit = posix._exit
_active: Patches | None = None       # the recorder holding os._exit while a block runs


class HardExit(SystemExit):
    """os._exit(code) was called while commsim owed a verdict."""

    def __str__(self) -> str:
        return f"os._exit({self.code})"


def _real_in_child() -> None:
    # no lock taken: another thread may have held the recorder's at the fork
    if _active is not None:
        for module in (os, posix):
            _active.switch(module, "_exit", _real_exit)


os.register_at_fork(after_in_child=_real_in_child)


def _exit(code: int) -> NoReturn:
    if not isinstance(code, int):
        _real_exit(code)        # TypeError, as the real call raises
    if threading.current_thread() is threading.main_thread():
        raise HardExit(code)
    sys.__stderr__.write(f"commsim: os._exit({code}) called in thread "
                         f"{threading.current_thread().name!r} of commsim's own process: it ends "
                         f"before any verdict; exit {code or 1}\n")
    sys.__stderr__.flush()
    _real_exit(code or 1)


@contextmanager
def exits_unwind() -> Iterator[None]:
    """While the block runs, os._exit (and posix._exit, the same function) raises HardExit in
    this process's main thread. Nested uses are harmless."""
    global _active
    if os._exit is not _real_exit:
        yield
        return
    _active = Patches()
    for module in (os, posix):
        _active.attr(module, "_exit", _exit)
    try:
        yield
    finally:
        _active.restore()
        _active = None
