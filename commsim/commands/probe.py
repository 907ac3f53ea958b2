"""`commsim probe`: write a scenario file describing the machine this runs on.

The probe is in `commsim/probe/` (machine.py reads the machine through device/, scenario.py writes
the file); without a GPU the command exits 2 with what is missing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from commsim.errors import UserError
from commsim.util.fileio import write_atomic


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "probe", help="write a scenario describing this machine's GPUs (needs a GPU)",
        description="Probe the GPUs of this machine through CUDA and NVML (device attributes, "
                    "cuDeviceCanAccessPeer, NVLink / PCIe links, fabric info, IMEX channels) "
                    "and write a scenario file with the explicit `nvidia-smi topo -m` style "
                    "topology, plus the faults that make the simulator answer as this "
                    "machine does. Without --output the scenario goes to stdout.",
        epilog="example: commsim probe --output scenarios/this-machine.toml")
    p.add_argument("--output", "-o", type=Path, default=None, metavar="OUT.toml",
                   help="write the scenario here instead of stdout")
    p.add_argument("--force", action="store_true", help="overwrite --output if it exists")
    p.add_argument("--name", default=None, help="scenario name (default: probe-<hostname>)")
    p.set_defaults(func=cmd_probe)


def cmd_probe(args: argparse.Namespace) -> int:
    out: Path | None = args.output
    if out is not None:
        from commsim.util.fileio import check_output
        check_output(out, "--output", overwrite=args.force)
    try:
        from commsim.probe.machine import probe_machine
        from commsim.probe.scenario import scenario_text
    except ImportError as e:   # an installation without the device layer
        raise UserError(f"commsim probe needs the device layer (package `device`): {e}") from None
    text = scenario_text(probe_machine(), args.name)   # NoGpuError is a UserError: exit 2
    from commsim.scenario import schema
    schema.loads(text, str(out or "<probe>"))          # never write a file that will not load
    if out is None:
        sys.stdout.write(text)
    else:
        write_atomic(out, text, overwrite=args.force)
        print(f"wrote {out}", file=sys.stderr)
    return 0
