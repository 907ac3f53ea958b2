"""`commsim sweep`: generate scenarios, run each, judge it against the oracle, report.

Exit status 0 when every scenario is clean, 1 when any failed (each failure is printed with
the `commsim replay <id>` command that reproduces it), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import sys

from commsim.launch.config import LAUNCHERS, MODES, RESIDUE
from commsim.commands.args import add_version_flags, bounded_int, non_negative_int, seconds, seed, version_flags

# A sweep keeps one record per scenario (about 1 KB) for its report; a million is hours of work
# and about a GB of records, which is where a mistyped count should stop.
MAX_COUNT = 1_000_000


def cmd_sweep(args: argparse.Namespace) -> int:
    from commsim.errors import UserError
    from commsim.util.fileio import check_output
    from commsim.scenario.executors import shard
    from commsim.scenario.sweep import Progress, run_sweep, select_ids, settle_heap

    _exec_flags(args)
    _positionals(args)
    if args.ray_address and args.executor != "ray":
        raise UserError("--ray-address needs --executor ray")
    # Output paths are checked before the sweep, not after it (a late failure loses the run).
    if args.json:
        check_output(args.json, "--json")
    if args.html:
        check_output(args.html, "--html", suffix=".html")
    if args.junit_xml:
        check_output(args.junit_xml, "--junit-xml")
    if args.action == "merge":
        return _merge(args)
    if args.exec is not None:
        if args.executor != "local":
            raise UserError("--exec runs the program in local worker processes; drop "
                            "--executor ray (it applies to scenario sweeps only)")
        return cmd_sweep_exec(args)

    ids = shard(select_ids(args.count, seed=args.seed, filters=args.filter or (),
                           enumerate_=args.enumerate, start=args.start), args.shard)
    prog = Progress(len(ids), sys.stderr, every_s=args.progress_every) if not args.quiet else None
    det = "all" if args.determinism else ("none" if args.no_determinism else "sample")
    if args.jobs == 1 and args.executor == "local":
        settle_heap()        # the scenarios run in this process, which exits after the report
    rep = run_sweep(ids, jobs=args.jobs, determinism=det, progress=prog, executor=args.executor,
                    ray_address=args.ray_address, versions=tuple(version_flags(args).items()))
    rep.seed = None if args.enumerate else args.seed
    rep.filters = list(args.filter or ())
    rep.shard = args.shard
    return _emit(rep, args)


# The --exec-* flags and their defaults: None in the parser, so that one given without
# --exec is seen (and refused) rather than ignored by the plain sweep.
_EXEC_DEFAULTS = {"exec_mode": "inproc", "exec_timeout": 60.0, "exec_residue": "report",
                  "exec_launcher": "torchrun"}


def _exec_flags(args: argparse.Namespace) -> None:
    """Refuse an empty --exec and --exec-* without --exec; fill in the --exec-* defaults."""
    from commsim.errors import UserError
    given = [k for k in _EXEC_DEFAULTS if getattr(args, k) is not None]
    if args.exec is None and given:
        flag = "--" + given[0].replace("_", "-")
        raise UserError(f"{flag} applies to sweep --exec PROG only; add --exec PROG or drop {flag}")
    if args.exec is not None and not args.exec.strip():
        raise UserError("--exec '': give the program to run, e.g. --exec prog.py or "
                        "--exec '-m mypkg.worker'")
    parsed = vars(args)
    for key, default in _EXEC_DEFAULTS.items():
        if parsed[key] is None:
            parsed[key] = default


def _positionals(args: argparse.Namespace) -> None:
    """Sort the positional words: the --exec program's arguments, or `merge REPORT.json ...`;
    anything else is refused with both uses named."""
    from commsim.errors import UserError

    words = list(args.words or ())
    args.action, args.reports, args.exec_args = None, [], []
    if args.exec is not None:
        args.exec_args = words
    elif words[:1] == ["merge"]:
        args.action, args.reports = "merge", words[1:]
    elif words:
        raise UserError(f"sweep: unexpected argument(s) {' '.join(words)!r}: to merge shard reports "
                        f"run `commsim sweep merge A.json B.json ...`; program arguments need "
                        f"--exec PROG (e.g. --exec prog.py -- --fix)")


def _merge(args: argparse.Namespace) -> int:
    """Shards of a scenario sweep, or of one `sweep --exec` (never the two mixed)."""
    import json

    from commsim.errors import UserError
    from commsim.launch.sweep_exec import is_exec_report, merge_reports
    from commsim.util.fileio import read_input
    from commsim.scenario.executors import merge
    kinds = {}
    for p in args.reports:
        try:
            kinds[p] = is_exec_report(json.loads(read_input(p)))
        except (OSError, ValueError, RecursionError, UserError):
            kinds[p] = False      # the scenario merge names what is wrong with it
    if len(set(kinds.values())) > 1:
        ex = next(p for p, e in kinds.items() if e)
        sc = next(p for p, e in kinds.items() if not e)
        raise UserError(f"sweep merge: {ex} is a `sweep --exec` report, {sc} a scenario sweep's; "
                        f"merge the shards of one sweep")
    if args.reports and all(kinds.values()):
        _refuse_plain_only(args)
        rep = merge_reports(args.reports)
        print(f"merged {len(args.reports)} report(s)")
        return _emit_exec(rep, args)
    rep = merge(args.reports)
    print(f"merged {len(args.reports)} report(s)")
    return _emit(rep, args)


def _emit(rep, args: argparse.Namespace) -> int:
    print(rep.summary())
    if args.json:
        rep.write_json(args.json)
        print(f"JSON report: {args.json}")
    if args.html:
        from commsim.report.sweep_map import write_html
        write_html(rep, args.html)
        print(f"HTML backend map: {args.html}")
    if args.junit_xml:
        from commsim.report.junit import Case, write_junit
        write_junit(args.junit_xml, "commsim sweep",
                    [Case("commsim.sweep." + r["shape"], r["id"],
                          None if r["ok"] else
                          f"{', '.join(r['kinds'])}: " + (r["failures"][0]["detail"].splitlines()[0]
                                                          if r["failures"] else ""),
                          "\n".join([f["detail"] for f in r["failures"]] + [f"replay: {r['replay']}"]),
                          ", ".join(r.get("kinds", ()))) for r in rep.records], rep.wall_s)
        print(f"JUnit XML: {args.junit_xml}")
    return 1 if rep.failed else 0


def cmd_sweep_exec(args: argparse.Namespace) -> int:
    """`--exec PROG`: the user's program over generated machines instead of scenarios."""
    import shlex

    from commsim.util.fileio import check_output
    from commsim.launch.run import split_command
    from commsim.launch.sweep_exec import progress_printer, run_exec_sweep

    _refuse_plain_only(args)
    if args.junit_xml:
        check_output(args.junit_xml, "--junit-xml")
    program = split_command(shlex.split(args.exec) + list(args.exec_args or ()),
                            prefix="commsim sweep --exec", placement=False)
    if args.exec_mode == "procs":
        # the zygote imports torch while this process does (the generator below loads it)
        from commsim.launch import zygote
        zygote.prestart(program)
    from commsim.scenario.executors import shard
    from commsim.scenario.sweep import select_ids
    ids = shard(select_ids(args.count, seed=args.seed, filters=args.filter or (),
                           enumerate_=args.enumerate, start=args.start, knobs=False), args.shard)
    say = None if args.quiet else progress_printer(len(ids))
    rep = run_exec_sweep(program, ids, mode=args.exec_mode, timeout=args.exec_timeout,
                         residue=args.exec_residue, launcher=args.exec_launcher,
                         progress=say, versions=version_flags(args))
    rep.seed = None if args.enumerate else args.seed
    rep.filters, rep.shard = list(args.filter or ()), args.shard
    return _emit_exec(rep, args)


def _emit_exec(rep, args: argparse.Namespace) -> int:
    from commsim.launch.cause import DEFECTS
    from commsim.util.fileio import write_atomic
    print(rep.summary())
    if args.json:
        import json
        write_atomic(args.json, json.dumps(rep.to_json(), indent=1), overwrite=True)
        print(f"JSON report: {args.json}")
    if args.junit_xml:
        from commsim.report.junit import Case, write_junit
        write_junit(args.junit_xml, f"commsim sweep --exec {' '.join(rep.program)}",
                    [Case("commsim.sweep-exec." + r["shape"], r["id"],
                          None if r["kind"] not in DEFECTS else f"{r['kind']}: {r['what']}",
                          f"replay: {r['replay']}", r["kind"]) for r in rep.records],
                    rep.wall_s)
        print(f"JUnit XML: {args.junit_xml}")
    return 1 if rep.defects else 0


# Plain-sweep flags that --exec has no use for: refused by name rather than ignored.
_NOT_WITH_EXEC = {
    "html": ("--html", "the HTML backend map is of scenario sweeps; use --json or --junit-xml"),
    "jobs": ("--jobs", "--exec runs one generated machine at a time; shard with --shard K/N "
                       "across processes instead"),
    "determinism": ("--determinism", "an --exec run is replayed with its replay command"),
    "no_determinism": ("--no-determinism", "an --exec run is never run twice"),
}


def _refuse_plain_only(args: argparse.Namespace) -> None:
    from commsim.errors import UserError
    defaults = {"html": None, "jobs": 1, "determinism": False, "no_determinism": False}
    for key, (flag, why) in _NOT_WITH_EXEC.items():
        if getattr(args, key) != defaults[key]:
            raise UserError(f"{flag} does not apply to sweep --exec: {why}")


def register(sub: argparse._SubParsersAction) -> None:
    hlp = "run many generated scenarios against the oracle and report failures with replay ids"
    p = sub.add_parser(
        "sweep", help=hlp,
        description=hlp + ". Scenarios come from the seeded sampler (ids s<seed>-<index>; about 1 in 20 "
                    "is a shortcut-policy knob scenario k<seed>-<index>) or, "
                    "with --enumerate, the deterministic enumeration (ids e<index>). Each is "
                    "checked: the backend is legal and the best legal one under the policy, no "
                    "unexpected CUDA error, results equal the float64 reference, the ledger is "
                    "zero after close, and (1 in 20, or all with --determinism) the same seed "
                    "gives the same trace.")
    # One positional list serves both `sweep merge A.json B.json` and `sweep --exec PROG -- ARGS`
    # (two optional positionals would swallow each other's words); _positionals sorts it.
    p.add_argument("words", nargs="*", metavar="merge REPORT.json ... | -- ARG ...",
                   help="`merge A.json B.json ...`: combine the JSON reports of a sharded sweep "
                        "into one (with --json, --html); with --exec: arguments for the program "
                        "(after --)")
    p.add_argument("--count", type=bounded_int(0, MAX_COUNT), default=1000, metavar="N",
                   help=f"scenarios to run (default 1000, at most {MAX_COUNT:,})")
    p.add_argument("--seed", type=seed, default=0, metavar="S",
                   help="sampler seed, an integer >= 0 (default 0)")
    p.add_argument("--jobs", type=bounded_int(1, 256), default=1, metavar="J",
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
                   help="an existing Ray cluster for --executor ray ('auto' or host:port; default: "
                        "Ray's RAY_ADDRESS when set)")
    p.add_argument("--shard", metavar="K/N",
                   help="run only the K-th of N interleaved slices of the sweep (CI matrices); "
                        "combine the --json reports with `commsim sweep merge`")
    p.add_argument("--enumerate", action="store_true",
                   help="use the deterministic enumeration instead of the sampler")
    p.add_argument("--start", type=non_negative_int, default=0, metavar="I",
                   help="first index, >= 0 (default 0)")
    p.add_argument("--determinism", action="store_true", help="run every scenario twice")
    p.add_argument("--no-determinism", action="store_true", help="never run a scenario twice")
    p.add_argument("--json", metavar="OUT.json", help="write the JSON report here")
    p.add_argument("--html", metavar="OUT.html", help="write the HTML backend map here")
    p.add_argument("--junit-xml", metavar="FILE",
                   help="write JUnit XML for CI: one test case per scenario (with --exec: per "
                        "generated machine), the replay command in each failure")
    p.add_argument("--quiet", action="store_true", help="no progress output on stderr")
    p.add_argument("--progress-every", type=seconds, default=10.0, metavar="SECONDS",
                   help="when stderr is not a terminal, print a progress line this often (default 10)")
    p.add_argument("--exec", metavar="PROG", default=None,
                   help="run this Python program (\"prog.py ARGS\", or \"-m module ARGS\") hosted on "
                        "each generated machine instead of the scenario workload, and report "
                        "the machine shapes that break it (see `commsim exec`)")
    p.add_argument("--exec-mode", default=None, choices=MODES,
                   help="how --exec runs the ranks (default inproc: fast, replayable)")
    p.add_argument("--exec-timeout", type=seconds, default=None, metavar="S",
                   help="seconds before an --exec run counts as hung (default 60)")
    p.add_argument("--exec-residue", default=None, choices=RESIDUE,
                   help="what an --exec process holding memory, mappings or fds at exit is: "
                        "reported (default; the exit releases them) or a defect (`leak`)")
    p.add_argument("--exec-launcher", default=None, choices=LAUNCHERS,
                   help="whose environment each --exec rank gets: torchrun's (default) or Open "
                        "MPI mpirun's, with mpi4py's COMM_WORLD spanning the ranks (see "
                        "`commsim exec --launcher`)")
    add_version_flags(p, "over the versions the generator draws for each scenario, or each "
                         "generated machine's with --exec")
    p.set_defaults(func=cmd_sweep)
