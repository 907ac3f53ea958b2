"""The `commsim` command line. Each verb lives in `commsim/commands/<verb>.py` and exposes
`register(subparsers)`; this module only assembles them and turns UserError into a message
and exit status 2 (no traceback for bad input)."""

from __future__ import annotations

import argparse
import importlib
import sys

from commsim.errors import UserError
from commsim.hosting.install.hard_exit import HardExit, exits_unwind
from commsim.util.signals import Terminated, terminate_cleanly


def version() -> str:
    from importlib.metadata import PackageNotFoundError, version as dist_version
    try:
        return dist_version("commsim")
    except PackageNotFoundError:      # run from a source tree that was never installed
        from commsim import __version__
        return __version__

# Verb modules, in the order `commsim --help` lists them.
VERBS = ("topo", "scenario", "run", "sweep", "replay", "probe", "exec", "clean")  # run.py also registers explain


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="commsim",
        description="Simulate GPU communicators on CPU: topologies, CUDA IPC / cuMem / multicast "
                    "semantics, backend choice, and replayable failures.")
    parser.add_argument("--version", action="version", version=f"commsim {version()}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    sub.required = True
    for verb in VERBS:
        try:
            mod = importlib.import_module(f"commsim.commands.{verb}")
        except ModuleNotFoundError as e:
            if e.name == f"commsim.commands.{verb}":
                continue  # a verb not built yet is simply absent from --help
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)    # a bad flag: usage, the flag named, SystemExit(2)
    try:
        with terminate_cleanly(), exits_unwind():
            rc = args.func(args)
    except UserError as e:
        print(f"commsim: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("commsim: interrupted", file=sys.stderr)
        return 130
    except HardExit as e:
        # Code commsim loaded (a policy's method, say) ended the process mid-run: whatever
        # status it chose, there is no verdict, so this is never a pass.
        print(f"commsim: error: {e} was called inside commsim's process before the "
              f"{args.verb} could give its verdict", file=sys.stderr)
        return e.code or 1
    except Terminated as e:
        print(f"commsim: terminated by {e}", file=sys.stderr)
        return e.exit_code
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
