"""`commsim topo ...`: list, show and import topologies, and merge NVML fabric info.

`import` turns `nvidia-smi topo -m` output pasted into a bug report into a cluster, prints
what it assumed, and can write it as a scenario file whose `[topology]` table spells every
assumption out, so the regression scenario does not depend on this run's inference. Given an
NCCL topology XML (NCCL_TOPO_FILE / NCCL_TOPO_DUMP_FILE) it reads hosts, GPUs and NVLinks from
the file instead. `fabric` merges per-GPU NVML fabric info (`nvidia-smi -q` or JSON) into a
topology and prints the NVLink-domain map that results.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

from commsim.commands.args import check_host_count
from commsim.errors import UserError
from commsim.util.fileio import check_output, read_input, write_atomic
from commsim.topology import presets, render
from commsim.topology import importers
from commsim.topology.importers import nvml_fabric
from commsim.topology.importers.nvidia_smi import DOMAINS, cluster_from_matrix_table, matrix_table
from commsim.topology.model import Cluster

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # what [scenario] name accepts


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "topo", help="list, show and import machine topologies",
        description="Machine topologies: the presets, the topology of a scenario file, and "
                    "import of `nvidia-smi topo -m` output from a bug report.")
    sub = parser.add_subparsers(dest="topo_cmd", metavar="COMMAND")
    sub.required = True

    ls = sub.add_parser("list", help="list the preset topologies",
                        description="List the preset machine shapes with a one-line summary. "
                                    "Use a name with `commsim topo show` or in a scenario's "
                                    "[topology] preset = \"...\".")
    ls.set_defaults(func=cmd_list)

    show = sub.add_parser(
        "show", help="print a preset's or a scenario's topology",
        description="Print the `nvidia-smi topo -m` style matrix of each distinct host shape, "
                    "the P2P answers and the NVLink domain map. SPEC is a preset name, "
                    "optionally sliced to its first N hosts (gb200-nvl72:2), or a scenario "
                    ".toml file (its topology after faults).")
    show.add_argument("spec", metavar="PRESET|SCENARIO.toml",
                      help="preset name (see `commsim topo list`), e.g. hgx-h100-8 or "
                           "gb200-nvl72:2, or a path to a scenario file")
    show.add_argument("--shapes", type=int, default=2, metavar="N",
                      help="print the matrices of at most N distinct host shapes (default 2)")
    show.set_defaults(func=cmd_show)

    imp = sub.add_parser(
        "import", help="import `nvidia-smi topo -m` output or an NCCL topology XML",
        description="Read `nvidia-smi topo -m` output (prose before the matrix, NIC rows and "
                    "columns, affinity columns and the legend are skipped; `nvidia-smi topo -p2p "
                    "r|w` blocks pasted after it set P2P per pair and keep the cause (CNS, GNS, "
                    "TNS ...); a matrix cut short imports what is there, with a warning; whether "
                    "all-NVLink GPUs sit on an NVSwitch or form a direct mesh is inferred from "
                    "the link counts and said), repeat that host "
                    "--hosts times, print the assumptions made as warnings on stderr and the "
                    "resulting topology on stdout. With --output, write a scenario file whose "
                    "[topology] table holds the explicit topology. A FILE.xml (or text starting "
                    "with '<') is read as the topology XML NCCL reads from NCCL_TOPO_FILE or "
                    "writes with NCCL_TOPO_DUMP_FILE: hosts (host_hash), GPUs, NVLinks and "
                    "NICs come from the file; what it does not say is printed as warnings.",
        epilog="examples: commsim topo import bug.txt --hosts 2 --output scenarios/bug.toml\n"
               "          commsim topo import dump.xml --fabric-info tray0.txt "
               "--fabric-info tray1.txt",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    imp.add_argument("file", metavar="FILE",
                     help="text holding `nvidia-smi topo -m` output, or an NCCL topology XML "
                          "('-' reads stdin)")
    imp.add_argument("--hosts", type=int, default=None, metavar="N",
                     help="how many hosts of this shape the cluster has (>= 1); required for "
                          "`topo -m` text, not accepted for XML (the file names its hosts)")
    imp.add_argument("--domain", choices=DOMAINS, default=None,
                     help="NVLink domain: none (no NVSwitch fabric), node (one NVSwitch board "
                          "per host), rack (one multi-node domain over all hosts, as GB200 "
                          "NVL72). Default: inferred from the matrix, with a warning")
    imp.add_argument("--gpu-model", metavar="NAME", default=None,
                     help="GPU model, e.g. H100, GB200, 'NVIDIA A100-SXM4-40GB', 'RTX 4090'; "
                          "sets compute capability, memory, multicast and fabric support. "
                          "Default: inferred from the matrix, with a warning")
    imp.add_argument("--p2p", metavar="FILE", default=None,
                     help="`nvidia-smi topo -p2p r` output of the same machine: only OK "
                          "allows P2P (blocks pasted after the matrix are read without it). "
                          "Without either, PCIe pairs are assumed to allow P2P")
    imp.add_argument("--host-prefix", default="node", metavar="PREFIX",
                     help="host names are PREFIX-0 .. PREFIX-(N-1) (default: node)")
    imp.add_argument("--name", default=None,
                     help="cluster and scenario name (default: from FILE's name)")
    imp.add_argument("--output", "-o", type=Path, default=None, metavar="OUT.toml",
                     help="write a scenario file with the explicit topology")
    imp.add_argument("--force", action="store_true",
                     help="overwrite --output if it exists")
    imp.add_argument("--nvswitch", action="store_true",
                     help="XML only: the file lists no NVLinks (a flattened VM topology) but "
                          "each host is an NVSwitch board; model every GPU pair as NVLink")
    imp.add_argument("--fabric-info", action="append", default=[], metavar="[HOST=]FILE",
                     help="merge NVML fabric info (`nvidia-smi -q`, -q -x XML or JSON, see `commsim topo "
                          "fabric --help`); repeat once per host")
    # A missing --hosts for `topo -m` text stays a usage error (exit 2 with usage), as when
    # argparse itself required it; it is optional only because an XML names its hosts.
    imp.set_defaults(func=cmd_import, usage_error=imp.error)

    fab = sub.add_parser(
        "fabric", help="merge NVML fabric info into a topology and print the domain map",
        description="Merge per-GPU NVML fabric info (cluster UUID, clique id, state, status) "
                    "into a topology, re-derive the NVLink domains from it the way NCCL and "
                    "FlashInfer read it (one non-zero cluster UUID = one domain; a zero UUID is "
                    "no multi-node domain even with state Completed), and print the domain map, "
                    "the legal backends for a group of every GPU, and warnings for the traps "
                    "(zero UUID, differing cliques, states other than Completed, failed "
                    "status, no IMEX). Each --info FILE is one host's `nvidia-smi -q` output "
                    "(its Fabric sections, one per GPU in index order), its `nvidia-smi -q -x` "
                    "XML (the <fabric> of each <gpu>), or JSON: a list of objects with NVML's "
                    "field names {\"state\", \"status\", \"cliqueId\", \"clusterUuid\"} "
                    "(snake_case too; nested under \"fabric\" or \"gpuFabricInfo\" is fine) for "
                    "one host, or an object of host name -> such a list. A partial capture (fewer "
                    "GPUs, missing fields) merges over the topology's values with a warning.",
        epilog="example: commsim topo fabric gb200-nvl72:4 --info tray0.txt --info tray1.txt "
               "--info tray2.txt --info tray3.txt")
    fab.add_argument("spec", metavar="TOPOLOGY",
                     help="preset (gb200-nvl72:4), scenario .toml or NCCL topology .xml")
    fab.add_argument("--info", action="append", required=True, metavar="[HOST=]FILE",
                     help="fabric info of one host (files without HOST= go to the hosts in "
                          "order), or a JSON file naming hosts; repeat")
    fab.set_defaults(func=cmd_fabric)


# -- list / show ------------------------------------------------------------------------


def cmd_list(args: argparse.Namespace) -> int:
    width = max(len(n) for n in presets.PRESETS)
    for p in presets.PRESETS.values():
        print(f"{p.name.ljust(width)}  {p.summary}")
    return 0


def load_spec(spec: str) -> Cluster:
    """The cluster of a scenario .toml file, or any topology `importers.load` reads (a preset,
    optionally sliced, or an NCCL XML; `topo -m` text needs `topo import --hosts`)."""
    path = Path(spec)
    if spec.endswith(".toml") and spec.partition(":")[0] not in presets.PRESETS:
        if not path.exists():
            raise UserError(f"{spec}: no such file; give a scenario .toml file, "
                            f"{importers.accepted()}")
        try:
            # Imported here: scenario files are optional for showing presets.
            from commsim.scenario import schema
        except ModuleNotFoundError as e:
            if e.name not in ("commsim.scenario.schema", "commsim.scenario"):
                raise
            raise UserError(f"{spec}: reading scenario files needs commsim.scenario.schema, "
                            f"which this installation lacks; show a preset instead") from None
        return schema.load(path).cluster
    loaded = importers.load(spec)
    for w in loaded.warnings:
        print(f"warning: {w}", file=sys.stderr)
    return loaded.cluster


def cmd_show(args: argparse.Namespace) -> int:
    if args.shapes < 1:
        raise UserError(f"--shapes: must be >= 1, got {args.shapes}")
    print(render.describe(load_spec(args.spec), max_hosts=args.shapes))
    return 0


# -- import -----------------------------------------------------------------------------


def read_pasted(path: str, what: str) -> str:
    """A pasted text file (or stdin for '-'), or UserError naming the path and what it must hold."""
    if path == "-":
        return sys.stdin.read()
    try:
        # Pastes come from browsers and editors: tolerate a BOM and stray bytes.
        return read_input(path).decode("utf-8-sig", errors="replace")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file; give a text file holding {what} "
                        f"('-' reads stdin)") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory; give a text file holding {what}") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror}") from None


def _scenario_name(args: argparse.Namespace) -> str:
    if args.name is not None:
        if not _NAME.match(args.name):
            raise UserError(f"--name {args.name!r}: use letters, digits, '.', '_' and '-', "
                            f"starting with a letter or digit")
        return args.name
    stem = "stdin" if args.file == "-" else Path(args.file).stem
    return re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-._") or "imported"


def cmd_import(args: argparse.Namespace) -> int:
    if args.hosts is not None:
        check_host_count(args.hosts)      # before the file is read or a host built
    text = read_pasted(args.file, "`nvidia-smi topo -m` output or an NCCL topology XML")
    fmt = importers.sniff(args.file, text)
    source = "<stdin>" if args.file == "-" else args.file
    if fmt is not None and fmt.name == "nccl_xml":
        return _import_xml(args, text, source)
    if args.nvswitch:
        raise UserError("--nvswitch: only for an NCCL topology XML; for `topo -m` text use "
                        "--domain node")
    if args.hosts is None:
        args.usage_error("the following arguments are required for `nvidia-smi topo -m` text: "
                         "--hosts N (how many hosts of this shape the cluster has)")
    name = _scenario_name(args)
    out: Path | None = args.output
    if out is not None and args.fabric_info:
        raise UserError("--fabric-info with --output: the scenario [topology] table holds the "
                        "`topo -m` matrix only, not per-GPU fabric info; drop one of the two")
    if out is not None:
        _check_output(out, args.force)  # fail before the work, not after it
    p2p_text = read_pasted(args.p2p, "`nvidia-smi topo -p2p r` output") if args.p2p else None
    loaded = importers.load(args.file, text, format="nvidia_smi", source=source, hosts=args.hosts,
                            domain=args.domain, gpu_model=args.gpu_model, host_prefix=args.host_prefix,
                            name=name, p2p_text=p2p_text, p2p_source=args.p2p or "<p2p>")
    parsed, warnings = loaded.detail, loaded.warnings
    nic = f", {parsed.nic_count} NIC column(s) ignored" if parsed.nic_count else ""
    print(f"parsed {source}: {parsed.gpu_count} GPUs per host{nic}", file=sys.stderr)
    cluster = _merge_fabric(loaded.cluster, args.fabric_info, warnings)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(render.describe(cluster))
    if out is not None:
        body = scenario_toml(name, matrix_table(cluster, args.host_prefix), source, warnings)
        _verify(body, cluster, out)
        _write_atomic(out, body, args.force)
        print(f"wrote {out}", file=sys.stderr)
    return 0


def _import_xml(args: argparse.Namespace, text: str, source: str) -> int:
    for flag, value in (("--hosts", args.hosts), ("--domain", args.domain), ("--p2p", args.p2p),
                        ("--output", args.output)):
        if value is not None:
            raise UserError(f"{flag}: not accepted for an NCCL topology XML (the file says how "
                            f"many hosts and which links; the scenario [topology] table holds "
                            f"`topo -m` matrices only)")
    loaded = importers.load(args.file, text, format="nccl_xml", source=source,
                            gpu_model=args.gpu_model, nvswitch=args.nvswitch,
                            host_prefix=args.host_prefix, name=_scenario_name(args))
    topo, warnings = loaded.detail, loaded.warnings
    cluster = _merge_fabric(loaded.cluster, args.fabric_info, warnings)
    nics = [n for n in topo.nics]
    speeds = sorted({n.speed_mbps for n in nics if n.speed_mbps})
    nic_text = (f", {len(nics)} NIC port(s)" +
                (f" at {'/'.join(f'{s // 1000} Gb/s' for s in speeds)}" if speeds else ""))
    print(f"parsed {source}: {len(topo.hosts)} host(s), {len(topo.gpus)} GPU(s){nic_text}",
          file=sys.stderr)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(render.describe(cluster))
    print("")
    print(_legal_summary(cluster))
    return 0


def _merge_fabric(cluster: Cluster, specs: list[str], warnings: list[str]) -> Cluster:
    if not specs:
        return cluster
    infos: list[tuple[str | None, list]] = []
    for spec in specs:
        host, sep, path = spec.partition("=")
        if not sep:
            host, path = "", spec
        for named, recs in nvml_fabric.load_fabric_file(path).items():
            if host and named is not None:
                raise UserError(f"{spec}: the JSON names its hosts; give it without HOST=")
            infos.append((host or named, recs))
    merged, notes = nvml_fabric.merge_fabric(cluster, infos)
    warnings.extend(notes)
    return merged


def _legal_summary(cluster: Cluster) -> str:
    """Which backends a group of every GPU would admit, from a discovery run."""
    from commsim.report.size_tables import legal_backends   # imported late: pulls in the simulator
    refs = list(cluster.gpu_refs())
    leg = legal_backends(cluster, refs)
    lines = [f"group of all {len(refs)} GPU(s): legal backends: {', '.join(leg.legal)}"]
    lines += [f"  not legal: {name}: {why}" for name, why in leg.declined.items()]
    return "\n".join(lines)


def cmd_fabric(args: argparse.Namespace) -> int:
    cluster = load_spec(args.spec)
    warnings: list[str] = []
    merged = _merge_fabric(cluster, args.info, warnings)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(render.domain_map(merged))
    print("")
    print(_legal_summary(merged))
    return 0


def _q(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)  # a JSON string is a valid TOML basic string


def scenario_toml(name: str, table: dict[str, Any], origin: str, warnings: list[str]) -> str:
    """A scenario file holding `table` as its explicit `[topology]`."""
    lines = [f"# Imported by `commsim topo import` from {origin!r} (nvidia-smi topo -m)."]
    if warnings:
        lines.append("# Assumed while importing (written out explicitly below; edit to change):")
        lines += [f"#   - {' '.join(w.split())}" for w in warnings]
    lines += ["", "[scenario]", f"name = {_q(name)}", "", "[topology]"]
    for key, value in table.items():
        if isinstance(value, str) and "\n" in value:
            # A literal multi-line string keeps tabs and the " X " cells as they are.
            lines.append(f"{key} = '''\n{value}'''")
        elif isinstance(value, str):
            lines.append(f"{key} = {_q(value)}")
        else:
            lines.append(f"{key} = {value}")
    return "\n".join(lines) + "\n"


def _verify(body: str, cluster: Cluster, out: Path) -> None:
    """Refuse to write a file that would not load back into the same machine."""
    table = tomllib.loads(body)["topology"]
    again = cluster_from_matrix_table(table, str(out))
    if again.hosts != cluster.hosts or again.domains != cluster.domains:
        raise UserError(f"{out}: internal error: the written topology would not load back "
                        f"unchanged; nothing was written")
    try:
        from commsim.scenario import schema
    except ModuleNotFoundError:
        return  # the schema loader is optional; the round trip above already checked
    schema.loads(body, str(out))


def _check_output(out: Path, force: bool) -> None:
    check_output(out, "--output", overwrite=force)


def _write_atomic(out: Path, body: str, force: bool) -> None:
    _check_output(out, force)
    write_atomic(out, body, overwrite=force)
