"""Spawn the ranks of a scenario as real processes, watch them, gather their reports, clean up.

The launcher hosts the run's TCPStore. Ranks start from a forkserver that has already imported
commsim and torch, so a rank costs a fork rather than a 2 s interpreter start-up. While they
run, the launcher polls them: a rank that exits without a report (killed, crashed) is marked
dead in the store with where it last was, so its peers fail within POLL seconds naming it. At
the end, or on any failure, timeout, Ctrl-C, SIGTERM or SIGHUP: every child still alive is
killed and reaped, and the run's private shared-memory directory is removed. Should the launcher
itself be SIGKILLed, its ranks die with the forkserver (PR_SET_PDEATHSIG: worker.py) and the
next launch, or `commsim clean`, removes the directory.

Trust: the store listens on loopback only, and every pickle on it is
sealed with a per-run secret the ranks get in their start-up arguments (commsim.group.seal).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from commsim.group.seal import ForgedValue, Seal, new_secret
from commsim.group.torch_dist import DEFAULT_TIMEOUT, host_store, last_status, mark_dead
from commsim.errors import UserError
from commsim.policy import Policy
from commsim.util.signals import terminate_cleanly
from commsim.scenario.model import Scenario
from commsim.scenario.runner import RunResult, prepare
from commsim.sim import shm
from commsim.topology.model import Cluster, GpuRef
from commsim.procs import worker
from commsim.procs.faults import ProcFaults
from commsim.procs.reap import reap

_CTX: Any = None
IDLE_FACTOR = 2


def context() -> Any:
    """The forkserver context, preloaded with the rank body (and so torch) once per launcher."""
    global _CTX
    if _CTX is None:
        # The store's client logs a warning each time a bounded wait ends (the ranks wait in
        # POLL slices to notice dead peers); the forkserver inherits this before torch loads.
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        _CTX = multiprocessing.get_context("forkserver")
        _CTX.set_forkserver_preload(["commsim.procs.worker"])
    return _CTX


def _failed(report: Any) -> bool:
    if isinstance(report, tuple):
        return report[0] != "ok"
    return getattr(report, "error", None) is not None


def _exit_words(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code} without a report"


@dataclass
class Launched:
    reports: dict[int, Any]          # rank -> what it left under result/<rank>
    gone: dict[int, str]             # rank -> why it left no report
    pids: list[int]


def launch(n: int, target: Callable[[Any], None], make_job: Callable[[int, int, str, bytes], Any],
           *, timeout: float, absent: frozenset[int] = frozenset(),
           say: Callable[[str], None] = lambda text: None) -> Launched:
    """Run target(make_job(rank, store_port, shm_prefix, secret)) in one process per rank;
    each leaves its sealed report under result/<rank> in the store. Returns when every rank
    has ended, with the reports and, for ranks without one, why; nothing of the run is left
    behind, also when SIGTERM or SIGHUP ends it (Terminated propagates after the clean-up)."""
    with terminate_cleanly():
        return _launch(n, target, make_job, timeout=timeout, absent=absent, say=say)


def _launch(n: int, target: Callable[[Any], None], make_job: Callable[[int, int, str, bytes], Any],
            *, timeout: float, absent: frozenset[int],
            say: Callable[[str], None]) -> Launched:
    stale = shm.sweep_stale()
    if stale:
        say(f"removed {len(stale)} run director(ies) left in {shm.SHM_DIR} by launchers that "
            f"were killed: {' '.join(stale)}")
    secret = new_secret()
    seal = Seal(secret)
    ctx = context()
    store = host_store(timeout)
    prefix = shm.new_prefix()
    procs: dict[int, Any] = {}
    out = Launched({}, {}, [])
    reports, gone = out.reports, out.gone
    t0 = time.monotonic()
    try:
        for r in range(n):
            if r in absent:
                continue
            p = ctx.Process(target=target, args=(make_job(r, store.port, prefix, secret),),
                            name=f"commsim-rank{r}", daemon=True)
            try:
                p.start()
            except OSError as e:
                if "too long" not in str(e):
                    raise
                # The forkserver's AF_UNIX socket lives under TMPDIR: at most 108 bytes.
                raise UserError(f"--procs: cannot start the rank processes: {e} (the "
                                f"forkserver's socket goes under TMPDIR={tempfile.gettempdir()});"
                                f" set TMPDIR to a short directory such as /tmp") from None
            procs[r] = p
            out.pids.append(p.pid)
        say(f"started {len(procs)} rank process(es) in {time.monotonic() - t0:.2f} s "
            f"(pids {' '.join(str(p.pid) for p in procs.values())}; shared memory {shm.SHM_DIR / prefix}/*)")
        # Every wait ends within `timeout`, so a live run changes some rank's status (each
        # collective and spin wait writes it) well within that; a run whose ranks all stay
        # silent for IDLE_FACTOR timeouts plus start-up slack is ended by the launcher.
        idle_limit = IDLE_FACTOR * timeout + 30
        last_seen: dict[int, bytes] = {}
        last_change = t0
        next_look = t0
        straggle: float | None = None
        while True:
            alive = [r for r, p in procs.items() if p.exitcode is None]
            for r, p in procs.items():
                if p.exitcode is not None and r not in reports and r not in gone:
                    report = _report_of(store, seal, r)
                    if report is not None:
                        reports[r] = report
                        err = getattr(report, "error", None)
                        say(f"rank {r} finished{'' if err is None else ' with ' + err.name}")
                    else:
                        why = f"{_exit_words(p.exitcode)} {last_status(store, r, seal)}"
                        gone[r] = why
                        mark_dead(store, r, why, seal)
                        say(f"rank {r} {why}")
            if not alive:
                break
            now = time.monotonic()
            if now >= next_look:      # progress: any status that changed since the last look
                next_look = now + 0.5
                for r in alive:
                    key = f"status/{r}"
                    blob = store.get(key) if store.check([key]) else b""
                    if last_seen.get(r) != blob:
                        last_seen[r] = blob
                        last_change = now
            hard = last_change + idle_limit
            # Once a rank has failed, the ones still alive get one timeout to finish (their
            # own waits end by then); a rank that merely finished early starts no clock.
            if straggle is None and (gone or any(_failed(rep) for rep in reports.values())):
                straggle = now + timeout
            if now > hard or (straggle is not None and now > straggle):
                reason = (f"no rank progressed for {now - last_change:.0f} s" if now > hard
                          else "its peers had failed")
                reap([procs[r] for r in alive], 5)
                for r in alive:
                    why = (f"killed by the launcher after {now - t0:.1f} s ({reason}) "
                           f"{last_status(store, r, seal)}")
                    gone[r] = why
                    mark_dead(store, r, why, seal)
                    say(f"rank {r} {why}")
                break
            time.sleep(0.02)
    finally:
        reap(procs.values(), 10)
        removed = shm.sweep(prefix)
        if removed:
            say(f"removed {len(removed)} shared-memory segment(s) left by the run")
        del store
    for r in absent:
        gone[r] = "never started (fault: absent)"
    return out


def _report_of(store: Any, seal: Seal, rank: int) -> Any:
    """The rank's report, or None when it left none or the value is not the run's own (a
    forged value is never unpickled: commsim.group.seal)."""
    key = f"result/{rank}"
    if not store.check([key]):
        return None
    try:
        return seal.loads(key, store.get(key))
    except ForgedValue as e:
        print(f"commsim[procs]: {e}", file=sys.stderr)
        return None


def run_scenario_procs(sc: Scenario, policy: Policy | str | None = None, seed: int | None = None,
                       *, timeout: float | None = None, faults: ProcFaults | None = None,
                       progress: Callable[[str], None] | None = None,
                       join_timeout: float | None = None) -> RunResult:
    """Run `sc` with one OS process per rank. `timeout`: seconds any one wait may take (a
    collective, a kernel's flag); `join_timeout`: the rendezvous's bound (default: timeout,
    at least torch_dist.JOIN_MIN)."""
    timeout = DEFAULT_TIMEOUT if timeout is None else float(timeout)
    faults = faults or ProcFaults()
    faults.validate(sc.world_size)
    _, _, res = prepare(sc, policy, seed)
    n = sc.world_size
    run = launch(n, worker.main,
                 lambda r, port, prefix, secret: worker.Job(sc, r, policy, seed, prefix,
                                                            "127.0.0.1", port, timeout, faults,
                                                            join_timeout, secret),
                 timeout=timeout, absent=faults.absent, say=progress or (lambda text: None))
    res.pids = run.pids
    worker.gather(res, [run.reports.get(r) for r in range(n)],
                  lambda r: run.gone.get(r, "vanished"))
    return res


def run_ranks_procs(fn: Callable[[Any, Any], Any], cluster: Cluster,
                    placement: Sequence[GpuRef], *, seed: int = 0,
                    timeout: float = DEFAULT_TIMEOUT) -> list[tuple[str, Any]]:
    """fn(world_group, driver) in one process per placement entry (fn importable by name);
    per rank ("ok", value) or ("error", "Type: message") or ("died", why). The thread-mode
    twin is tests/procs/thread_twin.py run_ranks_threads."""
    run = launch(len(placement), worker.main_fn,
                 lambda r, port, prefix, secret: worker.FnJob(fn, cluster, tuple(placement),
                                                              seed, r, prefix, "127.0.0.1",
                                                              port, timeout, secret),
                 timeout=timeout)
    return [run.reports[r] if r in run.reports else ("died", run.gone.get(r, "vanished"))
            for r in range(len(placement))]


def print_progress(text: str) -> None:
    print(f"[procs] {text}", file=sys.stderr, flush=True)
