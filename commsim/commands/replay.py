"""`commsim replay ID`: rebuild a generated scenario from its id, run it, and print the
explanation and the oracle's verdict (exit 1 if the verdict is not clean)."""

from __future__ import annotations

import argparse

from commsim.commands.args import add_version_flags, version_flags, with_versions


def cmd_replay(args: argparse.Namespace) -> int:
    from commsim.scenario.generate import scenario_from_id
    from commsim.scenario.legal import group_truth
    from commsim.scenario.oracle import judge
    from commsim.scenario.runner import run_scenario

    from commsim.scenario.executors import replay_command

    sc = with_versions(scenario_from_id(args.id), args)
    print(f"== {args.id}: {sc.description} ==")
    print(f"versions: {sc.cluster.versions.text()}")
    print(f"seed {sc.seed}; placement: " + ", ".join(f"r{r}={g}" for r, g in enumerate(sc.placement)))
    for g in sc.groups:
        gt = group_truth(sc, g.ranks, g.name)
        why = "; ".join(f"{b}: {w}" for b, w in gt.why_not.items())
        print(f"group {g.name} ranks {list(g.ranks)}: oracle allows {', '.join(gt.legal)}"
              + (f" (not: {why})" if why else ""))
    res = run_scenario(sc)
    again = run_scenario(sc) if args.determinism else None
    print()
    for text in res.explain.values():
        print(text)
    for e in res.errors:
        print(f"  error: rank {e.rank} (GPU {sc.placement[e.rank]}) at step {e.step}: {e.name}: {e.message}")
        if e.trace and args.verbose:
            print(f"  decision trace:\n{e.trace}")
    for line in res.leaks[:20]:
        print(f"  leak: {line}")
    for fl in res.flags[:20]:
        print(f"  flag: {fl}")
    v = judge(sc, res, again)
    print()
    print(v.render())
    if not v.ok:
        print(f"replay: {replay_command(args.id, version_flags(args))}")
    return 0 if v.ok else 1


def register(sub: argparse._SubParsersAction) -> None:
    hlp = "rebuild a generated scenario from its sweep id, run it, print explanation and verdict"
    p = sub.add_parser("replay", help=hlp, description=hlp + ". IDs: s<seed>-<index> (sampler), k<seed>-<index> (its shortcut-policy knob twins) or e<index> (enumeration).")
    p.add_argument("id", metavar="ID", help="a scenario id from a sweep report, e.g. s0-17")
    p.add_argument("--determinism", action="store_true", help="also run it a second time and compare")
    p.add_argument("-v", "--verbose", action="store_true", help="print decision traces of errors")
    add_version_flags(p, "over the versions the generator drew for the id")
    p.set_defaults(func=cmd_replay)
