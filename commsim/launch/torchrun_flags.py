"""torchrun's flags, as `commsim exec` answers them: the ones that say where ranks go are
aliases of commsim's own (a torchrun habit just works), the rest are refused by name with
what to do instead; and `commsim exec -- torchrun ...` is answered with the commsim command
that runs the same program.

Flag names and values as torch 2.13's torch/distributed/run.py (get_args_parser,
determine_local_world_size, parse_min_max_nnodes) declares them. torchrun runs one node's
ranks per invocation; `commsim exec` runs every host's ranks in one, so the flags that only
a multi-invocation launch needs (node rank, rendezvous, master address) have no use here.
"""

from __future__ import annotations

import argparse
import os
import shlex
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TorchrunFlag:
    names: tuple[str, ...]      # torchrun's spellings (dashes and, mostly, underscores)
    value: bool                 # takes a value
    dest: str                   # commsim exec's attribute it sets; "" when refused
    why: str                    # refused: why commsim has no use for it and what to do instead


_RENDEZVOUS = ("commsim exec is the rendezvous: it starts every rank and gives each "
               "MASTER_ADDR/MASTER_PORT on loopback itself; drop it")
_ONE_INVOCATION = ("commsim exec starts every host's ranks in one command (torchrun needs "
                   "one per node); drop it, the hosts are --machine PRESET:HOSTS or --nnodes N")
_NO_USE = "commsim exec has no use for it; drop it"

FLAGS = (
    TorchrunFlag(("--nproc-per-node", "--nproc_per_node"), True, "nproc_per_host", ""),
    TorchrunFlag(("--nnodes",), True, "nnodes", ""),
    TorchrunFlag(("--standalone",), False, "standalone", ""),
    TorchrunFlag(("--node-rank", "--node_rank"), True, "", _ONE_INVOCATION),
    TorchrunFlag(("--master-addr", "--master_addr"), True, "", _RENDEZVOUS),
    TorchrunFlag(("--master-port", "--master_port"), True, "", _RENDEZVOUS),
    TorchrunFlag(("--local-addr", "--local_addr"), True, "", _RENDEZVOUS),
    TorchrunFlag(("--rdzv-backend", "--rdzv_backend"), True, "", _RENDEZVOUS),
    TorchrunFlag(("--rdzv-endpoint", "--rdzv_endpoint"), True, "", _RENDEZVOUS),
    TorchrunFlag(("--rdzv-id", "--rdzv_id"), True, "", _RENDEZVOUS),
    TorchrunFlag(("--rdzv-conf", "--rdzv_conf"), True, "", _RENDEZVOUS),
    TorchrunFlag(("--max-restarts", "--max_restarts"), True, "",
                 "a hosted run is judged, never restarted; drop it (the verdict prints the "
                 "command that replays a failure)"),
    TorchrunFlag(("-m", "--module"), False, "",
                 "name the module after --: `-- python -m module ARGS`"),
    TorchrunFlag(("--no-python", "--no_python"), False, "",
                 "commsim exec hosts Python programs only: `-- python prog.py ARGS`"),
    TorchrunFlag(("--run-path", "--run_path"), False, "",
                 "give the program after --: `-- python prog.py ARGS`"),
    TorchrunFlag(("--log-dir", "--log_dir"), True, "",
                 "commsim exec echoes every rank's output (prefixed with its rank) and keeps "
                 "no logs; drop it (--quiet stops the echo)"),
    TorchrunFlag(("-r", "--redirects", "-t", "--tee", "--local-ranks-filter", "--local_ranks_filter",
                  "--duplicate-stdout-filters", "--duplicate_stdout_filters",
                  "--duplicate-stderr-filters", "--duplicate_stderr_filters"), True, "",
                 "commsim exec echoes every rank's output; drop it (--quiet stops the echo)"),
    TorchrunFlag(("--monitor-interval", "--monitor_interval", "--start-method",
                  "--start_method", "--event-log-handler", "--event_log_handler", "--role",
                  "--logs-specs", "--logs_specs", "--numa-binding", "--signals-to-handle",
                  "--shutdown-timeout", "--virtual-local-rank"), True, "", _NO_USE),
)

# torchrun's --nproc-per-node words that mean "one per accelerator of the node" (commsim's
# default, one rank per GPU of each host); "cpu" and "xpu" name devices a simulated GPU
# machine does not run ranks on.
_PER_GPU_WORDS = ("gpu", "auto")


def nproc_per_node(text: str) -> int:
    """torchrun's --nproc-per-node value: a count, or gpu/auto (0: one rank per GPU)."""
    if text in _PER_GPU_WORDS:
        return 0
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: commsim runs one rank per simulated GPU; give a number of ranks per "
            f"host or one of {', '.join(_PER_GPU_WORDS)} (one per GPU)") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n}: give 1 or more ranks per host")
    return n


def nnodes(text: str) -> int:
    """torchrun's --nnodes: N, or MIN:MAX with MIN == MAX (commsim's hosts are fixed)."""
    lo, _, hi = text.partition(":")
    try:
        low, high = int(lo), int(hi or lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a host count; give N, e.g. 2") from None
    if low != high:
        raise argparse.ArgumentTypeError(
            f"{text}: a simulated machine has a fixed number of hosts (torchrun's elastic "
            f"MIN:MAX does not apply); give --nnodes N")
    if low < 1:
        raise argparse.ArgumentTypeError(f"{low}: give 1 or more hosts")
    return low


def _refused(why: str) -> type:
    """An argparse action that fails on sight, naming the flag (argparse's own `argument
    --node-rank/--node_rank:` prefix), saying why and what to do instead."""
    class Refused(argparse.Action):
        def __call__(self, parser: Any, namespace: Any, values: Any,
                     option_string: Any = None) -> None:
            raise argparse.ArgumentError(self, f"torchrun's flag: {why}")
    return Refused


def add_aliases(p: argparse.ArgumentParser) -> None:
    """torchrun's flags on `commsim exec`'s parser, out of its --help: the mapped ones set
    commsim's own settings, the rest fail naming the flag and what to do instead."""
    types = {"nproc_per_host": nproc_per_node, "nnodes": nnodes}
    for f in FLAGS:
        if f.dest == "standalone":
            p.add_argument(*f.names, dest=f.dest, action="store_true", default=argparse.SUPPRESS,
                           help=argparse.SUPPRESS)
        elif f.dest:
            p.add_argument(*f.names, dest=f.dest, type=types[f.dest], default=argparse.SUPPRESS,
                           help=argparse.SUPPRESS)
        else:
            p.add_argument(*f.names, action=_refused(f.why), nargs=None if f.value else 0,
                           default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def with_nnodes(machine: str, hosts: int, scenario: str) -> str:
    """--machine once torchrun's --nnodes N is applied: PRESET -> PRESET:N."""
    from commsim.errors import UserError
    if scenario:
        raise UserError(f"--nnodes {hosts}: the scenario {scenario} places the ranks; drop --nnodes")
    if not machine:
        raise UserError(f"--nnodes {hosts}: give the machine too, e.g. --machine gb200-nvl72 "
                        f"--nnodes {hosts}")
    name, _, count = machine.partition(":")
    if count and count != str(hosts):
        raise UserError(f"--nnodes {hosts} disagrees with --machine {machine} ({count} host(s)); "
                        f"give one of them")
    from commsim.topology.model import TopologyError
    from commsim.topology.presets import build
    try:
        build(f"{name}:{hosts}")
    except TopologyError as e:       # an unknown preset or too many hosts, in its own words
        raise UserError(f"--nnodes {hosts} on --machine {name}: {e}") from None
    return f"{name}:{hosts}"


# -- `commsim exec -- torchrun ...` -----------------------------------------------------------

_LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")


def launcher_in(argv: list[str]) -> tuple[str, int] | None:
    """The torchrun-style launcher a program line starts with (`torchrun`, `python -m
    torch.distributed.run`) and how many words it takes, or None."""
    lead = 1 if argv and os.path.basename(argv[0]).startswith("python") else 0
    words = argv[lead:]
    if words and os.path.basename(words[0]) == "torchrun":
        return "torchrun", lead + 1
    if len(words) >= 2 and words[0] == "-m" and words[1] in _LAUNCHER_MODULES:
        return f"python -m {words[1]}", lead + 2
    return None


@dataclass(frozen=True)
class Translation:
    flags: list[str]            # commsim exec's flags for torchrun's placement flags
    program: list[str]          # what follows `python`: prog.py ARGS or -m module ARGS
    dropped: list[str]          # torchrun flags commsim has no use for


def translate(argv: list[str]) -> Translation:
    """A torchrun command line (from its first flag on) in commsim's terms."""
    by_name = {n: f for f in FLAGS for n in f.names}
    flags: list[str] = []
    dropped: list[str] = []
    module = False
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        word = argv[i]
        name, eq, value = word.partition("=")
        if name in ("-m", "--module"):
            module, i = True, i + 1
            continue
        f = by_name.get(name)
        if f is not None and f.value and not eq:
            value, i = argv[i + 1] if i + 1 < len(argv) else "", i + 1
        i += 1
        if f is not None and f.dest == "nproc_per_host":
            flags += [] if value in _PER_GPU_WORDS else ["--nproc-per-host", value]
        elif f is not None and f.dest == "nnodes":
            flags += ["--nnodes", value]
        elif f is None or f.dest != "standalone":
            dropped.append(name)
    rest = argv[i:]
    return Translation(flags, (["-m"] if module else []) + rest, dropped)


def advice(argv: list[str], prefix: str, placement: bool) -> str:
    """What to run instead of a torchrun command line: `prefix` is the commsim command up to
    its own flags; `placement`: whether torchrun's placement flags carry over."""
    launcher, skip = launcher_in(argv) or ("torchrun", 1)
    t = translate(argv[skip:])
    program = shlex.join(t.program) if t.program else "prog.py ARGS"
    if placement:
        line = " ".join([prefix] + t.flags + ["--", "python", program])
    else:
        line = f"{prefix} {shlex.quote(program)}"
    note = (f" (dropped {', '.join(t.dropped)}: commsim has no use for them)" if t.dropped else "")
    return (f"`{launcher}` is the launcher commsim stands in for: commsim starts the ranks "
            f"itself and gives each torchrun's environment; run `{line}`{note}")
