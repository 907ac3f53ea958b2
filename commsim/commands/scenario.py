"""`commsim scenario ...`: work with scenario files (docs/scenario-format.md).

`check` validates files without running anything, so a broken scenario is caught before a
sweep starts: one `ok` line per good file, a `commsim: error: ...` line per bad one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from commsim.errors import UserError
from commsim.scenario.model import Scenario
from commsim.scenario.schema import ScenarioError, load


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
                    "(on stderr). A directory is searched recursively for *.toml. Each ok line "
                    "also gives the run's host-memory estimate and says when the scenario's "
                    "policy runs code (a policy file or module). Exits 2 if any file is "
                    "invalid, as `commsim run` does.")
    check.add_argument("paths", nargs="+", metavar="FILE", type=Path,
                       help="a scenario file, or a directory of them")
    check.set_defaults(func=cmd_check)

    new = sub.add_parser(
        "new", help="make a scenario from a bug report's nvidia-smi topo -m",
        description="Build a scenario from a pasted `nvidia-smi topo -m` (one host), a host count, "
                    "a TP x DP layout, a placement and a policy, validate it, and write it. "
                    "Then `commsim run OUT --expect-failure` reproduces the report.")
    new.add_argument("--topo", required=True, metavar="FILE", help="text file with the pasted matrix ('-' = stdin)")
    new.add_argument("--hosts", type=int, required=True, metavar="N", help="hosts of this shape in the job")
    new.add_argument("--tp", type=int, required=True, metavar="T", help="tensor-parallel size (ranks per group)")
    new.add_argument("--dp", type=int, default=1, metavar="D", help="data-parallel replicas (groups); default 1")
    new.add_argument("--placement", default="contiguous", choices=("contiguous", "spread"),
                     help="contiguous: fill each host first; spread: one rank per host in turn "
                          "(e.g. TP 2 with one GPU per node)")
    new.add_argument("--policy", default="default", help="policy preset or file.py:OBJECT (the shortcut to test)")
    new.add_argument("--op", action="append", dest="ops", metavar="OP",
                     help="op to run (repeatable; default all_reduce)")
    new.add_argument("--size", action="append", dest="sizes", metavar="SIZE",
                     help="message size such as 16KiB (repeatable; default 16KiB)")
    new.add_argument("--graph-capture", action="store_true", help="run the ops inside a CUDA-graph capture")
    new.add_argument("--expect-error", metavar="NAME", help="CUDA error the report shows, e.g. cudaErrorInvalidResourceHandle")
    new.add_argument("--expect-step", metavar="STEP", help="lifecycle step of that error (init, register, ...)")
    new.add_argument("--domain", choices=("none", "node", "rack"), default=None,
                     help="NVLink domain; inferred with a warning when omitted")
    new.add_argument("--gpu-model", default=None, metavar="NAME", help="GPU model, e.g. GB200")
    new.add_argument("--p2p", metavar="FILE", default=None,
                     help="`nvidia-smi topo -p2p r` output of the same host: only OK pairs may "
                          "use P2P (otherwise PCIe pairs are assumed P2P-capable, except on "
                          "GeForce cards)")
    new.add_argument("--name", default=None, help="scenario name (default: the output file's stem)")
    new.add_argument("--output", "-o", type=Path, required=True, metavar="OUT.toml")
    new.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    new.set_defaults(func=cmd_new)


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


def code_note(s: Scenario) -> str:
    """'; runs code: policy file X' when the scenario's policy executes code (UserError when
    that file or module does not exist)."""
    from commsim.policy import runs_code
    what = runs_code(s.policy, s.path.parent if s.path is not None else None)
    return f"; runs code: {what}" if what else ""


def cmd_check(args: argparse.Namespace) -> int:
    from commsim.scenario.resources import estimate_bytes, format_bytes
    failed = 0
    for item in expand(args.paths):
        if isinstance(item, UserError):
            failed += 1
            print(f"commsim: error: {item}", file=sys.stderr)
            continue
        try:
            s = load(item)
            note = code_note(s)
        except UserError as e:
            failed += 1
            print(f"commsim: error: {e}", file=sys.stderr)
            continue
        print(f"ok  {item}  {summary(s)}; host memory ~{format_bytes(estimate_bytes(s))}{note}")
    return 2 if failed else 0


def cmd_new(args: argparse.Namespace) -> int:
    import sys

    from commsim.scenario.new import NewScenario, build
    from commsim.scenario.schema import loads, write_scenario

    from commsim.util.fileio import check_output

    from commsim.commands.args import check_host_count
    from commsim.topology.limits import MAX_GPUS
    check_host_count(args.hosts)          # before the paste is read or a host built
    if not (1 <= args.tp <= MAX_GPUS and 1 <= args.dp <= MAX_GPUS):
        raise UserError(f"--tp and --dp must be >= 1 and at most {MAX_GPUS:,}, got "
                        f"tp={args.tp} dp={args.dp}")
    out: Path = check_output(args.output, "--output", overwrite=args.force)
    from commsim.commands.topo import read_pasted
    text = read_pasted(args.topo, "the pasted `nvidia-smi topo -m`")
    source = "<stdin>" if args.topo == "-" else args.topo
    p2p_text = read_pasted(args.p2p, "`nvidia-smi topo -p2p r` output") if args.p2p else None
    spec = NewScenario(name=args.name or out.stem, topo_text=text, topo_source=source,
                       hosts=args.hosts, tp=args.tp, dp=args.dp, placement=args.placement,
                       policy=args.policy, ops=tuple(args.ops or ("all_reduce",)),
                       sizes=tuple(args.sizes or ("16KiB",)), graph_capture=args.graph_capture,
                       expect_error=args.expect_error, expect_step=args.expect_step,
                       domain=args.domain, gpu_model=args.gpu_model, p2p_text=p2p_text,
                       p2p_source=args.p2p or "<p2p>")
    body, warnings = build(spec, out)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    sc = loads(body, str(out))       # validate before anything is written
    # The policy as `run` will take it (a preset, or an importable Policy; `os:abort` is
    # neither): a file that `run` refuses is not written.
    from commsim.policy import resolve
    resolve(sc.policy, out.resolve().parent)
    write_scenario(out, body)
    print(f"wrote {out}", file=sys.stderr)
    how = " --expect-failure" if args.expect_error else ""
    print(f"next: commsim run {out}{how}    (and: commsim run {out} --policy default)")
    return 0
