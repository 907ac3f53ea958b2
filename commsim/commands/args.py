"""argparse types for numeric flags: a bad value is refused by argparse itself, naming the
flag (`argument --seed: ...`), with exit status 2 and no traceback, before any work starts."""

from __future__ import annotations

import argparse
import math
from typing import Any


def non_negative_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"{n} is negative; give 0 or more")
    return n


def bounded_int(low: int, high: int):
    """An integer in low..high (a count that sizes a run's work and memory)."""
    def parse(text: str) -> int:
        n = non_negative_int(text) if low >= 0 else int(text)
        if not low <= n <= high:
            raise argparse.ArgumentTypeError(f"{n} is outside {low}..{high:,}")
        return n
    parse.__name__ = "integer"
    return parse


# Seeds are 64-bit: the simulated driver's generators refuse a larger one ("argument out of
# range" at the ranks' discovery, reported as the scenario failing).
SEED_MAX = 2 ** 64 - 1
seed = bounded_int(0, SEED_MAX)


# The longest wait a flag takes: a week is beyond any run or progress interval, and
# larger values overflow the clocks that time a wait (threading's "timestamp too large").
SECONDS_MAX = 7 * 24 * 3600


def seconds(text: str) -> float:
    """A positive, finite number of seconds, at most SECONDS_MAX."""
    try:
        s = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(s) or not 0 < s <= SECONDS_MAX:
        raise argparse.ArgumentTypeError(f"{text} is not accepted; give a number of seconds "
                                         f"> 0 and at most {SECONDS_MAX:,} (a week), e.g. 60")
    return s


def check_host_count(n: int, flag: str = "--hosts") -> None:
    """UserError naming `flag` unless `n` hosts is a cluster commsim builds (topology/limits)."""
    from commsim.errors import UserError
    from commsim.topology.limits import MAX_HOSTS
    if not 1 <= n <= MAX_HOSTS:
        raise UserError(f"{flag}: must be >= 1 and at most {MAX_HOSTS:,} (how many hosts of "
                        f"this shape), got {n:,}")


def add_version_flags(p: argparse.ArgumentParser, what: str) -> None:
    """--driver-version, --cuda-version, --torch-version, --nccl-version: the run's versions
    (commsim/versions.py), each a flag of its own as a report names them. `what` says what
    they override, for the help."""
    from commsim.versions import FIELDS, installed
    g = p.add_argument_group(
        "versions", f"the driver, CUDA runtime, PyTorch and NCCL the run simulates ({what}; "
                    f"default: {installed().text()}). They change the rules commsim serves; "
                    f"the hosted program still imports the installed torch")
    for name, (desc, example, _, _) in FIELDS.items():
        g.add_argument(f"--{name}-version", dest=f"{name}_version", type=_version_of(name),
                       default=None, metavar="X.Y[.Z]", help=f"{desc}, e.g. {example}"
                       + (" (alone, the NCCL becomes the one that PyTorch release ships)"
                          if name == "torch" else ""))


def _version_of(name: str):
    def parse(text: str) -> str:
        from commsim.errors import UserError
        from commsim.versions import parse_field
        try:
            parse_field(name, text)
        except UserError as e:
            raise argparse.ArgumentTypeError(str(e).split(": ", 1)[1]) from None
        return text.strip()
    parse.__name__ = "version"
    return parse


def with_versions(sc: Any, args: argparse.Namespace) -> Any:
    """The scenario under the --*-version flags (over its [versions] or the generator's draw)."""
    from commsim.versions import pinned
    return pinned(sc, version_flags(args))


def version_flags(args: argparse.Namespace) -> dict[str, str]:
    """The version fields the command line gives (field -> text), for Versions.with_fields."""
    from commsim.versions import FIELDS
    return {k: getattr(args, f"{k}_version") for k in FIELDS
            if getattr(args, f"{k}_version", None) is not None}
