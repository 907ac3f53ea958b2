"""procs mode: every rank a real OS process, torchrun-style.

Each rank is `python <program>` with torchrun's environment and the hosting start-up hook
(forked from the launcher's warm zygote, commsim/launch/zygote.py, or a fresh interpreter);
its output comes back line by line prefixed `[rankN]: `. The launcher waits: when the run
outlives --timeout, every rank still running dumps its Python stacks (SIGUSR1, registered by
the bootstrap) and is killed: a hang, diagnosed by where each rank waits. When a rank fails,
the others get a grace period (their collectives with the dead peer fail on their own), then
are killed. Each rank runs in its own session, so the workers it spawned go with it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from typing import Any, TextIO

from commsim.procs import tree
from commsim.procs.reap import Session, reap
from commsim.launch.config import RunConfig
from commsim.launch.mpirun import MpiRendezvous
from commsim.launch.rank_env import free_port, rank_env, run_mark
from commsim.launch.reports import from_report, read_reports, stacks, user_stack, worker_results
from commsim.launch.verdict import ProcResult, Verdict
from commsim.launch.zygote import ForkedRank, Zygote
from commsim.util import signals

GRACE = 20.0       # seconds the survivors of a failed rank get before they are killed


def _pump(pipe: Any, sink: TextIO | None, prefix: str, tail: deque, lock: threading.Lock) -> None:
    for raw in iter(pipe.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        tail.append(line)
        if sink is not None:
            with lock:
                sink.write(f"{prefix}{line}\n")
                sink.flush()
    pipe.close()


def _start(cfg: RunConfig, env: dict[str, str], zygote: Zygote | None) -> tuple[Any, str]:
    """A rank's process: forked by the zygote, else a fresh interpreter (and why)."""
    why = ""
    if zygote is not None:
        got = zygote.spawn(list(cfg.command), env)
        if isinstance(got, ForkedRank):
            return got, ""
        why = got
    return subprocess.Popen([sys.executable] + list(cfg.command), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True), why


def run_procs(cfg: RunConfig, boot_dir: str, *, out: TextIO, err: TextIO, echo: bool,
              zygote: Zygote | None = None) -> Verdict:
    """Run every rank as a process: forked by `zygote` when given, else fresh interpreters."""
    cluster = cfg.cluster()
    port = free_port()
    base = dict(os.environ)
    lock = threading.Lock()
    procs: dict[int, subprocess.Popen] = {}
    tails: dict[int, deque] = {}
    pumps: list[threading.Thread] = []
    killed: dict[int, str] = {}
    mpi = None
    fresh = ""                    # why ranks the zygote should have forked are fresh ones
    if cfg.launcher == "mpirun":
        mpi = MpiRendezvous(cfg)
    try:
        for r in range(cfg.world_size):
            env = rank_env(cfg, r, cluster, base, boot_dir, port)
            if mpi is not None:
                env.update(mpi.env())
            p, why = _start(cfg, env, zygote)
            fresh = fresh or why
            procs[r] = p
            tails[r] = deque(maxlen=40)
            for pipe, sink in ((p.stdout, out), (p.stderr, err)):
                t = threading.Thread(target=_pump, args=(pipe, sink if echo else None,
                                                         f"[rank{r}]: ", tails[r], lock),
                                     daemon=True)
                t.start()
                pumps.append(t)
        deadline = time.monotonic() + cfg.timeout
        grace_end: float | None = None
        while True:
            alive = [r for r, p in procs.items() if p.poll() is None]
            if not alive:
                break
            now = time.monotonic()
            if mpi is not None:
                for r, p in procs.items():
                    if p.returncode is not None:
                        mpi.ended(r, p.returncode)
            failed = [r for r, p in procs.items() if p.returncode not in (None, 0)]
            if failed and grace_end is None:
                grace_end = now + min(GRACE, cfg.timeout)
            if now > deadline or (grace_end is not None and now > grace_end):
                why = (f"still running after --timeout {cfg.timeout:g} s" if now > deadline
                       else f"still running {min(GRACE, cfg.timeout):g} s after rank "
                            f"{failed[0]} failed")
                for r in alive:
                    try:
                        os.kill(procs[r].pid, signal.SIGUSR1)   # dump stacks (faulthandler)
                    except ProcessLookupError:
                        pass
                time.sleep(0.5)
                for r in alive:
                    killed[r] = why
                reap([Session(procs[r]) for r in alive], 10)
                break
            time.sleep(0.02)
    finally:
        # Every rank's session, also of ranks that exited: workers a rank left behind go too,
        # and what left its session (a daemon, a JIT compiler in a session of its own) before
        # the output pumps wait for the pipes it may hold. A Ctrl-C now waits for the end.
        with signals.deferred():
            reap([Session(p) for p in procs.values()], 10)
            tree.end_tree(run_mark(cfg), below=[zygote.pid] if zygote is not None else [])
            for t in pumps:
                t.join(5)
            if mpi is not None:
                mpi.close()
    reports = read_reports(cfg.run_dir)
    results = []
    for r in range(cfg.world_size):
        p = procs.get(r)
        rep = reports.get(r, {"slot": r, "rank": r, "host": cfg.placement[r][0],
                              "pid": p.pid if p else 0})
        res = from_report(rep)
        res.pid = p.pid if p else res.pid
        res.exit_code = p.returncode if p else None
        if r in killed:
            res.status = "hang" if "timeout" in killed[r] else "killed"
            res.exception = res.exception or killed[r]
            res.hang = user_stack(stacks(cfg.run_dir, r)) or None
        elif res.exit_code != 0:
            res.status = "failed"
            if res.exception is None:
                res.exception = next((x for x in reversed(tails[r]) if x.strip()), None)
        if r not in reports:
            res.notes.append("left no report (it ended without Python's exit: exec, or a "
                             "signal): its CUDA errors and residue are unknown")
        results.append(res)
    results += worker_results(cfg, reports)
    flags = sorted({f for res in results for f in res.flags})
    return Verdict(cfg, results, flags=flags, fresh=fresh or None)

