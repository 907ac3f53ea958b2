"""Ending a run's whole process tree: its ranks, what they started (JIT compilers, workers,
helpers a process mode adds) and what daemonized (setsid + double fork), whether the
launcher ends normally, times out, or is SIGKILLed.

A run's processes are found two ways, since neither alone reaches all of them:
- the mark: an environment entry (`KEY=VALUE`, unique to the run) the launcher gives its
  ranks; every process they start inherits it, a daemon included, unless it clears its
  environment on purpose (/proc/<pid>/environ is the environment the process started with);
- the tree: every descendant of a marked process (man 5 proc: the ppid in /proc/<pid>/stat).
  While the launcher runs it is a child subreaper (PR_SET_CHILD_SUBREAPER, man 2 prctl), so
  an orphan of the run is reparented to it, not to init, and stays in that tree.
What is found is stopped first (SIGSTOP: a process that forks in a loop cannot outrun the
scan), found again until nothing new appears, then killed. Each signal goes through a pidfd
opened before the process is checked (man 2 pidfd_open), so a pid that was reused in between
is never signalled.

Each rank also dies with the launcher by itself (die_with_parent: PR_SET_PDEATHSIG, set by
the rank's bootstrap), the moment the launcher is gone. If the launcher dies (SIGKILL), a
watchdog process it started (procs/watchdog.py) also ends the rest of the tree (what the ranks started) and
removes the run's files: it waits on a pidfd of the launcher and, unless the launcher said
`done` first, ends the tree, then deletes the paths it was given and each killed process's
`commsim-rt-<pid>-*` directory. `sweep_stale_tmp` removes what a run left in the temp
directory when even that could not run (the next launch and `commsim clean` call it).
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

from commsim.util import signals
from commsim.util.pids import pid_alive

PR_SET_PDEATHSIG = 1             # linux/prctl.h
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
PARENT_ENV = "COMMSIM_HOSTING_PARENT"   # the launcher's pid, in its ranks' environment
# Temp-dir entries that name the pid of the process that made them: a launcher's run
# directory (commsim-exec-<pid>-...) and a hosted process's libcudart file (commsim-rt-<pid>-...).
STALE_NAME = re.compile(r"^commsim-(?:exec|rt)-(\d+)-")
_ROUNDS = 50                     # stop/scan rounds before the kill (each round finds forks)


def set_subreaper(on: bool) -> bool:
    """Make this process the child subreaper of everything below it, or stop being one
    (Linux 3.4+); returns whether it was one before."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        was = ctypes.c_int(0)
        libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0)
        libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)
        return bool(was.value)
    except (OSError, AttributeError):
        return False


def die_with_parent(parent: int) -> bool:
    """SIGKILL this process when the thread that started it ends (PR_SET_PDEATHSIG, man 2
    prctl: a rank goes with a SIGKILLed launcher at once, before the watchdog's scan). A
    parent that died before the call is seen by the pid this process was reparented to:
    then this process ends now. False where prctl is unavailable (not Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)
    return True


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _marked(pid: int, mark: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return mark in f.read().split(b"\0")
    except OSError:
        return False


def _processes() -> dict[int, int]:
    """pid -> ppid of every live process of this user (zombies have ended: left out)."""
    out, me = {}, os.getuid()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            if os.stat(f"/proc/{d}").st_uid != me:
                continue
        except OSError:
            continue
        f = _stat_fields(int(d))
        if f is not None and f[0] != "Z":
            out[int(d)] = int(f[1])
    return out


def _own_helpers() -> set[int]:
    """multiprocessing's resource tracker and forkserver of this interpreter: an inproc rank
    may have started them, but they serve the launcher's process (a pytest session, say) for
    as long as it lives, and it ends them itself."""
    out = set()
    rt, fs = sys.modules.get("multiprocessing.resource_tracker"), sys.modules.get("multiprocessing.forkserver")
    for pid in (getattr(getattr(rt, "_resource_tracker", None), "_pid", None),
                getattr(getattr(fs, "_forkserver", None), "_forkserver_pid", None)):
        if pid:
            out.add(pid)
    return out


def members(marks: str | Iterable[str], below: Iterable[int] = ()) -> set[int]:
    """The live processes that carry any of `marks` and their descendants, and every
    descendant of a pid in `below` (not that pid itself: a warm zygote forks a run's ranks
    and outlives the run, its children carry the zygote's start-up environment, not the
    run's mark); this process and its own multiprocessing helpers excluded."""
    procs = _processes()
    wanted = [m.encode() for m in ([marks] if isinstance(marks, str) else marks)]
    found = {p for p in procs if any(_marked(p, m) for m in wanted)}
    children: dict[int, list[int]] = {}
    for p, pp in procs.items():
        children.setdefault(pp, []).append(p)
    roots = set(below)
    found |= {c for r in roots for c in children.get(r, [])} - roots
    todo = list(found)
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in found:
                found.add(c)
                todo.append(c)
    found.discard(os.getpid())
    return found - _own_helpers()


def _signal(pidfd: int, sig: int) -> None:
    try:
        signal.pidfd_send_signal(pidfd, sig)
    except ProcessLookupError:
        pass


def end_tree(marks: str | Iterable[str], below: Iterable[int] = ()) -> set[int]:
    """Stop, then kill, every process of the run `marks` name (members()); reap those that
    became this process's children. Returns the pids killed."""
    held: dict[int, int] = {}                       # pid -> pidfd
    marks = [marks] if isinstance(marks, str) else list(marks)
    below = list(below)
    try:
        for _ in range(_ROUNDS):
            opened = {}
            for pid in members(marks, below) - held.keys():
                try:
                    opened[pid] = os.pidfd_open(pid)
                except OSError:
                    continue                        # gone already
            if not opened:
                break
            still = members(marks, below)           # a pid reused before its open is dropped
            for pid, fd in opened.items():
                if pid in still:
                    held[pid] = fd
                    _signal(fd, signal.SIGSTOP)
                else:
                    os.close(fd)
        for fd in held.values():
            _signal(fd, signal.SIGKILL)
        _reap(set(held))
    finally:
        for fd in held.values():
            os.close(fd)
    return set(held)


def _reap(pids: set[int], limit: float = 5.0) -> None:
    """Wait for the killed processes that are children of this one (orphans reparented to a
    subreaper), so none is left a zombie."""
    deadline = time.monotonic() + limit
    todo = {p for p in pids if (_stat_fields(p) or ["", ""])[1] == str(os.getpid())}
    while todo and time.monotonic() < deadline:
        for p in list(todo):
            try:
                done, _ = os.waitpid(p, os.WNOHANG)
            except ChildProcessError:
                done = p
            if done:
                todo.discard(p)
        time.sleep(0.01)


def remove_leftovers(paths: list[str], pids: set[int], tmp: str | None = None) -> None:
    """Delete `paths` and every `commsim-rt-<pid>-*` directory of `pids` in the temp dir."""
    for p in paths:
        shutil.rmtree(p, ignore_errors=True)
    base = Path(tmp or tempfile.gettempdir())
    for pid in pids:
        for d in base.glob(f"commsim-rt-{pid}-*"):
            shutil.rmtree(d, ignore_errors=True)


def _ended(pid: int) -> bool:
    """The process is gone, or a zombie (a rank the kernel killed with its launcher, not
    reaped yet by whoever adopted it)."""
    if not pid_alive(pid):
        return True
    fields = _stat_fields(pid)
    return fields is not None and fields[0] == "Z"


def sweep_stale_tmp(tmp: str | None = None) -> list[str]:
    """Remove this user's commsim-exec-<pid>-* and commsim-rt-<pid>-* entries of the temp dir
    whose process is gone (its launcher or rank was killed). Returns the paths removed."""
    base = Path(tmp or tempfile.gettempdir())
    removed = []
    try:
        entries = list(base.iterdir())
    except OSError:
        return removed
    for p in entries:
        m = STALE_NAME.match(p.name)
        if m is None or not _ended(int(m.group(1))):
            continue
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        if st.st_uid != os.getuid() or not stat.S_ISDIR(st.st_mode):
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed.append(str(p))
    return removed


class Watchdog:
    """The process that ends the run's tree and removes its files should the launcher die."""

    def __init__(self, marks: list[str], paths: list[str]) -> None:
        self.proc = subprocess.Popen(
            # -S: the watchdog imports nothing from site-packages (commsim comes from the
            # PYTHONPATH below), and site's start-up was a third of its CPU, paid per run.
            [sys.executable, "-S", "-m", "commsim.procs.watchdog", tempfile.gettempdir(), *marks,
             "--", *paths],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True,
            env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                [_root()] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))))

    def done(self) -> None:
        """The launcher cleaned up itself: the watchdog exits without doing anything."""
        try:
            self.proc.stdin.write(b"done\n")
            self.proc.stdin.close()
        except OSError:
            pass
        wait_or_kill(self.proc, 10)


def wait_or_kill(proc: subprocess.Popen, limit: float) -> None:
    """Wait up to `limit` s for a helper process told to exit, then kill it."""
    try:
        proc.wait(limit)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _root() -> str:
    return str(Path(__file__).resolve().parents[2])


@contextmanager
def owned_tree(mark: str, paths: list[str], *, below: Iterable[int] = (),
               also: Iterable[str] = ()) -> Iterator[None]:
    """While the block runs, this process is the run's subreaper and a watchdog stands by;
    on the way out (a normal end, an error, a timeout) every process of the run is ended and
    the temp-dir files of the dead ones (ranks killed by the launcher included) removed.
    `below`: pids whose descendants are the run's too (a warm zygote's); `also`: marks the
    watchdog ends as well should the launcher die (the zygote's own, the zygote with it)."""
    was = set_subreaper(True)
    below = list(below)
    dog = Watchdog([mark, *also], paths)
    try:
        yield
    finally:
        with signals.deferred():       # a Ctrl-C now must not leave half the tree running
            try:
                end_tree(mark, below)
                sweep_stale_tmp()
            finally:
                dog.done()
                set_subreaper(was)
