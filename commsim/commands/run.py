"""`commsim run` and `commsim explain`: run scenario files and print what was chosen and why."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

from commsim.errors import UserError
from commsim.runtime.diagnosis import rank_word
from commsim.commands.args import add_version_flags, seconds, seed, with_versions


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


def _load_all(files: list[Path]) -> list[Any]:
    """Every file loaded up front, so a broken one is named at once (and the others still
    run) rather than after the ones before it: a Scenario or the UserError per file."""
    from commsim.scenario.schema import load

    out: list[Any] = []
    for f in files:
        try:
            out.append(load(f))
        except UserError as e:
            print(f"commsim: error: {e}", file=sys.stderr)
            out.append(e)
    return out


def _run_one(sc: Any, args: argparse.Namespace) -> Any:
    from commsim.scenario.runner import run_scenario

    if not args.no_memory_check:
        from commsim.scenario.resources import check_fits
        check_fits(sc, procs=args.procs)
    if args.procs:
        from commsim.procs.launcher import print_progress, run_scenario_procs
        return run_scenario_procs(sc, policy=args.policy, timeout=args.timeout,
                                  faults=_proc_faults(args),
                                  progress=print_progress if args.verbose or sys.stderr.isatty()
                                  else None)
    return run_scenario(sc, policy=args.policy)


def cmd_run(args: argparse.Namespace) -> int:
    files = _files(args.paths)
    if not args.procs and (args.kill or args.stall or args.absent or args.timeout is not None):
        raise UserError("--kill, --stall, --absent and --timeout apply to process mode: add --procs")
    rows: list[tuple[str, ...]] = []
    failed = bad_input = 0
    tty = sys.stderr.isatty()
    t0 = time.perf_counter()
    for i, (f, sc) in enumerate(zip(files, _load_all(files)), 1):
        t1 = time.perf_counter()
        if tty and len(files) > 1:
            print(f"\r[{i}/{len(files)}] {f.name:<50}", end="", file=sys.stderr, flush=True)
        res, why = None, ""
        if isinstance(sc, UserError):
            why = "invalid file"
        else:
            if args.seed is not None:
                sc = dataclasses.replace(sc, seed=args.seed)
            sc = with_versions(sc, args)
            try:
                res = _run_one(sc, args)
            except UserError as e:
                print(f"commsim: error: {e}", file=sys.stderr)
                why = "refused"
            except SystemExit as e:
                # Code a scenario runs (its policy) must not end the run as if it had passed.
                print(f"commsim: error: {f}: the run exited (SystemExit {e.code!r}) before "
                      f"completing; counted as a failure", file=sys.stderr)
                why = "did not complete"
        if res is None:
            failed += 1
            bad_input += why != "did not complete"
            rows.append(("FAIL", why, f.stem if isinstance(sc, UserError) else sc.name,
                         "-", "-", "-", "-", "-", "-"))
            status = f"FAIL ({why})"
        else:
            if args.expect_failure and not res.expects_failure:
                raise UserError(f"{f}: --expect-failure needs [[expect]] error = ... or leak = "
                                f"true lines that hold under the file's own policy ({sc.policy})")
            ok = res.ok   # under --expect-failure: failed exactly as the file expects
            backends = sorted({b for b in res.backends.values() if b})
            failed += not ok
            status = "ok" if ok else "FAIL"
            rows.append((status, "shortcut fails as expected" if res.expects_failure
                         else "must pass", sc.name, sc.topology_spec or "-", str(sc.world_size),
                         ",".join(g.name for g in sc.groups), ",".join(backends) or "-",
                         str(len(res.errors)), str(len(res.leaks))))
            if args.verbose or not ok:
                _report(res, args, to=sys.stdout)
        if not tty and len(files) > 1:     # CI logs: one line per scenario as it ends
            print(f"[{i}/{len(files)}] {f}: {status} ({time.perf_counter() - t1:.1f} s)",
                  file=sys.stderr, flush=True)
    if tty and len(files) > 1:
        print("\r" + " " * 60 + "\r", end="", file=sys.stderr)
    # Every scenario has its row: one that did not complete is a failure, whatever exited.
    assert len(rows) == len(files), (len(rows), len(files))
    print(_table(rows, ("status", "judged as", "scenario", "topology", "world", "groups", "backends", "errors", "leaks")))
    print(f"\n{len(files)} scenario(s), {len(files) - failed} ok, {failed} failed "
          f"in {time.perf_counter() - t0:.1f} s")
    return 2 if bad_input else 1 if failed else 0


def _proc_faults(args: argparse.Namespace):
    from commsim.procs.faults import ProcFaults, parse_rank_step
    kill = dict(parse_rank_step(t, "--kill") for t in args.kill)
    stall = dict(parse_rank_step(t, "--stall") for t in args.stall)
    return ProcFaults(kill=kill, stall=stall, absent=frozenset(args.absent))


def _report(res, args, to) -> None:
    sc = res.scenario
    print(f"\n== {sc.name} ({sc.path}) ==", file=to)
    for g, text in res.explain.items():
        print(text, file=to)
    # One line per distinct error, naming every rank that hit it (not the same line per rank).
    same: dict[tuple[str, str, str], list[int]] = {}
    for e in res.errors:
        same.setdefault((e.step, e.name, e.message), []).append(e.rank)
    for (step, name, message), ranks in same.items():
        gpus = ", ".join(str(sc.placement[r]) for r in ranks[:4]) + (", ..." if len(ranks) > 4 else "")
        print(f"  error: {rank_word(ranks)} (GPU {gpus}) at step {step}: {name}: {message}", file=to)
    traces: dict[str, list[int]] = {}
    for e in res.errors:
        if e.trace:
            traces.setdefault(e.trace, []).append(e.rank)
    for trace, ranks in traces.items():
        print(f"  decision trace ({rank_word(ranks)}):\n{trace}", file=to)
    for f in res.failures:
        print(f"  FAIL: {f}", file=to)
    for o in res.outcomes:
        print(f"  expected: {o}", file=to)
    for l in res.leaks[:10]:
        print(f"  leak: {l}", file=to)
    for fl in res.flags[:10]:
        print(f"  flag: {fl}", file=to)
    if res.failures or res.errors or res.leaks:
        print(f"  replay: {res.replay_command()}", file=to)


def cmd_explain(args: argparse.Namespace) -> int:
    from commsim.scenario.runner import run_scenario
    from commsim.scenario.schema import load

    files = _files(args.paths)
    sizes = None
    if args.sizes is not None or args.plot is not None:
        from commsim.report.size_tables import parse_size_range
        sizes = parse_size_range(args.sizes or "4KiB..256MiB")
    if args.plot is not None and len(files) != 1:
        raise UserError(f"--plot {args.plot}: give exactly one scenario file (got {len(files)})")
    if args.plot is not None:        # refused before the run, not after it
        from commsim.util.fileio import check_output
        check_output(args.plot, "--plot", suffix=".png")
    for f in files:
        sc = with_versions(load(f), args)
        if not args.no_memory_check:
            from commsim.scenario.resources import check_fits
            check_fits(sc)
        res = run_scenario(sc, policy=args.policy)
        _report(res, args, to=sys.stdout)
        rows = [(k[0], k[1], str(k[2]), k[3], b or "-") for k, b in sorted(res.backends.items())]
        if rows:
            print(_table(rows, ("group", "op", "bytes", "dtype", "backend")))
        print(f"ledger after close: {'zero' if not res.leaks else f'{len(res.leaks)} item(s) leaked'}; "
              f"numerics: {_numerics(res)}")
        _explain_nccl(sc)
        if sizes is not None:
            _explain_sizes(sc, args, sizes)
    return 0


def _numerics(res) -> str:
    """The numerics verdict of one run. Results are compared only for the steps a rank
    completed, so a run with errors is never 'ok': it names what stopped the comparison."""
    found = f"{len(res.mismatches)} mismatch(es)" if res.mismatches else ""
    if not res.errors:
        return found or "ok"
    stops: dict[tuple[str, str], list[int]] = {}
    for e in res.errors:
        stops.setdefault((e.step, e.name), []).append(e.rank)
    what = "; ".join(f"{rank_word(ranks)} failed at step {step} ({name})"
                     for (step, name), ranks in stops.items())
    return f"{found + ' before ' if found else ''}not checked past the errors: {what}"


def _explain_nccl(sc) -> None:
    """Per group: the transports and algorithm classes NCCL would use on this machine under the
    workload's NCCL_* variables, and the variables that would change them (nccl_rules)."""
    from commsim.libmodels.nccl_rules import machine_from_cluster, report
    for g in sc.groups:
        if len(g.ranks) < 2:
            continue
        m = machine_from_cluster(sc.cluster, [sc.placement[r] for r in g.ranks])
        print(f"group {g.name}: " + "\n".join(report(m, dict(sc.workload.nccl_env), sc.workload.ops)))


def _explain_sizes(sc, args: argparse.Namespace, sizes: list[int]) -> None:
    """Predicted time per legal backend over `sizes`, per group (commsim.cost_model)."""
    from commsim.report.size_tables import render, size_table
    from commsim.policy import resolve

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
        from commsim.report.plot import plot_size_tables
        out = plot_size_tables(tables, args.plot, title=sc.name)
        print(f"\nwrote {out}")


def register(sub: argparse._SubParsersAction) -> None:
    for name, fn, hlp in (
        ("run", cmd_run, "run scenario files (or folders of them) and print a summary table"),
        ("explain", cmd_explain, "run scenarios and print, per group, the backend chosen per op "
                                 "and size with the reasons, the result check and the ledger, and "
                                 "what NCCL would use there: its transport per pair and algorithm "
                                 "classes per collective, with the NCCL_* variables that change them"),
    ):
        p = sub.add_parser(name, help=hlp, description=hlp)
        p.add_argument("paths", nargs="+", metavar="SCENARIO", help="scenario .toml file or folder")
        p.add_argument("--policy", default=None,
                       help="override the scenario's policy: a preset name or module:object")
        p.add_argument("--seed", type=seed, default=None,
                       help="override the scenario's seed (an integer >= 0)")
        p.add_argument("--no-memory-check", action="store_true",
                       help="run even when the host-memory estimate (shown by `commsim scenario "
                            "check`) exceeds the memory available now")
        add_version_flags(p, "over each scenario's [versions]")
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
            pg.add_argument("--timeout", type=seconds, default=None, metavar="S",
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
