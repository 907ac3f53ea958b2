"""`commsim scenario ...`: work with scenario files (docs/scenario-format.md).

`check` validates files without running anything, so a broken scenario is caught before a
sweep starts: one `ok` line per good file, a `commsim: error: ...` line per bad one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import UserError
from ..scenario.model import Scenario
from ..scenario.schema import ScenarioError, load


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "scenario", help="check and inspect scenario files",
        description="Work with scenario files: TOML describing a topology, faults, process "
                    "groups, a workload and expectations (see docs/scenario-format.md).")
    sub = parser.add_subparsers(dest="scenario_cmd", metavar="COMMAND")
    sub.required = True
    check = sub.add_parser(
        "check", help="validate scenario files without running them",
        description="Load and validate each scenario file and print one line per file: "
                    "'ok  PATH  NAME: TOPOLOGY, world N, groups G, faults F', or the error "
                    "(on stderr). A directory is searched recursively for *.toml. Exits 1 if "
                    "any file is invalid.")
    check.add_argument("paths", nargs="+", metavar="FILE", type=Path,
                       help="a scenario file, or a directory of them")
    check.set_defaults(func=cmd_check)


def expand(paths: list[Path]) -> list[Path | UserError]:
    """Files to check, in order: directories become their *.toml files (sorted, recursive).
    A path that names nothing, or a directory without scenarios, becomes an error entry so
    the other files are still checked."""
    out: list[Path | UserError] = []
    for p in paths:
        if p.is_dir():
            # Same selection as `commsim run DIR`: files under a policies/ folder are not scenarios.
            found = sorted(f for f in p.rglob("*.toml")
                           if f.is_file() and "policies" not in f.relative_to(p).parts)
            if not found:
                out.append(ScenarioError(f"{p}: no *.toml scenario files in this directory"))
            out.extend(found)
        elif p.exists():
            out.append(p)
        else:
            out.append(ScenarioError(f"{p}: no such file or directory"))
    return out


def summary(s: Scenario) -> str:
    groups = ",".join(g.name for g in s.groups)
    return (f"{s.name}: {s.topology_spec}, world {s.world_size}, groups {groups}, "
            f"faults {len(s.faults)}")


def cmd_check(args: argparse.Namespace) -> int:
    failed = 0
    for item in expand(args.paths):
        if isinstance(item, UserError):
            failed += 1
            print(f"commsim: error: {item}", file=sys.stderr)
            continue
        try:
            s = load(item)
        except UserError as e:
            failed += 1
            print(f"commsim: error: {e}", file=sys.stderr)
            continue
        print(f"ok  {item}  {summary(s)}")
    return 1 if failed else 0
