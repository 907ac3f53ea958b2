"""inproc mode: every rank a greenlet of this interpreter under commsim's seeded scheduler.

The program runs once per rank (in a `__main__` module of its own) with the rank bound:
its own os.environ (torchrun's variables), hostname, /dev/shm, CUDA_VISIBLE_DEVICES view, a
SimDriver over one SimFabric shared by the run, and torch.distributed answered over a
LocalGroup. A blocking collective or a sleep is a switch to another rank chosen by the seed,
so a run replays exactly (the verdict prints the schedule's trace hash) and a hang is found
when no rank can move, with a diagnosis of every rank. Output lines are prefixed `[rankN]: `.

Limits: modules the program imports are shared by its ranks (one interpreter): state kept at
module level in an imported module is seen by every rank. A process a rank spawns is a real
process hosted like a procs-mode process of the same host; its device memory is not the
in-process fabric's, so IPC handles do not cross between it and the ranks.
"""

from __future__ import annotations

import signal
import contextlib
import io
import os
import importlib.util
import types
import sys
import threading
import traceback
from typing import Any, Callable, Iterator, TextIO

from commsim.runtime.diagnosis import HangDetected
from commsim.group.local import LocalWorld
from commsim.sim import SimDriver, SimFabric, set_torch_threads
from commsim.topology.model import GpuRef
from commsim.hosting.state import rankview
from commsim.launch.bootstrap import shm_dir
from commsim.launch.config import RunConfig
from commsim.hosting.state.driver_view import HostedDriver
from commsim.launch.rank_env import container_of, free_port, rank_env, visible_of
from commsim.launch.reports import read_reports, worker_results
from commsim.hosting.state.session import HostedRank, RankEvents, bound, exception_line, hosted, program_site
from commsim.hosting.install.patches import Patches
from commsim.hosting.install.registry import install_all
from commsim.hosting.surfaces.mpi import mpi4py as mpi4py_surface
from commsim.hosting.surfaces.sockets import NeedsProcesses
from commsim.hosting.surfaces.table import MODULES as SURFACE_MODULES
from commsim.launch.verdict import ProcResult, Verdict
from commsim.hosting.install.hard_exit import HardExit, exits_unwind
from commsim.util.signals import Terminated


class _RankExit(Exception):
    """A rank's program ended with a non-zero status: the scheduler counts the rank failed
    (its peers blocked on it learn so, as a real peer's connection would drop)."""

    def __init__(self, code: int) -> None:
        super().__init__(f"exit status {code}")
        self.code = code


class RankStream(io.TextIOBase):
    """sys.stdout / sys.stderr while ranks run: each line goes out prefixed with the rank
    that wrote it (partial lines are kept per rank)."""

    def __init__(self, sink: TextIO, echo: bool) -> None:
        self.sink = sink
        self.echo = echo
        self.partial: dict[int, str] = {}
        self.lines: dict[int, list[str]] = {}

    def write(self, s: str) -> int:
        r = hosted()
        key = r.rank if r is not None else -1
        text = self.partial.pop(key, "") + s
        *full, rest = text.split("\n")
        if rest:
            self.partial[key] = rest
        for line in full:
            self.lines.setdefault(key, []).append(line)
            if self.echo:
                self.sink.write(f"[rank{key}]: {line}\n" if key >= 0 else line + "\n")
        return len(s)

    def flush(self) -> None:
        for key, rest in list(self.partial.items()):
            self.partial.pop(key)
            self.lines.setdefault(key, []).append(rest)
            if self.echo:
                self.sink.write(f"[rank{key}]: {rest}\n" if key >= 0 else rest + "\n")
        self.sink.flush()


@contextlib.contextmanager
def _streams(out: TextIO, err: TextIO, echo: bool) -> Iterator[tuple[RankStream, RankStream]]:
    o, e = RankStream(out, echo), RankStream(err, echo)
    patches = Patches()
    patches.attr(sys, "stdout", o)
    patches.attr(sys, "stderr", e)
    try:
        yield o, e
    finally:
        o.flush()
        e.flush()
        patches.restore()


def main_module(command: list[str]) -> tuple[types.ModuleType, Any]:
    """A fresh `__main__` for one rank and the code to run in it (the program's file, or the
    module of `-m`), as `python prog.py` / `python -m mod` would set them up."""
    mod = types.ModuleType("__main__")
    if command[0] == "-m":
        spec = importlib.util.find_spec(command[1])
        if spec is None or spec.loader is None:
            raise ModuleNotFoundError(f"No module named {command[1]!r}")
        if spec.submodule_search_locations is not None:      # a package: its __main__
            spec = importlib.util.find_spec(command[1] + ".__main__")
        code = spec.loader.get_code(spec.name)
        mod.__file__ = spec.origin
        mod.__spec__ = spec
        mod.__package__ = spec.parent
    else:
        path = os.path.abspath(command[0])
        with open(path, "rb") as f:
            # dont_inherit: not this module's `from __future__ import annotations` (the
            # program's annotations would all be strings, as no `python prog.py` has them)
            code = compile(f.read(), path, "exec", dont_inherit=True)
        mod.__file__ = path
        mod.__spec__ = None
    mod.__builtins__ = __builtins__
    return mod, code


def print_user_traceback(exc: BaseException) -> None:
    """The traceback as Python prints it for the program run directly: the frames of the
    runner and runpy above the program's own are left out."""
    tb = exc.__traceback__
    while tb is not None and (tb.tb_frame.f_code.co_filename.startswith(_HERE)
                              or "runpy" in tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb if tb is not None else exc.__traceback__)


_HERE = os.path.dirname(os.path.abspath(__file__))


def _exception_line(exc: BaseException) -> str:
    return exception_line(type(exc), exc)


def _hang_of(exc: BaseException | None) -> HangDetected | None:
    while exc is not None:
        if isinstance(exc, HangDetected):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _end_spawned(before: set) -> None:
    """Processes the ranks started through multiprocessing (torch.multiprocessing.spawn
    included) and left running, after a timeout say, go with the run."""
    import multiprocessing
    for p in set(multiprocessing.active_children()) - before:
        p.kill()
        p.join(5)


def run_inproc(cfg: RunConfig, boot_dir: str, *, out: TextIO, err: TextIO, echo: bool,
               target: Callable[[], Any] | None = None) -> Verdict:
    """Run cfg's program (or `target()`, a callable: the pytest plugin's test function) as
    every rank."""
    set_torch_threads()       # the ranks' simulated kernels run here, one at a time
    cluster = cfg.cluster()
    fabric = SimFabric(cluster, cfg.seed)
    fabric.where = program_site          # an undefined-behaviour flag names the program's line
    world = LocalWorld(cfg.world_size, cfg.seed)
    port = free_port()
    base = dict(os.environ)
    ranks: list[HostedRank] = []
    results: list[ProcResult] = []
    for r in range(cfg.world_size):
        host, _ = cfg.placement[r]
        refs = tuple(GpuRef(host, i) for i in visible_of(cfg, r, cluster))
        proc = fabric.spawn(host, refs, cfg.driver_faults(r))
        container = container_of(cfg, r, cluster)
        if container is not None:
            proc.container = tuple(GpuRef(host, i) for i in container)
        events = RankEvents()
        env = rank_env(cfg, r, cluster, base, boot_dir, port)
        env["COMMSIM_HOSTING_SLOT"] = ""   # a process a rank spawns takes a slot of its own
        lr, lws = cfg.local_rank(r)
        ranks.append(HostedRank(r, cfg.world_size, lr, lws, host,
                                HostedDriver(SimDriver(fabric, proc), events), cluster, refs,
                                shm_dir(cfg, cluster, host, proc.pid), events, mode="inproc",
                                pid=proc.pid, env=rankview.encoded(env), world=world, slot=r,
                                container=container))
        results.append(ProcResult(r, r, host, proc.pid))

    def body(r: int) -> None:
        hr, res = ranks[r], results[r]
        code = 0
        with bound(hr):
            rankview.refresh()
            try:
                if target is not None:
                    target()
                else:
                    exec(program, hr.state["__main__"].__dict__)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if isinstance(e, HardExit):
                    hr.events.notes.append(f"the program called {e}: a real process ends there, "
                                           f"its peers see it gone; inproc its finally blocks ran")
                if e.code is not None and not isinstance(e.code, int):
                    print(e.code, file=sys.stderr)
            except (KeyboardInterrupt, Terminated):
                raise           # the launcher's, not the rank's: it ends the run as it is
            except NeedsProcesses as e:
                # The run cannot go on in one interpreter: ended here, run again in procs.
                needs_procs.append((f"rank {r}: {e.call} at {e.site}", e.why))
                code = 1
                res.exception = _exception_line(e)
            except BaseException as e:
                print_user_traceback(e)
                code = 1
                res.exception = _exception_line(e)
                hang = _hang_of(e)
                if hang is not None:
                    res.status = "hang"
                    res.hang = str(hang)
            finally:
                res.residue = fabric.exit_process(hr.driver.inner.proc.pid)
        rankview.refresh()
        res.exit_code = code
        if code != 0:
            if res.status == "ok":
                res.status = "failed"
            raise _RankExit(code)

    timed_out = threading.Event()
    needs_procs: list[tuple[str, str]] = []          # (the call and where, why)

    def _expire() -> None:
        timed_out.set()
        # A signal, not _thread.interrupt_main(): it also ends a blocking system call.
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    install_all(SURFACE_MODULES)
    mpi4py_surface.forget()
    import multiprocessing
    children_before = set(multiprocessing.active_children())
    run = Patches()             # this interpreter's argv and __main__ while the ranks run
    main_was = sys.modules.get("__main__")
    if main_was is not None:
        run.module("__main__", main_was)
    program = None
    for hr in ranks:
        if target is None:
            hr.state["__main__"], program = main_module(cfg.command)
    path0 = list(sys.path)
    if target is None and cfg.command[0] != "-m":
        sys.path.insert(0, os.path.dirname(os.path.abspath(cfg.command[0])))
    run.attr(sys, "argv", [cfg.command[1] if cfg.command[0] == "-m" else cfg.command[0]] +
             list(cfg.command[2 if cfg.command[0] == "-m" else 1:]))
    watchdog = threading.Timer(cfg.timeout, _expire)
    watchdog.daemon = True
    try:
        with _streams(out, err, echo), rankview.installed(), exits_unwind():
            watchdog.start()
            try:
                world.scheduler.run([lambda r=r: body(r) for r in range(cfg.world_size)])
            except KeyboardInterrupt:
                if not timed_out.is_set():
                    raise
            finally:
                watchdog.cancel()
    finally:
        run.restore()
        sys.path[:] = path0
    _end_spawned(children_before)
    if timed_out.is_set():
        for res in results:
            if res.exit_code is None:
                res.status, res.exception = "hang", f"still running after --timeout {cfg.timeout:g} s"
    for hr, res in zip(ranks, results):
        ev = hr.events
        res.first_cuda_error = vars(ev.first_cuda_error).copy() if ev.first_cuda_error else None
        res.cuda_errors = ev.cuda_errors
        res.notes = list(ev.notes)
    results += worker_results(cfg, read_reports(cfg.run_dir))
    v = Verdict(cfg, results, trace_hash=world.trace_hash(), flags=list(fabric.flags))
    if needs_procs:
        v.needs_procs, v.procs_reason = needs_procs[0]
    return v
