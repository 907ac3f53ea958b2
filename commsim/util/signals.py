"""SIGTERM and SIGHUP as exceptions, so a run cleans up on them as on Ctrl-C; and cleanup
that a signal must not cut short.

`timeout`, CI cancellation and systemd end a process with SIGTERM (a closed terminal sends
SIGHUP); their default action ends Python without running a single `finally`, which would
leave rank processes and /dev/shm segments behind. A signal that arrives while a `finally`
is ending the run's processes would stop that cleanup half way (the exception is raised at
whatever line runs then), so the cleanup runs under `deferred`, and the signal is raised
once it is done.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator

SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived: unwind (every finally runs) and exit 128 + signal, as the
    signal's default action would have."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _raise(signum: int, frame: Any) -> None:
    raise Terminated(signum)


@contextmanager
def deferred() -> Iterator[None]:
    """While the block runs, SIGINT, SIGTERM and SIGHUP are noted instead of raised; after
    it, the first one noted is raised (KeyboardInterrupt or Terminated), unless the block is
    already ending with an exception of its own. Only the main thread can install handlers;
    elsewhere the block simply runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []

    def note(signum: int, frame: Any) -> None:
        noted.append(signum)

    old = {s: signal.signal(s, note) for s in (signal.SIGINT,) + SIGNALS}
    ok = False
    try:
        yield
        ok = True
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if ok and noted:
        if noted[0] == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated(noted[0])


@contextmanager
def terminate_cleanly() -> Iterator[None]:
    """While the block runs, SIGTERM and SIGHUP raise Terminated. Only the main thread can
    install handlers; elsewhere this does nothing. Nested uses are harmless."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, _raise) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
