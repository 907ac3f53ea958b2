"""Field-level checks shared by the scenario loader: typed reads of one TOML table, value
parsers (sizes, rank ranges, GPU references, CUDA error names) and the error they raise.

Every message has the shape `<file>: <field>: <what is wrong>; <what is accepted>`, where
<field> is written as a user finds it in the file: `[topology] preset`, `[[group]] #2 ranks`
(tables of an array are counted from 1, as a reader counts them).
"""

from __future__ import annotations

import datetime
import difflib
import functools
import re
from typing import Any, Iterable, Mapping, Sequence

from commsim.errors import UserError
from commsim.libmodels.nccl.errors import RESULT_NAMES
from commsim.topology.model import Cluster, GpuRef


class ScenarioError(UserError, ValueError):
    """A scenario file that cannot be loaded. The message names the file and the field."""


def did_you_mean(word: str, choices: Iterable[str], n: int = 1) -> str:
    """` (did you mean 'x'?)` when `word` is a near miss of one of `choices`, else ``."""
    close = difflib.get_close_matches(word, list(choices), n=n, cutoff=0.6)
    if not close:
        return ""
    return " (did you mean " + " or ".join(repr(c) for c in close) + "?)"


def describe(value: Any) -> str:
    """The TOML type of a parsed value, for "expected X, got Y" messages."""
    if isinstance(value, bool):  # before int: bool is an int subclass in Python
        return f"boolean {str(value).lower()}"
    if isinstance(value, int):
        return f"integer {value}"
    if isinstance(value, float):
        return f"float {value}"
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, (datetime.date, datetime.time)):
        return f"date/time {value}"
    return type(value).__name__


class Table:
    """One TOML table being read: knows its label for messages and rejects unknown keys.

    `accepted` lists every key this table may hold; `required` maps the keys that must be
    present to an example line shown when one is missing.
    """

    def __init__(self, source: str, label: str, data: Mapping[str, Any],
                 accepted: Sequence[str], required: Mapping[str, str] | None = None,
                 hint: str = "") -> None:
        self.source, self.label, self.data = source, label, data
        for key in data:
            if key not in accepted:
                raise self.error(
                    f"unknown key {key!r}{did_you_mean(key, accepted)}; "
                    f"accepted keys{hint}: {', '.join(accepted)}", key=None)
        for key, example in (required or {}).items():
            if key not in data:
                raise self.error(f"missing; this field is required, e.g. {example}", key)

    # -- messages ------------------------------------------------------------------------
    def field(self, key: str | None) -> str:
        return self.label if key is None else f"{self.label} {key}"

    def error(self, message: str, key: str | None) -> ScenarioError:
        return ScenarioError(f"{self.source}: {self.field(key)}: {message}")

    def __contains__(self, key: str) -> bool:
        return key in self.data

    # -- typed reads ---------------------------------------------------------------------
    def string(self, key: str, default: str | None = None, pattern: str | None = None,
               shape: str = "") -> str | None:
        """A string; with `pattern`, it must match it fully (`shape` says what it looks like)."""
        if key not in self.data:
            return default
        v = self.data[key]
        if not isinstance(v, str):
            raise self.error(f"expected a string, got {describe(v)}; e.g. {key} = \"...\"", key)
        if pattern is not None and not re.fullmatch(pattern, v):
            raise self.error(f"{v!r} is not {shape}", key)
        return v

    def integer(self, key: str, default: int | None = None, minimum: int | None = None,
                maximum: int | None = None, what: str = "value") -> int | None:
        if key not in self.data:
            return default
        return self.check_int(self.data[key], key, minimum, maximum, what=what)

    def check_int(self, v: Any, key: str, minimum: int | None = None,
                  maximum: int | None = None, what: str = "value", note: str = "") -> int:
        """An integer (not a boolean) in minimum..maximum; `note` explains the bounds."""
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.error(f"expected an integer, got {describe(v)}", key)
        if minimum is not None and v < minimum or maximum is not None and v > maximum:
            if minimum is not None and maximum is not None:
                accepted = f"{minimum}..{maximum}"
            else:
                accepted = f">= {minimum}" if minimum is not None else f"<= {maximum}"
            raise self.error(f"{what} {v} is out of range; accepted: {accepted}{note}", key)
        return v

    def boolean(self, key: str, default: bool) -> bool:
        if key not in self.data:
            return default
        v = self.data[key]
        if not isinstance(v, bool):
            raise self.error(f"expected true or false, got {describe(v)}", key)
        return v

    def array(self, key: str, example: str) -> list[Any] | None:
        """A TOML array (None if absent); a bare scalar is refused with `example`."""
        if key not in self.data:
            return None
        v = self.data[key]
        if not isinstance(v, list):
            raise self.error(f"expected an array, got {describe(v)}; e.g. {example}", key)
        if not v:
            raise self.error(f"must not be empty; e.g. {example}", key)
        return v

    def choices(self, key: str, accepted: Sequence[str], example: str,
                what: str = "") -> tuple[str, ...] | None:
        """An array of distinct names, each one of `accepted` (`what` names one, e.g. "op")."""
        items = self.array(key, example)
        if items is None:
            return None
        out: list[str] = []
        for v in items:
            if not isinstance(v, str):
                raise self.error(f"expected names (strings), got {describe(v)}; e.g. {example}",
                                 key)
            check_choice(self, key, v, accepted, what=what)
            if v in out:
                raise self.error(f"{v!r} is listed twice", key)
            out.append(v)
        return tuple(out)


def check_choice(table: Table, key: str, value: Any, accepted: Sequence[str],
                 what: str = "") -> str:
    """`value` must be one of `accepted` (a string); the message lists them all."""
    if not isinstance(value, str):
        raise table.error(f"expected a string, got {describe(value)}; accepted: "
                          f"{', '.join(accepted)}", key)
    if value not in accepted:
        raise table.error(f"unknown {what or key} {value!r}{did_you_mean(value, accepted)}; "
                          f"accepted: {', '.join(accepted)}", key)
    return value


# -- sizes ---------------------------------------------------------------------------------
MAX_SIZE = 4 << 30
_SIZE_UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
# Decimal and ambiguous units are refused: message sizes in this domain are powers of two
# and thresholds in the reference are binary (8 MiB = 8192 * 1024), so "4KB" is a likely slip.
_DECIMAL_UNITS = {"kb", "mb", "gb", "k", "m", "g", "kib", "mib", "gib"}
_SIZE_RE = re.compile(r"\s*([+-]?\d+)\s*([A-Za-z]*)\s*")
SIZE_HELP = ('an integer number of bytes, or a string with unit B, KiB, MiB or GiB '
             '(1 KiB = 1024 B), e.g. 8192 or "4KiB"')


def parse_size(table: Table, key: str, value: Any) -> int:
    """A message size in bytes: `8192` or `"4KiB"`. Must be > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise table.error(f"size {describe(value)} is not a size; accepted: {SIZE_HELP}", key)
    if isinstance(value, int):
        n = value
    else:
        m = _SIZE_RE.fullmatch(value)
        if not m:
            raise table.error(f"size {value!r} is not a size; accepted: {SIZE_HELP}", key)
        count, unit = m.groups()
        if unit not in _SIZE_UNITS:
            if unit.lower() in _DECIMAL_UNITS:
                fix = {"k": "KiB", "m": "MiB", "g": "GiB"}[unit[0].lower()]
                why = ("units are case-sensitive" if unit.lower() == fix.lower() else
                       "units are binary: B, KiB, MiB, GiB; decimal KB/MB/GB are refused")
                raise table.error(
                    f"size {value!r}: unit {unit!r} is not accepted; write {count}{fix} ({why})",
                    key)
            raise table.error(f"size {value!r}: unknown unit {unit!r}; accepted: {SIZE_HELP}", key)
        n = int(count) * _SIZE_UNITS[unit]
    if n <= 0:
        raise table.error(f"size {value!r} must be > 0 bytes; accepted: {SIZE_HELP}", key)
    if n > MAX_SIZE:
        raise table.error(f"size {value!r} is over 4GiB, the largest message commsim simulates "
                          f"(each rank holds several buffers of it in host memory)", key)
    return n


# -- ranks ---------------------------------------------------------------------------------
_RANGE_RE = re.compile(r"\s*(\d+)\s*\.\.\s*(\d+)\s*")
RANKS_HELP = 'an array of ranks like [0, 1, 2, 3], or an inclusive range string like "0..7"'


def parse_ranks(table: Table, key: str, value: Any, world: int) -> tuple[int, ...]:
    """Ranks of a group: `[0, 1, 2]` or `"0..7"` (inclusive), each in 0..world-1, distinct."""
    if isinstance(value, str):
        m = _RANGE_RE.fullmatch(value)
        if not m:
            raise table.error(f"{value!r} is not a rank range; accepted: {RANKS_HELP}", key)
        lo, hi = int(m.group(1)), int(m.group(2))
        if lo > hi:
            raise table.error(f"range {value!r} is empty (start > end); write \"{hi}..{lo}\"", key)
        ranks: list[Any] = list(range(lo, hi + 1))
    elif isinstance(value, list):
        ranks = value
    else:
        raise table.error(f"expected ranks, got {describe(value)}; accepted: {RANKS_HELP}", key)
    if not ranks:
        raise table.error(f"a group needs at least one rank; accepted: {RANKS_HELP}", key)
    seen: set[int] = set()
    for r in ranks:
        table.check_int(r, key, 0, world - 1, what="rank", note=f" (world size {world})")
        if r in seen:
            raise table.error(f"rank {r} is listed twice; a rank joins a group once", key)
        seen.add(r)
    return tuple(ranks)


# -- GPUs ----------------------------------------------------------------------------------
_GPU_RE = re.compile(r"(?P<host>[^/\s]+)/(?:gpu)?(?P<index>\d+)")


def parse_gpu(table: Table, key: str, value: Any, cluster: Cluster) -> GpuRef:
    """A GPU as `"host/index"` (`"host/gpu3"` too, as GpuRef prints it); it must exist."""
    first = next(cluster.gpu_refs())
    example = f'"{first.host}/{first.index}"'
    if not isinstance(value, str) or not (m := _GPU_RE.fullmatch(value)):
        raise table.error(f"GPU {value!r} is not \"host/index\"; e.g. {example}", key)
    host, index = m.group("host"), int(m.group("index"))
    names = [h.name for h in cluster.hosts]
    if host not in names:
        raise table.error(f"GPU {value!r}: unknown host {host!r}{did_you_mean(host, names)}; "
                          f"hosts: {_host_list(names)}", key)
    n = len(cluster.host(host).gpus)
    if index >= n:
        raise table.error(f"GPU {value!r}: host {host} has GPUs 0..{n - 1}", key)
    return GpuRef(host, index)


def check_host(table: Table, key: str, value: Any, cluster: Cluster) -> str:
    names = [h.name for h in cluster.hosts]
    if not isinstance(value, str):
        raise table.error(f"expected a host name, got {describe(value)}; e.g. {key} = "
                          f"\"{names[0]}\"", key)
    if value not in names:
        raise table.error(f"unknown host {value!r}{did_you_mean(value, names)}; "
                          f"hosts: {_host_list(names)}", key)
    return value


def _host_list(names: Sequence[str]) -> str:
    # An NVL72 has 18 trays: list a few and the count rather than a wall of names.
    if len(names) <= 6:
        return ", ".join(names)
    return f"{', '.join(names[:3])}, ..., {names[-1]} ({len(names)} hosts)"


# -- CUDA error names ----------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def cuda_error_names() -> frozenset[str]:
    """Every failing `cudaError_t` and `CUresult` member name (success excluded)."""
    from cuda.bindings import driver, runtime  # imported lazily: only files naming codes need it
    names = set(runtime.cudaError_t.__members__) | set(driver.CUresult.__members__)
    return frozenset(names - {"cudaSuccess", "CUDA_SUCCESS"})


# Outcomes that are not CUDA codes: what the group layer diagnoses (a hang, also after a
# timeout; ranks meeting at different collectives; a peer that died) and an fd that cannot be
# passed to another host (row V9); a fallback nobody reported (FH3); a library refusing a
# forced algorithm (AW1); NCCL's failing results (NC8, NC10, and what the simulated NCCL's
# set-up returns on the machine). Names as the runner reports them.
RUN_OUTCOMES = ("hang", "CollectiveMismatch", "RankFailed", "FdTransportError", "SilentFallback",
                "WorkspaceTooSmall") + RESULT_NAMES[1:-1]


def check_cuda_error(table: Table, key: str, value: Any) -> str:
    names = cuda_error_names() | frozenset(RUN_OUTCOMES)
    accepted = ("a failing cudaError_t member (e.g. cudaErrorInvalidResourceHandle) or CUresult "
                "member (e.g. CUDA_ERROR_NOT_PERMITTED), or one of " + ", ".join(RUN_OUTCOMES))
    if not isinstance(value, str):
        raise table.error(f"expected an error name, got {describe(value)}; accepted: {accepted}",
                          key)
    if value in ("cudaSuccess", "CUDA_SUCCESS"):
        raise table.error(f"{value} is success, not an error; accepted: {accepted}", key)
    if value not in names:
        raise table.error(f"unknown CUDA error {value!r}{did_you_mean(value, names, n=2)}; "
                          f"accepted: {accepted}", key)
    return value


# -- policy --------------------------------------------------------------------------------
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_POLICY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_POLICY_REF = re.compile(
    rf"(?P<where>{_IDENT}(?:\.{_IDENT})*|[A-Za-z0-9_./-]+\.py):(?P<attr>{_IDENT})")
POLICY_HELP = ('a preset name like "default", or "module:object" / "file.py:object" '
               '(a .py path relative to the scenario file), e.g. "policies/vllm_pre_fix.py:POLICY"')


def check_policy(table: Table, key: str, value: str) -> str:
    """Only the shape is checked here; commsim.policy.resolve looks the name up or imports the
    object later (with getattr, hence one identifier after the colon)."""
    if _POLICY_NAME.fullmatch(value) or _POLICY_REF.fullmatch(value):
        return value
    raise table.error(f"policy {value!r} is not a policy reference; accepted: {POLICY_HELP}", key)
