"""Shared pieces of the security tests: a small process-mode scenario, a run in flight that can
be signalled, and what a run leaves behind (processes, /dev/shm, the temp dir)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from commsim.sim import shm

ROOT = Path(__file__).resolve().parents[2]

SCENARIO = """
[scenario]
name = "security-pair"
seed = 0
policy = "default"

[topology]
preset = "hgx-h100-8"

[placement]
ranks = 2

[[group]]
name = "tp"
ranks = "0..1"

[workload]
ops = ["all_reduce"]
sizes = ["16KiB"]
dtypes = ["float32"]
"""


def running(pid: int) -> bool:
    """Whether `pid` is a process that has not ended (a zombie has ended: state Z)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


class InFlight:
    """`commsim run --procs` of a 2-rank scenario whose rank 1 stalls at the IPC handle
    exchange, with its own TMPDIR; once `started`, its ranks are inside the run."""

    def __init__(self, tmp: Path) -> None:
        # Short: the forkserver's AF_UNIX socket lives under TMPDIR (at most 108 bytes).
        self.tmp = Path(tempfile.mkdtemp(prefix="cs-sec-", dir="/tmp"))
        sc = tmp / "pair.toml"
        sc.write_text(SCENARIO)
        self.p = subprocess.Popen(
            [sys.executable, "-m", "commsim.cli", "run", "--procs", "-v", "--timeout", "60",
             "--stall", "1@ipc.init", str(sc)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(self.tmp)))
        line, seen, deadline = "", [], time.monotonic() + 120
        while time.monotonic() < deadline:
            line = self.p.stderr.readline()
            seen.append(line)
            if "started" in line or not line:
                break
        m = re.search(r"pids ([\d ]+);.*shared memory /dev/shm/(\S+)/\*", line)
        if not m:
            self.p.kill()
            out, err = self.p.communicate(timeout=30)
            raise AssertionError(f"the launcher never reported its ranks (exit "
                                 f"{self.p.returncode}):\n{out}\n{''.join(seen)}{err}")
        self.rank_pids = [int(x) for x in m.group(1).split()]
        self.prefix = m.group(2)
        deadline = time.monotonic() + 30      # until the ranks have segments
        while time.monotonic() < deadline and len(shm.segments(self.prefix)) < 3:
            time.sleep(0.1)
        self.tree = descendants(self.p.pid)
        assert set(self.rank_pids) <= self.tree

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.communicate(timeout=30)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def wait_gone(self, pids: set[int], limit: float = 15) -> set[int]:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline and any(running(x) for x in pids):
            time.sleep(0.1)
        return {x for x in pids if running(x)}


FORKED: list[int] = []     # children of fork_child not reaped yet (a fixture kills leftovers)


def fork_child(child) -> tuple[int, int]:
    """Run child(write_fd) in a forked process; returns (pid, read end of its report pipe).
    The child exits 0 when `child` returns, 1 when it raises."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            child(w)
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    FORKED.append(pid)
    return pid, r


def with_env(entry: str) -> set[int]:
    """Live processes whose environment at start held `entry` (KEY=VALUE)."""
    out = set()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                if entry.encode() in f.read().split(b"\0") and running(int(d)):
                    out.add(int(d))
        except OSError:
            continue
    return out


def interrupted_exec(program: list[str], *, after_ready: float | None = None,
                     after_start: float = 0.0, sig: int = signal.SIGINT) -> tuple[int, str, set, list]:
    """`commsim exec --mode procs` of `program` on two ranks, with a TMPDIR of its own, sent
    `sig` `after_start` s after it started or, given `after_ready`, that long after both ranks
    printed `ready`. (exit status, stderr, processes of the run alive 5 s later, what is left in
    its TMPDIR)."""
    tmp = tempfile.mkdtemp(prefix="cs-int-", dir="/tmp")
    p = subprocess.Popen([sys.executable, "-m", "commsim.cli", "exec", "--machine", "hgx-h100-8",
                          "--nproc-per-host", "2", "--mode", "procs", "--timeout", "60", "--",
                          "python", *program],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=tmp))
    try:
        if after_ready is None:
            time.sleep(after_start)
        else:
            ready, deadline = set(), time.monotonic() + 60
            while len(ready) < 2 and time.monotonic() < deadline:
                line = p.stdout.readline()
                if not line:
                    break
                if line.rstrip().endswith(": ready"):
                    ready.add(line.split(":")[0])
            assert len(ready) == 2, f"the ranks never said ready: {p.communicate(timeout=30)}"
            time.sleep(after_ready)
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and with_env(f"TMPDIR={tmp}"):
            time.sleep(0.1)
        return p.returncode, err, with_env(f"TMPDIR={tmp}"), os.listdir(tmp)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
        for pid in with_env(f"TMPDIR={tmp}"):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)

