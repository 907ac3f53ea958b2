"""The versions a run simulates: one input per run, read by every layer from one place.

A field report names a driver, a CUDA runtime, a PyTorch and an NCCL, and the same program
fails under one set and not another. `Versions` is that set. It travels on the run's
`Cluster` (`cluster.versions`), so the simulated driver, the hosted surfaces and the library
models read the same value:

    cluster.versions.driver_major          # 580 for "580.82.07"
    cluster.versions.torch >= (2, 11)      # tuples compare as versions
    cluster.versions.nccl                  # (2, 29, 7)

Where it comes from, first match wins: a command's flags (`--driver-version`,
`--cuda-version`, `--torch-version`, `--nccl-version`), the scenario's `[versions]` table,
the sweep generator's draw, and `installed()` (the torch in this environment, the NCCL of an
installed `nvidia-nccl-cu*` wheel or else the one that torch release ships with, and the
driver commsim has always simulated). The hosted Python of torch stays the installed one:
a version switch changes what commsim serves (the rules that cite a release), never the torch
code a program imports. docs/scenario-format.md, "Versions", lists the fields.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from typing import Any, Mapping

from commsim.errors import UserError

DEFAULT_DRIVER = "580.82.07"
# The CUDA runtime a hosted program links: cudaRuntimeGetVersion 13000, what the installed
# cuda-bindings 13.x pairs with (commsim/hosting/surfaces/cuda/runtime_api.py).
DEFAULT_CUDA = (13, 0)
DEFAULT_TORCH = (2, 13, 0)

# The NCCL each PyTorch release's wheels ship, by the CUDA it was built for: PyTorch's
# RELEASE.md "Release Compatibility Matrix" (the NCCL column, backfilled for 2.10-2.12 by
# pytorch/pytorch#190386 from each release branch's .ci/docker/ci_commit_pins/nccl*.txt).
# 2.8 and 2.9 have no NCCL column there: UNCONFIRMED, the nvidia-nccl-cu12 pins of their
# wheels as remembered (2.27.3 and 2.27.5).
TORCH_NCCL: dict[tuple[int, int], dict[tuple[int, int], tuple[int, int, int]]] = {
    (2, 8): {(12, 6): (2, 27, 3), (12, 8): (2, 27, 3), (12, 9): (2, 27, 3)},
    (2, 9): {(12, 6): (2, 27, 5), (12, 8): (2, 27, 5)},
    (2, 10): {(12, 6): (2, 27, 5), (12, 8): (2, 27, 5), (13, 0): (2, 28, 9)},
    (2, 11): {(12, 6): (2, 28, 9), (12, 8): (2, 28, 9), (13, 0): (2, 28, 9)},
    (2, 12): {(12, 6): (2, 29, 3), (13, 0): (2, 29, 7), (13, 2): (2, 29, 7)},
    (2, 13): {(12, 6): (2, 29, 3), (13, 0): (2, 29, 7), (13, 2): (2, 29, 7)},
    (2, 14): {(12, 6): (2, 29, 3), (13, 0): (2, 30, 7), (13, 2): (2, 30, 7)},
}

# One line per field: (what it is, an example, how many numbers it has at least and at most).
FIELDS: dict[str, tuple[str, str, int, int]] = {
    "driver": ("the NVIDIA kernel driver", "580.82.07", 1, 4),
    "cuda": ("the CUDA runtime the program links", "12.8", 2, 3),
    "torch": ("the PyTorch release", "2.10.0", 2, 3),
    "nccl": ("the NCCL library", "2.27.5", 2, 3),
}
_NUMBERS = re.compile(r"\d{1,5}(\.\d{1,5})*")


@dataclass(frozen=True)
class Versions:
    """Driver, CUDA runtime, PyTorch and NCCL of one run. Tuples compare as versions."""

    driver: str = DEFAULT_DRIVER
    cuda: tuple[int, int] = DEFAULT_CUDA
    torch: tuple[int, int, int] = DEFAULT_TORCH
    nccl: tuple[int, int, int] = TORCH_NCCL[(2, 13)][(13, 0)]

    @property
    def driver_major(self) -> int:
        """The driver branch (580 for 580.82.07): the driver's answers change by branch."""
        return int(self.driver.split(".")[0])

    @property
    def cuda_runtime(self) -> int:
        """cudaRuntimeGetVersion's encoding: 1000 * major + 10 * minor."""
        return 1000 * self.cuda[0] + 10 * self.cuda[1]

    def text(self) -> str:
        """`driver=580.82.07 cuda=13.0 torch=2.13.0 nccl=2.29.7`, as explain and replays say it."""
        return " ".join(f"{k}={self.field_text(k)}" for k in FIELDS)

    def field_text(self, name: str) -> str:
        v = getattr(self, name)
        return v if isinstance(v, str) else ".".join(map(str, v))

    def flags(self, base: "Versions | None" = None) -> list[str]:
        """The command-line flags that give these versions (only those differing from `base`)."""
        out: list[str] = []
        for k in FIELDS:
            if base is None or getattr(base, k) != getattr(self, k):
                out += [f"--{k}-version", self.field_text(k)]
        return out

    def with_fields(self, values: Mapping[str, str], where: str = "") -> "Versions":
        """These versions with `values` (field -> text) replacing theirs. A torch given
        without an NCCL brings the NCCL that torch release ships (TORCH_NCCL) for the CUDA in
        effect. `where` names the source in errors (a file and table, or empty for flags)."""
        parsed = {k: parse_field(k, v, where) for k, v in values.items()}
        out = dataclasses.replace(self, **parsed)
        if ("torch" in parsed or "cuda" in parsed) and "nccl" not in parsed:
            out = dataclasses.replace(out, nccl=shipped_nccl(out.torch, out.cuda, out.nccl))
        return out


def parse_field(name: str, text: object, where: str = "") -> object:
    """One field's value from its text; a UserError naming the field and the fix otherwise."""
    label = f"{where}{' ' if where else ''}{name}" if where else f"--{name}-version"
    if name not in FIELDS:
        raise UserError(f"{label}: unknown version field; accepted: {', '.join(FIELDS)}")
    what, example, low, high = FIELDS[name]
    if isinstance(text, float) and where:
        raise UserError(f"{label}: a TOML number ({text!r}) loses a version's zeros (2.10 reads "
                        f"as 2.1); write it as a string, e.g. {name} = \"{example}\"")
    if not isinstance(text, str) or not _NUMBERS.fullmatch(text.strip()):
        shown = repr(text) if isinstance(text, str) else f"{type(text).__name__} {text!r}"
        quote = '"' if where else ""
        raise UserError(f"{label}: {shown} is not a version of {what}; give numbers joined by "
                        f"dots, e.g. {quote}{example}{quote}")
    parts = tuple(int(p) for p in text.strip().split("."))
    if not low <= len(parts) <= high:
        raise UserError(f"{label}: {text!r} has {len(parts)} number(s); {what} has {low} to "
                        f"{high}, e.g. {example}")
    if name == "driver":
        return text.strip()
    if name == "cuda":
        return parts[:2]
    return (parts + (0, 0))[:3]


def shipped_nccl(torch: tuple[int, ...], cuda: tuple[int, ...],
                 fallback: tuple[int, int, int]) -> tuple[int, int, int]:
    """The NCCL PyTorch `torch` ships for `cuda` (its newest CUDA build when that CUDA has
    none), or `fallback` for a release the table does not list."""
    builds = TORCH_NCCL.get(tuple(torch[:2]))
    if not builds:
        return fallback
    return builds.get(tuple(cuda[:2]), builds[max(builds)])


def _dist_version(name: str) -> str | None:
    from importlib import metadata
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def installed() -> Versions:
    """The defaults: the installed torch (its release, local tag dropped: 2.13.0+cpu is
    2.13.0), the installed nvidia-nccl-cu13/cu12 wheel's NCCL if there is one, else what that
    torch ships (TORCH_NCCL), the CUDA runtime commsim serves and driver 580.82.07."""
    torch_text = _dist_version("torch")
    torch = DEFAULT_TORCH
    if torch_text:
        m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", torch_text)
        if m:
            torch = (int(m[1]), int(m[2]), int(m[3] or 0))
    nccl = shipped_nccl(torch, DEFAULT_CUDA, Versions.nccl)
    for wheel in ("nvidia-nccl-cu13", "nvidia-nccl-cu12"):
        text = _dist_version(wheel)
        m = re.match(r"(\d+)\.(\d+)\.(\d+)", text or "")
        if m:
            nccl = (int(m[1]), int(m[2]), int(m[3]))
            break
    return Versions(driver=DEFAULT_DRIVER, cuda=DEFAULT_CUDA, torch=torch, nccl=nccl)


def flags_of(given: Mapping[str, str]) -> list[str]:
    """The command-line words that give these version fields (`--torch-version 2.10` ...), in
    FIELDS order, so a printed command reproduces the run."""
    return [x for k in FIELDS if k in given for x in (f"--{k}-version", given[k])]


def pinned(sc: Any, given: Mapping[str, str]) -> Any:
    """Scenario `sc` under version fields a command line gives, over its own (`[versions]`,
    or what the generator drew); its replay command carries them."""
    if not given:
        return sc
    versions = sc.cluster.versions.with_fields(given)
    return dataclasses.replace(sc, cluster=dataclasses.replace(sc.cluster, versions=versions),
                               extra={**sc.extra, "version_flags": flags_of(given)})
