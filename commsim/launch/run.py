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
import socket
import sys
import tempfile
import time
from typing import Any, TextIO

from commsim.procs import tree
from commsim.sim import shm
from commsim.launch.bootstrap import make_run_dirs, write_sitecustomize
from commsim.launch.config import RunConfig
from commsim.launch.verdict import Verdict

PYTHONS = ("python", "python3", os.path.basename(sys.executable))
_COMMSIM_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def split_command(argv: list[str], *, prefix: str = "commsim exec --machine PRESET",
                  placement: bool = True) -> list[str]:
    """`python prog.py ARGS` / `python -m mod ARGS` -> what follows the interpreter. A
    torchrun line is refused with the commsim command that runs its program: `prefix` (the
    command up to its own flags), with torchrun's placement flags when `placement`."""
    from commsim.errors import UserError
    from commsim.launch.torchrun_flags import advice, launcher_in
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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _loopback_ifname() -> str | None:
    try:
        names = [n for _, n in socket.if_nameindex()]
    except OSError:
        return None
    return "lo" if "lo" in names else next((n for n in names if n.startswith("lo")), None)


def visible_of(cfg: RunConfig, rank: int, cluster: Any) -> tuple[int, ...]:
    host, gi = cfg.placement[rank]
    if cfg.visible == "one":
        return (gi,)
    return tuple(g.index for g in cluster.host(host).gpus)


_LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                  "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR",
                  "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
                  "TORCHELASTIC_MAX_RESTARTS", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                  "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                  "OMPI_COMM_WORLD_NODE_RANK", "OMPI_UNIVERSE_SIZE")


def launcher_env(cfg: RunConfig, rank: int, port: int) -> dict[str, str]:
    """What the launcher itself tells a rank: torchrun's variables, or Open MPI mpirun's."""
    lr, lws = cfg.local_rank(rank)
    if cfg.launcher == "mpirun":
        # Open MPI sets these on every process it starts ("Environment variables set for MPI
        # applications", Open MPI 5.0 docs, tuning-apps/environment-var). NODE_RANK counts
        # across all jobs on the node; a hosted run is the node's only job, so it equals
        # the local rank. UNIVERSE_SIZE: the slots allocated, here the ranks placed.
        return dict(OMPI_COMM_WORLD_SIZE=str(cfg.world_size), OMPI_COMM_WORLD_RANK=str(rank),
                    OMPI_COMM_WORLD_LOCAL_SIZE=str(lws), OMPI_COMM_WORLD_LOCAL_RANK=str(lr),
                    OMPI_COMM_WORLD_NODE_RANK=str(lr), OMPI_UNIVERSE_SIZE=str(cfg.world_size))
    return dict(
        RANK=str(rank), LOCAL_RANK=str(lr), WORLD_SIZE=str(cfg.world_size),
        LOCAL_WORLD_SIZE=str(lws), GROUP_RANK=str(cfg.host_index(rank)),
        GROUP_WORLD_SIZE=str(cfg.num_hosts), ROLE_RANK=str(rank), ROLE_NAME="default",
        ROLE_WORLD_SIZE=str(cfg.world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
        TORCHELASTIC_RUN_ID=f"commsim-{os.path.basename(cfg.run_dir)}",
        TORCHELASTIC_RESTART_COUNT="0", TORCHELASTIC_MAX_RESTARTS="0")


def run_mark(cfg: RunConfig) -> str:
    """The environment entry every process of the run carries, whatever it starts or however
    it daemonizes: how procs/tree.py finds them all."""
    return f"COMMSIM_HOSTING={os.path.join(cfg.run_dir, 'config.json')}"


def rank_env(cfg: RunConfig, rank: int, cluster: Any, base: dict[str, str], boot_dir: str,
             port: int) -> dict[str, str]:
    """The environment the launcher gives a rank, plus what hosting needs."""
    host, gi = cfg.placement[rank]
    env = dict(base)
    mine = launcher_env(cfg, rank, port)
    for k in _LAUNCHER_VARS:      # an outer launcher's variables must not leak into a rank
        if k not in mine:
            env.pop(k, None)
    env.update(mine)
    env.update(
        OMP_NUM_THREADS=base.get("OMP_NUM_THREADS", "1"),
        COMMSIM_HOSTING=run_mark(cfg).split("=", 1)[1],
        COMMSIM_HOSTING_RANK=str(rank), COMMSIM_HOSTING_SLOT=str(rank),
        COMMSIM_HOSTING_HOST=host,
        COMMSIM_HOSTING_VISIBLE=",".join(str(i) for i in visible_of(cfg, rank, cluster)),
        PYTHONPATH=os.pathsep.join([boot_dir, _COMMSIM_ROOT] +
                                   ([base["PYTHONPATH"]] if base.get("PYTHONPATH") else [])),
        TORCH_CPP_LOG_LEVEL=base.get("TORCH_CPP_LOG_LEVEL", "ERROR"),
    )
    lo = _loopback_ifname()
    if lo and "GLOO_SOCKET_IFNAME" not in base:
        env["GLOO_SOCKET_IFNAME"] = lo      # gloo listens on loopback only
    if cfg.visible == "one":
        env["CUDA_VISIBLE_DEVICES"] = str(gi)
    else:
        env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def _again_in_procs(cfg: RunConfig, why: str, *, out: TextIO, err: TextIO,
                    echo: bool) -> Verdict:
    """An inproc run that a blocking socket between ranks ended, run again as processes in a
    fresh run directory (the first run's files and segments are gone with it)."""
    from commsim.launch.procs import run_procs
    err.write(f"commsim exec: {why}: blocking sockets between ranks need real processes; "
              f"running again in procs mode\n")
    shm.sweep(cfg.shm_prefix)
    shutil.rmtree(cfg.run_dir, ignore_errors=True)
    cfg.mode = "procs"
    cfg.run_dir = tempfile.mkdtemp(prefix=f"commsim-exec-{posix.getpid()}-")
    cfg.shm_prefix = shm.new_prefix()
    make_run_dirs(cfg.run_dir)
    boot = write_sitecustomize(cfg.run_dir)
    cfg.dump(os.path.join(cfg.run_dir, "config.json"))
    with tree.owned_tree(run_mark(cfg), [cfg.run_dir, str(shm.SHM_DIR / cfg.shm_prefix)]):
        v = run_procs(cfg, boot, out=out, err=err, echo=echo)
    v.needs_procs = why
    return v


def execute(cfg: RunConfig, *, out: TextIO | None = None, err: TextIO | None = None,
            echo: bool = True, target: Any = None) -> Verdict:
    """Run cfg's program as every rank of its machine; the verdict. Nothing of the run is
    left behind (processes, segments, files). `target`: a callable run as every rank instead
    of the program (inproc mode only)."""
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
        with tree.owned_tree(run_mark(cfg), [run_dir, str(shm.SHM_DIR / cfg.shm_prefix)]):
            if cfg.mode == "procs":
                from commsim.launch.procs import run_procs
                v = run_procs(cfg, boot, out=out or sys.stdout, err=err or sys.stderr, echo=echo)
            else:
                from commsim.launch.inproc import run_inproc
                v = run_inproc(cfg, boot, out=out or sys.stdout, err=err or sys.stderr, echo=echo,
                               target=target)
        if v.needs_procs and target is None:
            v = _again_in_procs(cfg, v.needs_procs, out=out or sys.stdout,
                                err=err or sys.stderr, echo=echo)
    finally:
        shm.sweep(cfg.shm_prefix)
        shutil.rmtree(cfg.run_dir, ignore_errors=True)     # the procs rerun's, if any
    v.wall_s = time.monotonic() - t0
    return v
