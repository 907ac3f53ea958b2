"""The body of one rank process (process mode).

It builds its own fabric from the scenario (ground truth from the scenario file, memory in
shared memory), joins the run's store, runs the rank exactly as thread mode does
(`commsim.scenario.runner.run_rank`), and leaves a plain-data report in the store. An error
it can report it reports, and it also marks itself dead so peers waiting on it stop at once
(as a peer's failure in thread mode interrupts them).
"""

from __future__ import annotations

import ctypes
import os
import signal
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from commsim.runtime.diagnosis import short_error
from commsim.group.torch_dist import ProcessWorld, connect_store
from commsim.scenario.model import Scenario
from commsim.scenario.runner import (Inputs, RankError, collect, faults_for, partial, judge, prepare, rank_error,
                               run_rank, spawn_rank)
from commsim.sim import set_torch_threads, spawn_driver
from commsim.sim.process_fabric import PID_BASE, ProcessFabric
from commsim.procs.faults import ProcFaults
from commsim.hosting.install.patches import Patches


PR_SET_PDEATHSIG = 1     # linux/prctl.h


def die_with_parent() -> None:
    """SIGKILL this rank when its parent (the launcher's forkserver, which exits with the
    launcher) dies, whatever killed the launcher: no rank outlives its run.
    Linux only; elsewhere the launcher's own clean-up is all there is."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:   # the parent died before the prctl took effect
        os._exit(1)
    # The launcher hands every child the write end of the forkserver's "alive" pipe, so that
    # the forkserver lives while any child does; with the launcher gone, a child stuck in a
    # wait would then keep the forkserver, and so itself, alive for good. A rank starts no
    # processes of its own: drop it, and the forkserver ends with the launcher.
    from multiprocessing import forkserver
    fd = getattr(forkserver._forkserver, "_forkserver_alive_fd", None)
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass
        # for the process's life: a recorder that is never restored
        Patches().attr(forkserver._forkserver, "_forkserver_alive_fd", None)


@dataclass
class Job:
    scenario: Scenario
    rank: int
    policy: Any
    seed: int | None
    prefix: str
    host: str
    port: int
    timeout: float
    faults: ProcFaults = field(default_factory=ProcFaults)
    join_timeout: float | None = None     # None: ProcessWorld.join's default
    secret: bytes = b""                   # the run's store secret (commsim.group.seal)


@dataclass
class RankReport:
    rank: int
    value: dict | None
    error: RankError | None
    leaks: list[str]
    flags: list[str]


def gather(res: Any, reports: "Sequence[RankReport | None]", why_missing: Callable[[int], str]) -> None:
    """Fold every rank's report into `res` (collect + judge); a rank without one failed with
    RankDied, saying `why_missing(rank)`."""
    values: list[dict | None] = []
    errors: list[RankError | None] = []
    for r, rep in enumerate(reports):
        if rep is not None:
            values.append(rep.value)
            errors.append(rep.error)
            res.leaks += rep.leaks
            res.flags += [f for f in rep.flags if f not in res.flags]
        else:
            values.append(None)
            errors.append(RankError(r, "process", "RankDied", f"rank {r} {why_missing(r)}", r))
    collect(res, values, errors)
    judge(res)


def run_job(job: Job, world: ProcessWorld) -> RankReport:
    """Run one rank over a joined-or-not world; never raises."""
    sc, rank = job.scenario, job.rank
    world.install_waiter()
    try:
        wg = world.join(job.join_timeout)
        seed, pol, _ = prepare(sc, job.policy, job.seed)
        fabric = ProcessFabric(sc.cluster, seed, rank, sc.placement, job.prefix, mailbox=world)
        driver = spawn_rank(fabric, sc, rank)
        assert driver.proc.pid == PID_BASE + rank
    except BaseException as e:
        e.commsim_step = "rendezvous"
        world.mark_dead(rank, f"failed at start-up with {short_error(e)}")
        return RankReport(rank, None, rank_error(rank, e), [], [])
    value, err = None, None
    try:
        value = run_rank(sc, pol, wg, driver, Inputs(seed))
    except BaseException as e:
        err = rank_error(rank, e)
        value = partial(e)
        world.mark_dead(rank, f"failed with {short_error(e)} at step {err.step}")
    leaks = [f"rank {rank}: {line}" for line in fabric.exit_process(driver.proc.pid)]
    return RankReport(rank, value, err, leaks, list(fabric.flags))


def main(job: Job) -> None:
    """Entry point of a rank process spawned by the launcher."""
    die_with_parent()
    set_torch_threads()
    store = connect_store(job.host, job.port, job.timeout, job.join_timeout)
    world = ProcessWorld(store, job.rank, job.scenario.world_size, secret=job.secret,
                         timeout=job.timeout, on_collective=job.faults.hook(job.rank),
                         shm_prefix=job.prefix)
    report = run_job(job, world)
    store.set(f"result/{job.rank}", world.seal.dumps(f"result/{job.rank}", report))
    world.finish()


@dataclass
class FnJob:
    """A plain rank function over (world group, driver): conformance-style checks of the
    driver and group across real processes (commsim.procs.launcher.run_ranks_procs)."""

    fn: Any
    cluster: Any
    placement: tuple
    seed: int
    rank: int
    prefix: str
    host: str
    port: int
    timeout: float
    secret: bytes = b""


def main_fn(job: FnJob) -> None:
    die_with_parent()
    set_torch_threads()
    store = connect_store(job.host, job.port, job.timeout)
    world = ProcessWorld(store, job.rank, len(job.placement), secret=job.secret,
                         timeout=job.timeout, shm_prefix=job.prefix)
    world.install_waiter()
    try:
        wg = world.join()
        fabric = ProcessFabric(job.cluster, job.seed, job.rank, job.placement, job.prefix,
                               mailbox=world)
        driver = spawn_driver(fabric, job.placement[job.rank])
        report: tuple = ("ok", job.fn(wg, driver))
        fabric.exit_process(driver.proc.pid)
    except BaseException as e:
        report = ("error", f"{type(e).__name__}: {e}")
        if os.environ.get("COMMSIM_PROCS_DEBUG"):
            traceback.print_exc()
        world.mark_dead(job.rank, f"failed with {short_error(e)}")
    store.set(f"result/{job.rank}", world.seal.dumps(f"result/{job.rank}", report))
    world.finish()
