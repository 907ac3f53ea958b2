"""`commsim exec`: run a Python program, unmodified, as the ranks of a simulated machine."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from commsim.errors import UserError
from commsim.launch.config import MODES, RESIDUE, VISIBLE
from commsim.launch.torchrun_flags import add_aliases, with_nnodes
from commsim.commands.args import add_version_flags, seconds, seed, version_flags

EPILOG = """\
examples:
  commsim exec --machine gb200-nvl72:2 --nproc-per-host 4 -- python prog.py
  commsim exec --machine hgx-h100-8 --mode inproc --seed 3 -- python -m mypkg.worker --tp 8
  commsim exec --machine gb200-nvl72:2 --nproc-per-host 1 --visible one -- python prog.py
  commsim exec --launcher mpirun --machine gb200-nvl72:2 --nproc-per-host 4 -- python mpi_prog.py

Each rank gets torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
GROUP_RANK, MASTER_ADDR/PORT ...) or, with --launcher mpirun, Open MPI's (OMPI_COMM_WORLD_*),
its simulated host's hostname and /dev/shm, and CUDA, NVML, torch.distributed and mpi4py
answered by the simulated machine. At the end: a verdict per rank
(exit status, first CUDA error and where the program made the call, hangs, residue at exit)
and the command that replays the run. A failing run's verdict leads with the root cause (the
first failing rank, its error, where and why, in the machine's terms), then the ranks that
failed the same way and the knock-on failures; -v lists every process. Exit status 1 when
any rank failed."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "exec", help="run a program as the ranks of a simulated machine (torchrun-shaped)",
        description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--machine", default="", metavar="PRESET[:HOSTS]",
                   help="preset, optionally its first HOSTS hosts: gb200-nvl72:2, hgx-h100-8")
    p.add_argument("--scenario", default="", metavar="FILE",
                   help="scenario .toml, or a generated scenario id from `commsim sweep --exec` "
                        "(s<seed>-<index>): topology, placement of the ranks, faults and seed")
    p.add_argument("--nproc-per-host", type=int, default=0, metavar="N",
                   help="ranks per host (default: one per GPU); torchrun's --nproc-per-node "
                        "and --nnodes N (the machine's first N hosts) are accepted too")
    p.add_argument("--mode", default="procs", choices=MODES,
                   help="procs: one OS process per rank, real torch.distributed (gloo); "
                        "inproc: ranks as greenlets under the seeded scheduler (deterministic)")
    p.add_argument("--seed", type=seed, default=None, help="seed of the run (default 0, or the scenario's)")
    p.add_argument("--timeout", type=seconds, default=120.0, metavar="S",
                   help="seconds before ranks still running count as hung (default 120)")
    p.add_argument("--visible", default="all", type=_visible, metavar="all|one|LIST",
                   help="GPUs a rank sees: all of its host's (torchrun), only its own "
                        "(CUDA_VISIBLE_DEVICES=<gpu>, as Ray places ranks), or a "
                        "CUDA_VISIBLE_DEVICES list for every rank, any length and order "
                        "(3,1: local rank 0 drives GPU 3, local rank 1 GPU 1; more ranks than "
                        "GPUs share them; CUDA hides every entry from the first invalid one); "
                        "entries may be GPU- UUIDs or a unique prefix; one list per rank "
                        "joined by ';' gives each rank its own (it drives its ordinal 0)")
    p.add_argument("--residue", default="report", choices=RESIDUE,
                   help="allocations, mappings and fds a process still holds at exit: report "
                        "them (default: the process's exit releases them, as on real hardware) "
                        "or fail the run on them (for code that must clean up, e.g. one that "
                        "re-creates its communicators)")
    p.add_argument("--launcher", default="torchrun", metavar="torchrun|mpirun",
                   help="whose environment each rank gets: torchrun's (RANK, LOCAL_RANK, "
                        "WORLD_SIZE, MASTER_ADDR/PORT ...; default) or Open MPI mpirun's "
                        "(OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE, _NODE_RANK), "
                        "with mpi4py's COMM_WORLD spanning the ranks")
    p.add_argument("--fresh-interpreters", action="store_true",
                   help="procs mode: start every rank as a fresh interpreter instead of forking "
                        "it from the warm zygote (which imported torch and commsim's hosting once)")
    p.add_argument("--preload", action="append", default=[], metavar="MODULE",
                   help="procs mode: a module of the program the zygote imports before it forks "
                        "(repeatable; opt-in: such a module sees the zygote's environment, not "
                        "its rank's, so never one that reads RANK, LOCAL_RANK, "
                        "CUDA_VISIBLE_DEVICES or the hostname at import)")
    p.add_argument("--allow-undefined", action="store_true",
                   help="pass a run that hit undefined behaviour (a plain load or store through "
                        "a multicast address, memory used after its exporter freed it); by "
                        "default such a run fails and the verdict says where it happened")
    p.add_argument("--quiet", action="store_true", help="do not echo the ranks' output")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="a failing run's verdict lists every process (its error, notes, hang "
                        "diagnosis and residue) after the root cause")
    p.add_argument("--junit-xml", metavar="FILE",
                   help="also write the verdict as JUnit XML (one test case per rank, the "
                        "root cause and the replay command in each failure) for CI")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="-- python prog.py ARGS  (or -- python -m module ARGS)")
    add_version_flags(p, "over the scenario's [versions]")
    add_aliases(p)
    p.set_defaults(func=run)


def _visible(text: str) -> str:
    from commsim.launch.visible_devices import is_list
    if text in VISIBLE or is_list(text):
        return text
    raise argparse.ArgumentTypeError(f"{text!r}: give all, one, or a CUDA_VISIBLE_DEVICES "
                                     f"list of host GPU indices or GPU- UUIDs such as 3,1 "
                                     f"(one per rank joined by ';': 0,1;1,0)")


def run(args: argparse.Namespace) -> int:
    from commsim.launch.config import RunConfig
    from commsim.launch.run import execute, split_command
    if args.machine and args.scenario:
        raise UserError(f"--machine {args.machine} with --scenario {args.scenario}: the scenario "
                        f"names its machine ([topology]); give one of the two")
    if args.nproc_per_host < 0:
        raise UserError(f"--nproc-per-host: must be >= 1, got {args.nproc_per_host}")
    machine = args.machine
    if getattr(args, "nnodes", None):
        machine = with_nnodes(machine, args.nnodes, args.scenario)
    where = f"--scenario {args.scenario}" if args.scenario else f"--machine {machine or 'PRESET'}"
    cfg = RunConfig(machine=machine, scenario=args.scenario,
                    nproc_per_host=args.nproc_per_host, mode=args.mode,
                    seed=args.seed or 0, visible=args.visible, timeout=args.timeout,
                    residue=args.residue, launcher=args.launcher, versions=version_flags(args),
                    allow_undefined=args.allow_undefined,
                    zygote=not args.fresh_interpreters, preload=list(args.preload),
                    command=split_command(list(args.command), prefix=f"commsim exec {where}"))
    if args.junit_xml:
        from commsim.util.fileio import check_output
        check_output(args.junit_xml, "--junit-xml")
    v = execute(cfg, echo=not args.quiet)
    print(v.format(verbose=args.verbose), file=sys.stderr, flush=True)
    if args.junit_xml:
        from commsim.report.junit import write_junit
        write_junit(args.junit_xml, f"commsim exec {cfg.machine or cfg.scenario}",
                    verdict_cases(v), v.wall_s)
    return v.exit_code


def verdict_cases(v: Any) -> list:
    """One JUnit test case per process of the run: a failed one carries its own error, the
    run's root cause and the replay command."""
    from commsim.launch.cause import root_cause_lines
    from commsim.report.junit import Case
    cls = f"commsim.exec.{v.cfg.machine or v.cfg.scenario}"
    why = "\n".join(root_cause_lines(v) + [f"replay: {v.cfg.replay_command()}"])
    return [Case(cls, f"worker {p.slot} of rank {p.rank}" if p.worker else f"rank {p.rank}",
                 None if p.ok else p.headline(), why) for p in v.procs]
