"""Procs mode from a warm zygote: the launcher's side.

A fresh rank interpreter spends nearly all of its start importing torch (and commsim's
hosting); a zygote (commsim/launch/zygote_main.py) imports them once and forks each rank.
This module starts it, keeps one per launcher process for as long as it lives (the runs of a
`sweep --exec --exec-mode procs`, the tests of a pytest session, the suite's own procs-mode
tests all reuse it), asks it for ranks (`ForkedRank`: what run_procs needs of a Popen), and
says when a run must use fresh interpreters instead, and why:
- the run asked for them (RunConfig.zygote false);
- the rank's environment differs from the zygote's in what a fresh interpreter reads before
  the program's first line (`read_at_start`): the zygote would not be that interpreter;
- the zygote may not fork (threads, a torch operation in an opted-in module) or died;
- another run in this process holds it (runs from several threads at once).
The zygote is started with a mark of its own in its environment (`COMMSIM_ZYGOTE=...`),
which every child it forks carries in /proc/<pid>/environ: the run's watchdog ends those
too should the launcher be killed (procs/tree.py), the zygote included.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import select
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

from commsim.procs.tree import wait_or_kill

# Environment variables a fresh rank interpreter reads before the program's first line: the
# interpreter's own (PYTHON*), the dynamic loader's, and those read when the libraries the
# zygote imports load (OpenMP/MKL/OpenBLAS thread pools, numpy, torch's c10 logging, the C
# locale, the time zone time.py reads at import).
START_PREFIXES = ("PYTHON", "LD_", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "NPY_",
                  "TORCH_", "PYTORCH_", "LC_", "MALLOC_")
START_NAMES = ("LANG", "LANGUAGE", "GLIBC_TUNABLES", "TZ")
MARK = "COMMSIM_ZYGOTE"
# Set to 1 in a launcher's environment: every procs run of it uses fresh interpreters (what
# RunConfig.zygote=False asks for one run), e.g. to time the suite without the zygote.
FRESH = "COMMSIM_FRESH_INTERPRETERS"
READY_S = 300.0        # the zygote's imports (torch) on a loaded machine


def read_at_start(name: str) -> bool:
    return name.startswith(START_PREFIXES) or name in START_NAMES


def start_env(env: dict[str, str], boot_dir: str) -> dict[str, str]:
    """What of a rank's environment the zygote must have started with (PYTHONPATH without
    the run's own boot directory, which holds the run's generated sitecustomize)."""
    out = {k: v for k, v in env.items() if read_at_start(k)}
    pp = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p and p != boot_dir]
    out["PYTHONPATH"] = os.pathsep.join(pp)
    return out


class ForkedRank:
    """A rank forked by the zygote, as run_procs and reap.Session use a Popen: pid, the
    read ends of its stdout/stderr, poll(), wait(timeout), returncode."""

    def __init__(self, zygote: "Zygote", pid: int, stdout: Any, stderr: Any) -> None:
        self.zygote, self.pid, self.stdout, self.stderr = zygote, pid, stdout, stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.zygote.drain(0)
            self.returncode = self.zygote.exits.pop(self.pid, None)
        if self.returncode is None and not self.zygote.alive:
            # The zygote died first: its ranks became children of this process (the run's
            # subreaper, procs/tree.py), which reaps them itself.
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return None
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout)
            self.zygote.drain(0.05 if left is None else min(left, 0.05))
        return self.returncode


class Zygote:
    """One zygote process: started with `env` (zygote_env, its mark added), importing the
    opted-in modules `preload` (found first in the directory `where`) after commsim's own;
    `key`: the start-up it stands for."""

    def __init__(self, env: dict[str, str], key: tuple, preload: tuple[str, ...],
                 where: str = "") -> None:
        self.key = key
        self.mark = f"{MARK}={os.getpid()}-{secrets.token_hex(8)}"
        self.exits: dict[int, int] = {}
        self.why = ""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = ours
        full = dict(env)
        full[MARK] = self.mark.split("=", 1)[1]
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from commsim.launch.zygote_main import main; main()",
             str(theirs.fileno()), str(os.getpid()), ",".join(preload), where],
            pass_fds=[theirs.fileno()], env=full, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        theirs.close()
        self.pid = self.proc.pid
        self.ready = False

    def wait_ready(self) -> str:
        """Wait for the zygote's imports (once); why it cannot fork ('' when it can)."""
        if not self.ready:
            self.ready = True
            msg = self._recv(READY_S)
            if msg is None or "ready" not in msg:
                self.why = "the zygote did not start" + (
                    f" (exit {self.proc.poll()})" if self.proc.poll() is not None else "")
            else:
                self.why = msg["why"]
        return self.why

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def _read(self, timeout: float) -> dict | None:
        """The next message within `timeout` (an exit status is recorded as well); None if
        none came or the zygote is gone."""
        if not select.select([self.sock], [], [], max(timeout, 0))[0]:
            return None
        try:
            raw = self.sock.recv(1 << 16)
        except OSError:
            return None
        if not raw:
            return None
        msg = json.loads(raw)
        if "exited" in msg:
            pid, code = msg["exited"]
            self.exits[pid] = code
        return msg

    def _recv(self, timeout: float) -> dict | None:
        """The next message that is not an exit status, within `timeout`."""
        deadline = time.monotonic() + timeout
        while (msg := self._read(deadline - time.monotonic())) is not None:
            if "exited" not in msg:
                return msg
        return None

    def drain(self, timeout: float) -> None:
        """Record the exit statuses the zygote sent (waiting up to `timeout` for the first)."""
        while self._read(timeout) is not None:
            timeout = 0

    def spawn(self, argv: list[str], env: dict[str, str]) -> ForkedRank | str:
        """A rank running `python ARGV` with `env`, or why the zygote cannot give one."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            req = {"op": "spawn", "argv": argv, "env": env, "cwd": os.getcwd()}
            socket.send_fds(self.sock, [json.dumps(req).encode()], [out_w, err_w])
        except OSError as e:
            for fd in (out_r, err_r):
                os.close(fd)
            return f"the zygote is gone ({e.strerror})"
        finally:
            os.close(out_w)
            os.close(err_w)
        msg = self._recv(60.0)
        if msg is None or "spawned" not in msg:
            os.close(out_r)
            os.close(err_r)
            why = (msg or {}).get("refused") or "the zygote did not answer"
            self.why = self.why or why
            return why
        return ForkedRank(self, msg["spawned"], open(out_r, "rb"), open(err_r, "rb"))

    def close(self) -> None:
        try:
            self.sock.send(json.dumps({"op": "exit"}).encode())
        except OSError:
            pass
        wait_or_kill(self.proc, 10)
        self.sock.close()


_lock = threading.Lock()
_current: Zygote | None = None
_refused: dict[tuple, str] = {}          # start-ups that could not fork: not tried again


def _close_current() -> None:
    global _current
    if _current is not None:
        _current.close()
        _current = None


atexit.register(_close_current)


def current_pid() -> int | None:
    """The pid of this process's zygote (None while it has none)."""
    return _current.pid if _current is not None else None


def zygote_env(rank_env: dict[str, str], boot_dir: str) -> dict[str, str]:
    """The zygote's environment: this process's, less what marks a run, with a rank's
    start-up part (start_env) in place of this process's."""
    base = {k: v for k, v in os.environ.items()
            if not read_at_start(k) and not k.startswith(("COMMSIM_HOSTING", MARK))}
    return {**base, **start_env(rank_env, boot_dir)}


@contextmanager
def lease(rank_env: dict[str, str], boot_dir: str, preload: tuple[str, ...] = (),
          where: str = "") -> Iterator[tuple[Zygote | None, str]]:
    """This process's zygote for one run whose ranks start with `rank_env`, or (None, why
    not); `preload`: the program's modules it imports, from `where` (the program's
    directory). Started on first use, replaced when a run needs another start-up or it
    failed."""
    if os.environ.get(FRESH) == "1":
        yield None, ""
        return
    if not _lock.acquire(blocking=False):
        yield None, "another run of this process holds the zygote"
        return
    try:
        key = _key(rank_env, boot_dir, preload, where)
        if key in _refused:
            yield None, _refused[key]
            return
        _start(rank_env, boot_dir, key)
        why = _current.wait_ready()
        if why:
            _refused[key] = why
            _close_current()
            yield None, why
            return
        yield _current, ""
    finally:
        _lock.release()


def _key(rank_env: dict[str, str], boot_dir: str, preload: tuple[str, ...], where: str) -> tuple:
    return (tuple(sorted(start_env(rank_env, boot_dir).items())), preload,
            where if preload else "")


def _start(rank_env: dict[str, str], boot_dir: str, key: tuple) -> None:
    """Make `_current` a zygote for `key` (the lock held), reusing the one there if it fits."""
    global _current
    if _current is not None and (_current.key != key or not _current.alive or _current.why):
        _close_current()
    if _current is None:
        _current = Zygote(zygote_env(rank_env, boot_dir), key, key[1], key[2])


def prestart(program: list[str]) -> None:
    """Start this process's zygote for procs runs of `program` now, without waiting for its
    imports: they overlap the launcher's own work (a sweep's first scenario). Runs whose
    start-up differs replace it, as without this call."""
    from commsim.launch.config import RunConfig
    from commsim.launch.rank_env import rank_env
    if os.environ.get(FRESH) == "1" or not _lock.acquire(blocking=False):
        return
    try:
        cfg = RunConfig(machine="hgx-h100-8", nproc_per_host=1, command=list(program)).resolve()
        env = rank_env(cfg, 0, cfg.cluster(), dict(os.environ), "", 0)
        key = _key(env, "", (), "")
        if key not in _refused:
            _start(env, "", key)
    finally:
        _lock.release()
