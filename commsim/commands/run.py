"""`commsim run` and `commsim explain`: run scenario files and print what was chosen and why."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..errors import UserError


def _files(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(f for f in p.rglob("*.toml") if "policies" not in f.parts)
        elif p.exists():
            out.append(p)
        else:
            raise UserError(f"{p}: no such file or directory; give a scenario .toml or a folder of them")
    if not out:
        raise UserError(f"no scenario files (*.toml) under {', '.join(paths)}")
    return out


def _table(rows: list[tuple[str, ...]], head: tuple[str, ...]) -> str:
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*head), fmt.format(*("-" * w for w in widths))] +
                     [fmt.format(*r) for r in rows])


def cmd_run(args: argparse.Namespace) -> int:
    from ..scenario.runner import run_scenario
    from ..scenario.schema import load

    files = _files(args.paths)
    if not args.procs and (args.kill or args.stall or args.absent or args.timeout is not None):
        raise UserError("--kill, --stall, --absent and --timeout apply to process mode: add --procs")
    rows, failed = [], 0
    t0 = time.perf_counter()
    for i, f in enumerate(files, 1):
        sc = load(f)
        if args.seed is not None:
            import dataclasses
            sc = dataclasses.replace(sc, seed=args.seed)
        if len(files) > 1 and sys.stderr.isatty():
            print(f"\r[{i}/{len(files)}] {f.name:<50}", end="", file=sys.stderr, flush=True)
        if args.procs:
            from ..procs.launcher import print_progress, run_scenario_procs
            res = run_scenario_procs(sc, policy=args.policy, timeout=args.timeout,
                                     faults=_proc_faults(args),
                                     progress=print_progress if args.verbose or sys.stderr.isatty() else None)
        else:
            res = run_scenario(sc, policy=args.policy)
        if args.expect_failure and not res.expects_failure:
            raise UserError(f"{f}: --expect-failure needs [[expect]] error = ... or leak = true "
                            f"lines that hold under the file's own policy ({sc.policy})")
        ok = res.ok   # under --expect-failure: failed exactly as the file expects
        backends = sorted({b for b in res.backends.values() if b})
        status = "ok" if ok else "FAIL"
        failed += not ok
        rows.append((status, "shortcut fails as expected" if res.expects_failure else "must pass",
                     sc.name, sc.topology_spec or "-", str(sc.world_size),
                     ",".join(g.name for g in sc.groups), ",".join(backends) or "-",
                     str(len(res.errors)), str(len(res.leaks))))
        if args.verbose or not ok:
            _report(res, args, to=sys.stdout)
    if len(files) > 1 and sys.stderr.isatty():
        print("\r" + " " * 60 + "\r", end="", file=sys.stderr)
    print(_table(rows, ("status", "judged as", "scenario", "topology", "world", "groups", "backends", "errors", "leaks")))
    print(f"\n{len(files)} scenario(s), {len(files) - failed} ok, {failed} failed "
          f"in {time.perf_counter() - t0:.1f} s")
    return 1 if failed else 0


def _proc_faults(args: argparse.Namespace):
    from ..procs.faults import ProcFaults, parse_rank_step
    kill = dict(parse_rank_step(t, "--kill") for t in args.kill)
    stall = dict(parse_rank_step(t, "--stall") for t in args.stall)
    return ProcFaults(kill=kill, stall=stall, absent=frozenset(args.absent))


def _report(res, args, to) -> None:
    sc = res.scenario
    print(f"\n== {sc.name} ({sc.path}) ==", file=to)
    for g, text in res.explain.items():
        print(text, file=to)
    shown = set()
    for e in res.errors:
        print(f"  error: rank {e.rank} (GPU {sc.placement[e.rank]}) at step {e.step}: {e.name}: {e.message}", file=to)
        if e.trace and e.trace not in shown:
            shown.add(e.trace)
            print(f"  decision trace (rank {e.rank}):\n{e.trace}", file=to)
    for f in res.failures:
        print(f"  FAIL: {f}", file=to)
    for l in res.leaks[:10]:
        print(f"  leak: {l}", file=to)
    for fl in res.flags[:10]:
        print(f"  flag: {fl}", file=to)
    if res.failures or res.errors or res.leaks:
        print(f"  replay: {res.replay_command()}", file=to)


def cmd_explain(args: argparse.Namespace) -> int:
    from ..scenario.runner import run_scenario
    from ..scenario.schema import load

    files = _files(args.paths)
    sizes = None
    if args.sizes is not None or args.plot is not None:
        from ..size_tables import parse_size_range
        sizes = parse_size_range(args.sizes or "4KiB..256MiB")
    if args.plot is not None and len(files) != 1:
        raise UserError(f"--plot {args.plot}: give exactly one scenario file (got {len(files)})")
    if args.plot is not None and args.plot.suffix.lower() != ".png":
        raise UserError(f"--plot {args.plot}: give a .png file name")
    for f in files:
        sc = load(f)
        res = run_scenario(sc, policy=args.policy)
        _report(res, args, to=sys.stdout)
        rows = [(k[0], k[1], str(k[2]), k[3], b or "-") for k, b in sorted(res.backends.items())]
        if rows:
            print(_table(rows, ("group", "op", "bytes", "dtype", "backend")))
        print(f"ledger after close: {'zero' if not res.leaks else f'{len(res.leaks)} item(s) leaked'}; "
              f"numerics: {'ok' if not res.mismatches else f'{len(res.mismatches)} mismatch(es)'}")
        if sizes is not None:
            _explain_sizes(sc, args, sizes)
    return 0


def _explain_sizes(sc, args: argparse.Namespace, sizes: list[int]) -> None:
    """Predicted time per legal backend over `sizes`, per group (commsim.cost_model)."""
    from ..size_tables import render, size_table
    from ..policy import resolve

    pol = resolve(args.policy if args.policy is not None else sc.policy,
                  sc.path.parent if sc.path is not None else None)
    tables = []
    for g in sc.groups:
        if len(g.ranks) < 2:
            continue
        placement = [sc.placement[r] for r in g.ranks]
        tables.append(size_table(sc.cluster, placement, g.name, sizes, pol, seed=sc.seed))
    for t in tables:
        print()
        print(render(t))
    if args.plot is not None and tables:
        from ..plot import plot_size_tables
        out = plot_size_tables(tables, args.plot, title=sc.name)
        print(f"\nwrote {out}")


def register(sub: argparse._SubParsersAction) -> None:
    for name, fn, hlp in (
        ("run", cmd_run, "run scenario files (or folders of them) and print a summary table"),
        ("explain", cmd_explain, "run scenarios and print, per group, the backend chosen per op "
                                 "and size with the reasons, the result check and the ledger"),
    ):
        p = sub.add_parser(name, help=hlp, description=hlp)
        p.add_argument("paths", nargs="+", metavar="SCENARIO", help="scenario .toml file or folder")
        p.add_argument("--policy", default=None,
                       help="override the scenario's policy: a preset name or module:object")
        p.add_argument("--seed", type=int, default=None, help="override the scenario's seed")
        if name == "explain":
            p.add_argument("--sizes", default=None, metavar="LO..HI",
                           help="also print, per group, the predicted all-reduce time of each "
                                "legal backend at every power of two in LO..HI (e.g. "
                                "4KiB..256MiB), the backend chosen at each size and the model's "
                                "crossover points (commsim.cost_model)")
            p.add_argument("--plot", type=Path, default=None, metavar="OUT.png",
                           help="render the same as a PNG (matplotlib); implies --sizes "
                                "4KiB..256MiB if not given")
        if name == "run":
            p.add_argument("--expect-failure", action="store_true",
                           help="succeed only if each scenario fails (for regression files run "
                                "under their shortcut policy)")
            p.add_argument("-v", "--verbose", action="store_true", help="print each scenario's explanation")
            pg = p.add_argument_group("process mode (docs/processes.md)")
            pg.add_argument("--procs", action="store_true",
                            help="run every rank as its own OS process (shared-memory device memory, "
                                 "torch.distributed store; docs/processes.md)")
            pg.add_argument("--timeout", type=float, default=None, metavar="S",
                            help="with --procs: seconds any one wait may take before the run reports "
                                 "a timeout naming the missing ranks (default 60)")
            pg.add_argument("--kill", action="append", default=[], metavar="RANK@STEP",
                            help="with --procs: SIGKILL rank RANK when it reaches a collective whose "
                                 "tag contains STEP (e.g. 3@ipc.init); repeatable")
            pg.add_argument("--stall", action="append", default=[], metavar="RANK@STEP",
                            help="with --procs: rank RANK stops responding at STEP (a store timeout "
                                 "for its peers); repeatable")
            pg.add_argument("--absent", action="append", default=[], type=int, metavar="RANK",
                            help="with --procs: rank RANK is never started (never joins); repeatable")
        p.set_defaults(func=fn)
