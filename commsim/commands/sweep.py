"""`commsim sweep`: generate scenarios, run each, judge it against the oracle, report.

Exit status 0 when every scenario is clean, 1 when any failed (each failure is printed with
the `commsim replay <id>` command that reproduces it), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import sys


def cmd_sweep(args: argparse.Namespace) -> int:
    from ..errors import UserError
    from ..scenario.executors import shard
    from ..scenario.sweep import Progress, run_sweep, select_ids

    if args.action == "merge":
        return _merge(args)
    if args.reports:
        raise UserError(f"sweep: unexpected argument(s) {' '.join(args.reports)}; to merge shard "
                        f"reports, run `commsim sweep merge A.json B.json ...`")
    if args.ray_address and args.executor != "ray":
        raise UserError("--ray-address needs --executor ray")
    ids = shard(select_ids(args.count, seed=args.seed, filters=args.filter or (),
                           enumerate_=args.enumerate, start=args.start), args.shard)
    prog = Progress(len(ids), sys.stderr, every_s=args.progress_every) if not args.quiet else None
    det = "all" if args.determinism else ("none" if args.no_determinism else "sample")
    rep = run_sweep(ids, jobs=args.jobs, determinism=det, progress=prog, executor=args.executor,
                    ray_address=args.ray_address)
    rep.seed = None if args.enumerate else args.seed
    rep.filters = list(args.filter or ())
    rep.shard = args.shard
    return _emit(rep, args)


def _merge(args: argparse.Namespace) -> int:
    from ..scenario.executors import merge
    rep = merge(args.reports)
    print(f"merged {len(args.reports)} report(s)")
    return _emit(rep, args)


def _emit(rep, args: argparse.Namespace) -> int:
    print(rep.summary())
    if args.json:
        rep.write_json(args.json)
        print(f"JSON report: {args.json}")
    if args.html:
        rep.write_html(args.html)
        print(f"HTML backend map: {args.html}")
    return 1 if rep.failed else 0


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
    p.add_argument("action", nargs="?", choices=["merge"],
                   help="merge: combine the JSON reports of a sharded sweep into one (with --json, "
                        "--html); without it, run a sweep")
    p.add_argument("reports", nargs="*", metavar="REPORT.json", help="shard reports to merge")
    p.add_argument("--count", type=int, default=1000, metavar="N", help="scenarios to run (default 1000)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="sampler seed (default 0)")
    p.add_argument("--jobs", type=int, default=1, metavar="J",
                   help="worker processes (default 1: in this process)")
    p.add_argument("--filter", action="append", metavar="SUBSTR",
                   help="keep scenarios whose tags contain SUBSTR (machine shape, layout such as "
                        "tp8 or xdp2, placement, op, dtype, fault kind, capture/eager, "
                        "multihost/onehost); repeat to require several")
    p.add_argument("--executor", choices=["local", "ray"], default="local",
                   help="local: this process or --jobs worker processes (default); ray: Ray tasks "
                        "on a local Ray with --jobs CPUs started here, or on --ray-address "
                        "(pip install 'commsim[ray]'). Ray's own servers listen on every "
                        "interface, with Ray's token authentication")
    p.add_argument("--ray-address", metavar="ADDR",
                   help="an existing Ray cluster for --executor ray ('auto' or host:port)")
    p.add_argument("--shard", metavar="K/N",
                   help="run only the K-th of N interleaved slices of the sweep (CI matrices); "
                        "combine the --json reports with `commsim sweep merge`")
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
    p.set_defaults(func=cmd_sweep)
