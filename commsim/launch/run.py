"""Run a program as the ranks of a simulated machine and judge it: the core of `commsim exec`,
the pytest plugin and `sweep --exec`.

`execute(cfg)` makes the run's private directory (mkdtemp: 0700, unguessable) holding the
config, the generated sitecustomize, each host's /dev/shm stand-in, the process registry and
the reports; runs the ranks (procs: one OS process each; inproc: greenlets under the seeded
scheduler); returns the Verdict; and removes everything of the run, whatever happened.
"""

from __future__ import annotations

import os
import posix
import shutil
import sys
import tempfile
import time
from contextlib import nullcontext
from typing import Any, TextIO

from commsim.errors import UserError
from commsim.procs import tree
from commsim.sim import shm
from commsim.launch.bootstrap import make_run_dirs, write_sitecustomize
from commsim.launch.config import RunConfig
from commsim.launch.rank_env import rank_env, run_mark
from commsim.launch import zygote
from commsim.launch.inproc import run_inproc
from commsim.launch.procs import run_procs
from commsim.launch.torchrun_flags import advice, launcher_in
from commsim.launch.verdict import Verdict

PYTHONS = ("python", "python3", os.path.basename(sys.executable))


def split_command(argv: list[str], *, prefix: str = "commsim exec --machine PRESET",
                  placement: bool = True) -> list[str]:
    """`python prog.py ARGS` / `python -m mod ARGS` -> what follows the interpreter. A
    torchrun line is refused with the commsim command that runs its program: `prefix` (the
    command up to its own flags), with torchrun's placement flags when `placement`."""
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise UserError("no program: add `-- python prog.py ARGS` (or `-- python -m module ARGS`)")
    if launcher_in(argv):
        raise UserError(advice(argv, prefix, placement))
    if os.path.basename(argv[0]) in PYTHONS or argv[0] == sys.executable:
        argv = argv[1:]
    elif not argv[0].endswith(".py") and argv[0] != "-m":
        raise UserError(f"commsim exec hosts Python programs: give `-- python {' '.join(argv)}` "
                        f"with a .py file or -m module (got {argv[0]!r})")
    if not argv:
        raise UserError("no program after `python`: give prog.py or -m module")
    if argv[0] == "-m" and len(argv) < 2:
        raise UserError("`python -m` needs a module name")
    if argv[0] != "-m" and not os.path.isfile(argv[0]):
        raise UserError(f"program {argv[0]!r}: no such file")
    return argv


def _procs_owned(cfg: RunConfig, boot: str, *, out: TextIO, err: TextIO, echo: bool) -> Verdict:
    """run_procs inside the run's owned tree, its ranks forked by this process's warm zygote
    unless the run asks for fresh interpreters; the zygote's descendants are the run's."""
    paths = [cfg.run_dir, str(shm.SHM_DIR / cfg.shm_prefix)]
    prog = cfg.command[0]
    where = os.getcwd() if prog == "-m" else os.path.dirname(os.path.abspath(prog))
    held = (zygote.lease(rank_env(cfg, 0, cfg.cluster(), dict(os.environ), boot, 0), boot,
                         tuple(cfg.preload), where)
            if cfg.zygote else nullcontext((None, "")))
    with held as (z, why):
        with tree.owned_tree(run_mark(cfg), paths, below=[z.pid] if z else [],
                             also=[z.mark] if z else []):
            v = run_procs(cfg, boot, out=out, err=err, echo=echo, zygote=z)
    v.fresh = v.fresh or why or None
    return v


def _again_in_procs(cfg: RunConfig, why: str, reason: str, *, out: TextIO, err: TextIO,
                    echo: bool) -> Verdict:
    """An inproc run that a call only processes can serve ended (`why`: the call and where;
    `reason`: what about it needs processes), run again as processes in a fresh run
    directory (the first run's files and segments are gone with it)."""
    err.write(f"commsim exec: {why}: {reason}; running again in procs mode\n")
    shm.sweep(cfg.shm_prefix)
    shutil.rmtree(cfg.run_dir, ignore_errors=True)
    cfg.mode = "procs"
    cfg.run_dir = tempfile.mkdtemp(prefix=f"commsim-exec-{posix.getpid()}-")
    cfg.shm_prefix = shm.new_prefix()
    make_run_dirs(cfg.run_dir)
    boot = write_sitecustomize(cfg.run_dir)
    cfg.dump(os.path.join(cfg.run_dir, "config.json"))
    v = _procs_owned(cfg, boot, out=out, err=err, echo=echo)
    v.needs_procs, v.procs_reason = why, reason
    return v


def execute(cfg: RunConfig, *, out: TextIO | None = None, err: TextIO | None = None,
            echo: bool = True, target: Any = None,
            procs_command: list[str] | None = None) -> Verdict:
    """Run cfg's program as every rank of its machine; the verdict. Nothing of the run is
    left behind (processes, segments, files). `target`: a callable run as every rank instead
    of the program (inproc mode only); `procs_command`: what runs `target` as a process (the
    plugin's pytest node), for an inproc run that must go on in procs mode."""
    cfg.resolve()
    t0 = time.monotonic()
    shm.sweep_stale()           # what SIGKILLed runs of this user left behind
    tree.sweep_stale_tmp()
    # The launcher's real pid in the name (os.getpid may be a hosted one): a later launch or
    # `commsim clean` knows the run is dead once that process is.
    run_dir = tempfile.mkdtemp(prefix=f"commsim-exec-{posix.getpid()}-")
    cfg.run_dir = run_dir
    cfg.shm_prefix = shm.new_prefix()
    try:
        make_run_dirs(run_dir)
        boot = write_sitecustomize(run_dir)
        cfg.dump(os.path.join(run_dir, "config.json"))
        if cfg.mode == "procs":
            v = _procs_owned(cfg, boot, out=out or sys.stdout, err=err or sys.stderr, echo=echo)
        else:
            with tree.owned_tree(run_mark(cfg), [run_dir, str(shm.SHM_DIR / cfg.shm_prefix)]):
                v = run_inproc(cfg, boot, out=out or sys.stdout, err=err or sys.stderr,
                               echo=echo, target=target)
        if v.needs_procs and (target is None or procs_command):
            if target is not None:
                cfg.command = list(procs_command)
            v = _again_in_procs(cfg, v.needs_procs, v.procs_reason, out=out or sys.stdout,
                                err=err or sys.stderr, echo=echo)
    finally:
        shm.sweep(cfg.shm_prefix)
        shutil.rmtree(cfg.run_dir, ignore_errors=True)     # the procs rerun's, if any
    v.wall_s = time.monotonic() - t0
    return v
