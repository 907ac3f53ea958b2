"""`commsim sweep`: generate scenarios, run each, judge it against the oracle, report.

Exit status 0 when every scenario is clean, 1 when any failed (each failure is printed with
the `commsim replay <id>` command that reproduces it), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import sys

from .exec import seconds


def cmd_sweep(args: argparse.Namespace) -> int:
    from ..scenario.sweep import Progress, run_sweep, select_ids

    if args.exec:
        return cmd_sweep_exec(args)
    if args.exec_args:
        from ..errors import UserError
        raise UserError(f"unexpected argument(s) {' '.join(args.exec_args)!r}: program arguments "
                        f"need --exec PROG (e.g. --exec prog.py -- --fix)")

    ids = select_ids(args.count, seed=args.seed, filters=args.filter or (),
                     enumerate_=args.enumerate, start=args.start)
    prog = Progress(len(ids), sys.stderr, every_s=args.progress_every) if not args.quiet else None
    det = "all" if args.determinism else ("none" if args.no_determinism else "sample")
    rep = run_sweep(ids, jobs=args.jobs, determinism=det, progress=prog)
    rep.seed = None if args.enumerate else args.seed
    rep.filters = list(args.filter or ())
    print(rep.summary())
    if args.json:
        rep.write_json(args.json)
        print(f"JSON report: {args.json}")
    if args.html:
        rep.write_html(args.html)
        print(f"HTML backend map: {args.html}")
    return 1 if rep.failed else 0


def cmd_sweep_exec(args: argparse.Namespace) -> int:
    """`--exec PROG`: the user's program over generated machines instead of scenarios."""
    import shlex

    from ..hosting.run import split_command
    from ..hosting.sweep_exec import progress_printer, run_exec_sweep
    from ..scenario.sweep import select_ids

    program = split_command(shlex.split(args.exec) + list(args.exec_args or ()))
    ids = select_ids(args.count, seed=args.seed, filters=args.filter or (),
                     enumerate_=args.enumerate, start=args.start)
    say = None if args.quiet else progress_printer(len(ids))
    rep = run_exec_sweep(program, ids, mode=args.exec_mode, timeout=args.exec_timeout,
                         progress=say)
    print(rep.summary())
    if args.json:
        import json

        from ..fileio import write_atomic
        write_atomic(args.json, json.dumps({"program": program, "records": rep.records}, indent=1),
                     overwrite=True)
        print(f"JSON report: {args.json}")
    return 1 if rep.defects else 0


def register(sub: argparse._SubParsersAction) -> None:
    hlp = "run many generated scenarios against the oracle and report failures with replay ids"
    p = sub.add_parser(
        "sweep", help=hlp,
        description=hlp + ". Scenarios come from the seeded sampler (ids s<seed>-<index>) or, "
                    "with --enumerate, the deterministic enumeration (ids e<index>). Each is "
                    "checked: the backend is legal and the best legal one under the policy, no "
                    "unexpected CUDA error, results equal the float64 reference, the ledger is "
                    "zero after close, and (1 in 20, or all with --determinism) the same seed "
                    "gives the same trace.")
    p.add_argument("--count", type=int, default=1000, metavar="N", help="scenarios to run (default 1000)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="sampler seed (default 0)")
    p.add_argument("--jobs", type=int, default=1, metavar="J",
                   help="worker processes (default 1: in this process)")
    p.add_argument("--filter", action="append", metavar="SUBSTR",
                   help="keep scenarios whose tags contain SUBSTR (machine shape, layout such as "
                        "tp8 or xdp2, placement, op, dtype, fault kind, capture/eager, "
                        "multihost/onehost); repeat to require several")
    p.add_argument("--enumerate", action="store_true",
                   help="use the deterministic enumeration instead of the sampler")
    p.add_argument("--start", type=int, default=0, metavar="I", help="first index (default 0)")
    p.add_argument("--determinism", action="store_true", help="run every scenario twice")
    p.add_argument("--no-determinism", action="store_true", help="never run a scenario twice")
    p.add_argument("--json", metavar="OUT.json", help="write the JSON report here")
    p.add_argument("--html", metavar="OUT.html", help="write the HTML backend map here")
    p.add_argument("--quiet", action="store_true", help="no progress output on stderr")
    p.add_argument("--progress-every", type=float, default=10.0, metavar="SECONDS",
                   help="when stderr is not a terminal, print a progress line this often (default 10)")
    p.add_argument("--exec", metavar="PROG", default=None,
                   help="run this Python program (\"prog.py ARGS\", or \"-m module ARGS\") hosted on "
                        "each generated machine instead of the scenario workload, and report "
                        "the machine shapes that break it (see `commsim exec`)")
    p.add_argument("--exec-mode", default="inproc", choices=("inproc", "procs"),
                   help="how --exec runs the ranks (default inproc: fast, replayable)")
    p.add_argument("--exec-timeout", type=seconds, default=60.0, metavar="S",
                   help="seconds before an --exec run counts as hung (default 60)")
    p.add_argument("exec_args", nargs="*", metavar="ARG",
                   help="arguments for the --exec program (after --)")
    p.set_defaults(func=cmd_sweep)
