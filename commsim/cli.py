"""The `commsim` command line. Each verb lives in `commsim/commands/<verb>.py` and exposes
`register(subparsers)`; this module only assembles them and turns UserError into a message
and exit status 2 (no traceback for bad input)."""

from __future__ import annotations

import sys
from typing import NoReturn


def interrupted() -> int:
    """Ctrl-C: one line and 130, as a shell reports a command SIGINT ended."""
    print("commsim: interrupted", file=sys.stderr)
    return 130


def end_now(code: int) -> NoReturn:
    """End the process with `code` once its exit handlers have run, without the interpreter's
    final teardown: SIGTERM asks for an end within seconds, and collecting a sweep's objects
    at exit took longer than that on a loaded machine (8-19 s after the run had stopped). The
    run's own cleanup has happened already, in its finally blocks."""
    import atexit
    import os
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def interrupted_while_loading() -> None:
    """Ctrl-C while modules load: nothing has started, so nothing needs finalizing. The
    process ends here with os._exit: an interrupt inside a compiled module's initialization
    (cuda.bindings) can leave CPython marked as ended by an unhandled KeyboardInterrupt, and
    a normal exit would then end the process by SIGINT after this line was printed."""
    import os
    interrupted()
    sys.stderr.flush()
    os._exit(130)


# A Ctrl-C while the modules load (a second or more on a loaded machine: torch and the
# bindings come in with the verbs) is an interruption like any other, not a traceback.
try:
    import argparse
    import importlib

    from commsim.errors import UserError
    from commsim.hosting.install.hard_exit import HardExit, exits_unwind
    from commsim.util.signals import Terminated, terminate_cleanly
except KeyboardInterrupt:
    interrupted_while_loading()


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
    try:
        parser = build_parser()           # imports every verb's modules
    except KeyboardInterrupt:
        interrupted_while_loading()
    try:
        args = parser.parse_args(argv)    # a bad flag: usage, the flag named, SystemExit(2)
        with terminate_cleanly(), exits_unwind():
            rc = args.func(args)
    except UserError as e:
        print(f"commsim: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return interrupted()
    except HardExit as e:
        # Code commsim loaded (a policy's method, say) ended the process mid-run: whatever
        # status it chose, there is no verdict, so this is never a pass.
        print(f"commsim: error: {e} was called inside commsim's process before the "
              f"{args.verb} could give its verdict", file=sys.stderr)
        return e.code or 1
    except Terminated as e:
        print(f"commsim: terminated by {e}", file=sys.stderr)
        end_now(e.exit_code)
    return int(rc or 0)


if __name__ == "__main__":
    try:
        code = main()
    except KeyboardInterrupt:        # in the instant between the verdict and the return
        code = interrupted()
    sys.exit(code)
