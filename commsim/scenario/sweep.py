"""Sweeps: run many generated scenarios, judge each against the oracle, report.

    ids = select_ids(count=1000, seed=0)                   # sampler ids s0-0 ... s0-999
    rep = run_sweep(ids, jobs=2)                          # worker processes (`_context`)
    print(rep.summary()); rep.write_json("out.json")   # HTML: commsim.report.sweep_map

A scenario's record carries its id; `commsim replay <id>` rebuilds it from the id alone.
Worker processes may or may not see monkeypatches of the parent (they are forked from it or
from a forkserver, `_context`): run with `jobs=1` to test a planted defect (the work then runs
in this process).
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import sys
import time
import traceback
from collections import Counter
from typing import Any, Callable, Iterable, TextIO

from commsim.errors import UserError
from commsim.scenario import generate as G
from commsim.scenario import knobs as K
from commsim.scenario.executors import replay_command, run_ray
from commsim.scenario.oracle import judge
from commsim.scenario.seeds import seed_of
from commsim.scenario.sweep_report import Report

# Version fields a command line pins over every generated scenario's draw: (field, text)
# pairs, picklable for worker processes (commsim/versions.py).
VersionPins = tuple[tuple[str, str], ...]

DETERMINISM_EVERY = 20          # 1 in 20 scenarios is run twice (by id, so reproducible)


# -- which scenarios ---------------------------------------------------------------------------
def check_filters(filters: Iterable[str]) -> list[str]:
    """Each filter must be a substring of some word a scenario can be tagged with."""
    vocab = G.vocabulary()
    words = [w for ws in vocab.values() for w in ws]
    out = []
    for f in filters:
        f = f.strip()
        if not f:
            raise UserError("--filter: empty substring; give part of a machine shape, layout, "
                            "placement, op, dtype or fault kind, e.g. --filter gb200 --filter oom")
        if not (any(f in w for w in words) or G._ID.match(f) or (f[0] in "sek" and f[1:2].isdigit())):
            listing = "; ".join(f"{k}: {', '.join(v)}" for k, v in vocab.items())
            raise UserError(f"--filter {f!r} matches no machine shape, layout, placement, op, dtype, "
                            f"fault or mode a generated scenario can have. Known words — {listing}")
        out.append(f)
    return out


def select_ids(count: int, seed: int = 0, filters: Iterable[str] = (), enumerate_: bool = False,
               start: int = 0, max_scan: int | None = None, knobs: bool = True) -> list[str]:
    """The first `count` ids (sampler with `seed`, or the enumeration) whose tags contain
    every filter substring."""
    if count < 0:
        raise UserError(f"--count must be >= 0, got {count}")
    filters = check_filters(filters)
    # About one sampler id in KNOB_EVERY is its shortcut-policy knob twin k<seed>-<index>
    # (commsim/scenario/knobs.py); the s ids that stay are unchanged. `knobs=False` (a sweep
    # of a user's program, whose own code decides such things) keeps every s id.
    ident = (lambda i: f"e{i}") if enumerate_ else (
        lambda i: f"{'k' if knobs and K.is_knob_id(seed, i) else 's'}{seed}-{i}")
    plan = lambda i: G.plan_from_id(ident(i))
    if not filters:
        return [ident(i) for i in range(start, start + count)]
    scan = max_scan if max_scan is not None else max(2000, count * 400)
    out, i = [], start
    while len(out) < count and i < start + scan:
        p = plan(i)
        tags = G.plan_tags(p)
        if all(f in tags for f in filters):
            out.append(p.id)
        i += 1
    if len(out) < count:
        raise UserError(f"--filter {' '.join(filters)}: only {len(out)} of the first {scan} generated "
                        f"scenarios match; loosen the filter or lower --count")
    return out


# -- one scenario ---------------------------------------------------------------------------------
def wants_determinism(sid: str, mode: str) -> bool:
    if mode == "all":
        return True
    if mode == "none":
        return False
    return seed_of("determinism", sid) % DETERMINISM_EVERY == 0


def run_one(sid: str, determinism: str = "sample", versions: VersionPins = ()) -> dict:
    """Regenerate, run, judge. Returns a small picklable record. `versions`: the version
    fields a command line pins over the generator's draw ((field, text) pairs)."""
    from commsim.scenario.runner import run_scenario
    from commsim.versions import pinned

    t0 = time.perf_counter()
    sc = pinned(G.scenario_from_id(sid), dict(versions))
    ex = sc.extra
    rec: dict[str, Any] = {"id": sid, "shape": ex["shape"], "layout": ex["layout"],
                           "placement": ex["placement"], "description": sc.description,
                           "world": sc.world_size}
    try:
        res = run_scenario(sc)
        again = run_scenario(sc) if wants_determinism(sid, determinism) else None
        v = judge(sc, res, again)
        rec.update(ok=v.ok, kinds=list(v.kinds),
                   failures=[{"kind": f.kind, "detail": f.detail} for f in v.failures],
                   notes=v.notes, checked_determinism=v.checked_determinism,
                   backends=dict(Counter(res.backends.values())))
    except Exception as e:   # the harness itself broke: report it, never hide it
        rec.update(ok=False, kinds=["cuda-error"], notes=[], checked_determinism=False, backends={},
                   failures=[{"kind": "cuda-error",
                              "detail": f"run_scenario raised {type(e).__name__}: {e}\n"
                                        + traceback.format_exc(limit=6)}])
    rec["seconds"] = time.perf_counter() - t0
    rec["replay"] = replay_command(sid, dict(versions))
    return rec


# Set in worker processes: the file (a descriptor) where each notes the id it is running.
_PROGRESS_FD: int | None = None

SWEEP_GC_THRESHOLD = (10_000, 10, 10)     # gc.set_threshold of a scenario-running process


def settle_heap(collect: bool = True) -> None:
    """Take what exists now out of the cyclic collector's reach (gc.freeze), after collecting
    what is already garbage. For a process that does nothing but run scenarios (a sweep worker,
    the CLI): the imported modules, torch's above all, are most of its heap, and every full
    collection walked them again: 1.9 ms of collector time per generated scenario, 0.6 ms
    after this (measured with gc.callbacks over 200 scenarios).

    The youngest generation is collected every SWEEP_GC_THRESHOLD[0] net allocations instead
    of Python's 700: a scenario allocates tens of thousands of short-lived objects (driver
    answers, tensors, greenlet frames), so the default ran a young collection every few
    dozen driver calls, each finding little; 10,000 cut the CPU per scenario by about a tenth
    (in-process A/B, benchmarks/sweep_rate.py). Garbage in cycles lives a fraction of a
    scenario longer; nothing a scenario reports depends on when it goes (the sweep digest is
    unchanged)."""
    import gc
    if collect:
        gc.collect()
    gc.freeze()
    gc.set_threshold(*SWEEP_GC_THRESHOLD)


def _worker_init(progress_dir: str) -> None:
    global _PROGRESS_FD
    # One file per worker, opened once: noting an id is then one pwrite, not an open, a write
    # and a close per scenario.
    _PROGRESS_FD = os.open(os.path.join(progress_dir, str(os.getpid())),
                           os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    settle_heap(collect=False)   # a worker forked from a clean process: little garbage, 0.1 s to find


def _note_running(sid: str) -> None:
    """So the parent learns which id a dead worker was running: the id and a newline from
    the file's start (the reader takes the first line; a longer id's tail may follow it)."""
    if _PROGRESS_FD is not None:
        os.pwrite(_PROGRESS_FD, f"{sid}\n".encode(), 0)


def _run_chunk(args: tuple) -> list[dict]:
    ids, det, crash, versions = args
    out = []
    for sid in ids:
        _note_running(sid)
        if sid in crash:        # harness self-test: die as a native crash does, or stop as a deadlock
            os.kill(os.getpid(), crash[sid])
        out.append(run_one(sid, det, versions))
    _note_running("")                   # idle between chunks: not stuck, however long
    return out


def crash_record(sid: str, why: str, versions: VersionPins = ()) -> dict:
    """The record of a scenario whose process died (a segfault, say): nothing came back."""
    try:
        sc = G.scenario_from_id(sid)
        ex = sc.extra
        base = {"shape": ex["shape"], "layout": ex["layout"], "placement": ex["placement"],
                "description": sc.description, "world": sc.world_size}
    except Exception as e:       # pragma: no cover - the id came from select_ids
        base = {"shape": "?", "layout": "?", "placement": "?", "description": str(e), "world": 0}
    return {"id": sid, **base, "ok": False, "kinds": ["cuda-error"], "notes": [],
            "checked_determinism": False, "backends": {}, "seconds": 0.0,
            "failures": [{"kind": "cuda-error", "detail": why}],
            "replay": replay_command(sid, dict(versions))}


# -- progress ---------------------------------------------------------------------------------------
class Progress:
    """A bar on a TTY; otherwise (a CI log) a line every `every_s` seconds or every `every_n`
    done, and at the end. Both carry the rate and the time left at that rate (ETA)."""

    def __init__(self, total: int, stream: TextIO | None = None, tty: bool | None = None,
                 every_s: float = 10.0, every_n: int = 0, what: str = "sweep",
                 unit: str = "scenarios", failed: str = "failed"):
        self.total, self.stream = total, stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.every_s, self.every_n = every_s, every_n
        self.what, self.unit, self.failed = what, unit, failed
        self.t0 = self.last = time.perf_counter()
        self.done = self.fails = 0

    def update(self, done: int, fails: int) -> None:
        self.done, self.fails = done, fails
        now = time.perf_counter()
        el = now - self.t0
        rate = done / el if el > 0 else 0.0
        eta = (self.total - done) / rate if rate > 0 else 0.0
        if self.tty:
            w = 30
            fill = int(w * done / max(self.total, 1))
            self.stream.write(f"\r[{'#' * fill}{'.' * (w - fill)}] {done}/{self.total} "
                              f"{rate:.0f}/s ETA {eta:.0f}s {self.failed} {fails} ")
            self.stream.flush()
            return
        due = (done % self.every_n == 0) if self.every_n else now - self.last >= self.every_s
        if due or done == self.total:
            self.last = now
            left = "done" if done == self.total else f"ETA {eta:.0f}s"
            self.stream.write(f"{self.what}: {done}/{self.total} {self.unit}, {rate:.1f}/s, "
                              f"{fails} {self.failed}, {el:.0f}s elapsed, {left}\n")
            self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


# -- the sweep ---------------------------------------------------------------------------------------
def _chunks(ids: list[str], jobs: int) -> list[list[str]]:
    size = max(4, min(50, len(ids) // (jobs * 8) or 1))
    return [ids[i:i + size] for i in range(0, len(ids), size)]


def _os_threads() -> int:
    """This process's OS threads (Linux: /proc/self/task), or 0 where that is unknown."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


# The threads a process has once it has imported this module: the main one plus what the
# imports start (numpy's BLAS pool starts at import; torch's intra-op pool does not, it starts
# on a first parallel op). A forkserver that preloads the runner forks its workers with these.
_IMPORT_THREADS = _os_threads()


def _context() -> mp.context.BaseContext:
    """How worker processes start. A fork copies only the forking thread: a thread pool of
    torch's (OpenMP) would be missing in the child with its state copied, and its first use
    there could hang. So workers come from a clean process: this one, forked, while it has
    no thread besides those its imports started (then it is in the state a forkserver
    preloading the runner forks from, and its workers start at once instead of after the
    server imported torch again, 1.5-2 s of a sweep's wall time measured on the 2-core
    machine); else a forkserver that imported commsim (and torch) once."""
    import threading
    # Imported before the threads are counted: an import that starts a thread must count.
    from commsim.scenario import runner  # noqa: F401  (imported once, here, not again in every worker)
    methods = mp.get_all_start_methods()
    if ("fork" in methods and _IMPORT_THREADS and threading.active_count() == 1
            and _os_threads() == _IMPORT_THREADS):
        return mp.get_context("fork")
    if "forkserver" in methods:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["commsim.scenario.runner", "commsim.scenario.sweep"])
        return ctx
    return mp.get_context("spawn")


STUCK_AFTER = 300.0      # seconds one scenario may run in a worker before it counts as stuck
_POLL_S = 1.0


def _kill_workers(ex: Any) -> None:
    """End an executor's worker processes now: on SIGTERM, Ctrl-C or a stuck worker, the
    executor's own shutdown would wait for every running chunk, for ever if one is stuck."""
    procs = list((getattr(ex, "_processes", None) or {}).values())
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(5)
    ex.shutdown(wait=False, cancel_futures=True)


def _stuck(progress_dir: str, ex: Any, limit: float) -> list[str]:
    """Kill each worker whose current scenario has run longer than `limit` (its progress file,
    rewritten as each scenario starts, is that old and names it); the ids killed."""
    out = []
    now = time.time()
    for pid, p in list((getattr(ex, "_processes", None) or {}).items()):
        path = os.path.join(progress_dir, str(pid))
        try:
            with open(path) as fh:
                sid = fh.readline().strip()
            age = now - os.stat(path).st_mtime
        except OSError:
            continue
        if sid and age > limit and p.is_alive():
            sys.stderr.write(f"sweep: worker pid {pid} has run {sid} for {age:.0f} s: stuck, killed; "
                             f"`{replay_command(sid)}` reproduces it in the foreground\n")
            p.kill()
            out.append(sid)
    return out


def _run_pool(ids: list[str], jobs: int, determinism: str, take: Callable[[dict], None],
              crash: dict[str, int] | None = None, stuck_after: float = STUCK_AFTER,
              versions: VersionPins = ()) -> None:
    """Chunks over `jobs` worker processes. A worker that dies (a segfault in native code) or
    is stuck (one scenario longer than `stuck_after`: killed, and named) breaks the pool: the
    ids the workers were running are re-run one at a time in a one-worker pool, those that
    kill it again, or stick again, are recorded as crashes, and the rest of the work continues
    in a fresh pool. Any exception here (SIGTERM's Terminated, Ctrl-C) kills the workers
    before it goes on up, so the sweep ends at once."""
    import tempfile
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures import TimeoutError as FutureTimeout
    from concurrent.futures.process import BrokenProcessPool

    crash = crash or {}
    todo = list(ids)
    with tempfile.TemporaryDirectory(prefix="commsim-sweep-") as tmp:
        while todo:
            chunks = _chunks(todo, jobs)
            done: set[str] = set()
            broken = False
            stuck: list[str] = []
            # Chosen again for every pool: the state of this process when it forks is what counts.
            with ProcessPoolExecutor(jobs, mp_context=_context(), initializer=_worker_init,
                                     initargs=(tmp,)) as ex:
                try:
                    pending = {ex.submit(_run_chunk, (c, determinism, crash, versions)) for c in chunks}
                    while pending:
                        finished, pending = wait(pending, timeout=_POLL_S, return_when=FIRST_COMPLETED)
                        for f in finished:
                            for rec in f.result():
                                done.add(rec["id"])
                                take(rec)
                        if not finished:
                            stuck += _stuck(tmp, ex, stuck_after)
                except BrokenProcessPool:
                    broken = True
                except BaseException:
                    _kill_workers(ex)
                    raise
            if not broken:
                return
            rest = [s for s in todo if s not in done]
            running = set(stuck)
            for name in os.listdir(tmp):
                with open(os.path.join(tmp, name)) as fh:
                    running.add(fh.readline().strip())
                os.unlink(os.path.join(tmp, name))
            suspects = [s for s in rest if s in running] or rest[:1]
            for sid in suspects:
                with ProcessPoolExecutor(1, mp_context=_context()) as one:
                    try:
                        take(one.submit(_run_chunk, ([sid], determinism, crash, versions)).result(
                            timeout=stuck_after)[0])
                    except BrokenProcessPool:
                        take(crash_record(sid, "the worker process died while running this scenario "
                                               "(a crash in native code, e.g. a segmentation fault); "
                                               f"`{replay_command(sid, dict(versions))}` reproduces "
                                               f"it in the foreground", versions))
                    except FutureTimeout:
                        _kill_workers(one)
                        take(crash_record(sid, f"the worker process was stuck on this scenario (no "
                                               f"answer within {stuck_after:g} s, twice); "
                                               f"`{replay_command(sid, dict(versions))}` reproduces "
                                               f"it in the foreground", versions))
                    except BaseException:
                        _kill_workers(one)
                        raise
            todo = [s for s in rest if s not in suspects]


def run_sweep(ids: list[str], jobs: int = 1, determinism: str = "sample",
              progress: Progress | None = None,
              on_record: Callable[[dict], None] | None = None,
              crash_ids: Iterable[str] = (), executor: str = "local",
              ray_address: str | None = None, versions: VersionPins = ()) -> Report:
    """Run every id; `jobs` > 1 uses worker processes. `determinism`: sample (1 in 20, by id),
    all, or none. `crash_ids` (worker processes only) makes a worker die on those ids, to
    test that a crash is reported instead of hanging the sweep. `executor="ray"` runs the
    scenarios as Ray tasks (commsim.scenario.executors): `jobs` CPUs of a local Ray, or the
    cluster at `ray_address`."""
    if executor not in ("local", "ray"):
        raise UserError(f"--executor {executor!r}; accepted: local, ray")
    if determinism not in ("sample", "all", "none"):
        raise UserError(f"determinism mode {determinism!r}; accepted: sample, all, none")
    if jobs < 1:
        raise UserError(f"--jobs must be >= 1, got {jobs}")
    t0 = time.perf_counter()
    records: list[dict] = []
    fails = 0

    def take(rec: dict) -> None:
        nonlocal fails
        records.append(rec)
        fails += not rec["ok"]
        if on_record:
            on_record(rec)
        if progress:
            progress.update(len(records), fails)

    if executor == "ray":
        run_ray(ids, jobs, determinism, functools.partial(run_one, versions=versions), take,
                address=ray_address)
    elif jobs == 1 or len(ids) < 8:
        for sid in ids:
            take(run_one(sid, determinism, versions))
    else:
        import signal
        _run_pool(ids, jobs, determinism, take, {sid: signal.SIGSEGV for sid in crash_ids},
                  versions=versions)
    if progress:
        progress.close()
    order = {s: i for i, s in enumerate(ids)}
    records.sort(key=lambda r: order[r["id"]])
    return Report(records, wall_s=time.perf_counter() - t0, jobs=jobs, executor=executor)
