"""How a hosted process (procs mode, or a process a rank spawned) waits on the driver.

A driver call that blocks until peers act (a multicast map or bind waits for every device of
the team to join, row M2) calls `commsim.runtime.scheduler.wait_until`. In a real process
no in-process scheduler can run the peers; they change the team table in shared memory
concurrently (commsim.sim.process_fabric). So the wait polls its predicate in real time,
backing off so that peers sharing the cores run, and gives up before the launcher's
`--timeout` kills the process, with a HangDetected naming what it waited for: the verdict
then says which call hung instead of a bare kill.
"""

from __future__ import annotations

import time
from typing import Callable

from commsim.runtime import scheduler
from commsim.runtime.diagnosis import HangDetected

MAX_BACKOFF = 2e-3     # seconds between polls at most: a join is seen within that


def give_up_at(started: float, timeout: float) -> float:
    """The monotonic time a wait ends: before the launcher's timeout, so the process itself
    says what it waited for (the same margin as the procs transport's waits)."""
    return started + timeout - min(3.0, 0.25 * timeout)


def real_time_waiter(deadline: float) -> Callable[[Callable[[], bool], str, float | None], None]:
    """A wait_until for a real process: poll until true, HangDetected at `deadline`
    (monotonic) or after the call's own timeout, whichever is first."""

    def wait(predicate: Callable[[], bool], what: str, timeout: float | None) -> None:
        start = time.monotonic()
        end = deadline if timeout is None else min(deadline, start + timeout)
        delay = 0.0
        while not predicate():
            now = time.monotonic()
            if now >= end:
                raise HangDetected(f"hang: {what}: still waiting after {now - start:.1f} s "
                                   f"(real time, process mode); the peers that would make it "
                                   f"true never did")
            time.sleep(delay)
            delay = min(max(delay * 2, 2e-5), MAX_BACKOFF)

    return wait


def install(timeout: float) -> None:
    """Make this process's driver waits real-time polls that end before `timeout` seconds
    from now (the run's --timeout)."""
    scheduler.set_process_wait(real_time_waiter(give_up_at(time.monotonic(), timeout)))
