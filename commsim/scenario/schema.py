"""The scenario file format (TOML): `load(path)` / `loads(text, source)` -> `Scenario`.

The format is documented in docs/scenario-format.md. Every rejection is a ScenarioError whose
message names the file, the field and what is accepted, so a user can fix the file without
reading this code. Sections are read in dependency order: the topology fixes which hosts and
GPUs exist, the placement fixes the world size, and groups, faults and expectations are
checked against both.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from pathlib import Path
from typing import Any, Mapping, Sequence

from commsim.errors import UserError
from commsim.util.fileio import read_input, write_atomic
from commsim.scenario import machine
from commsim.scenario.fields import (
    ScenarioError, Table, check_choice, check_cuda_error, check_policy, describe, did_you_mean,
    parse_ranks, parse_size,
)
from commsim.backends import backend_names
from commsim.libmodels.fd_exchange import TRANSPORTS
from commsim.scenario.model import ALLOCATORS, DTYPE_BYTES, DTYPES, OPS, SETUPS, STEPS, Expectation, Group, Scenario, Workload

__all__ = ["ScenarioError", "load", "loads", "write_scenario", "SECTIONS"]

# Top-level tables; True marks an array of tables ([[group]]), False a plain table.
SECTIONS: dict[str, bool] = {
    "scenario": False, "topology": False, "placement": False, "group": True,
    "fault": True, "workload": False, "expect": True, "versions": False,
}
SCENARIO_KEYS = ("name", "description", "seed", "policy")
GROUP_KEYS = ("name", "ranks")
WORKLOAD_KEYS = ("ops", "sizes", "dtypes", "graph_capture", "discard_capture", "iterations",
                 "allocator", "setup", "nccl_env", "fd_transport")
EXPECT_KEYS = ("group", "op", "size", "backend", "error", "step", "rank", "leak", "message",
               "wrong_data", "max_error", "transport", "pair", "fallback", "undefined")
# The forms of an expectation: one of these keys says what is expected (leak may join one).
EXPECT_FORMS = ("backend", "error", "wrong_data", "transport", "fallback", "undefined")
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_NAME_SHAPE = "a name of letters, digits, '.', '_' and '-' (starting with a letter or digit)"


def load(path: str | os.PathLike[str]) -> Scenario:
    """Read and validate one scenario file."""
    p = Path(path)
    try:
        text = read_input(p).decode("utf-8")
    except UserError as e:            # a FIFO, a device, too large
        raise ScenarioError(str(e)) from None
    except FileNotFoundError:
        raise ScenarioError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise ScenarioError(f"{p}: is a directory, not a scenario file") from None
    except UnicodeDecodeError as e:
        raise ScenarioError(f"{p}: not UTF-8 text (byte {e.start}); TOML files are UTF-8") from None
    except OSError as e:
        raise ScenarioError(f"{p}: cannot read: {e.strerror}") from None
    return _build(text, str(p), p)


def loads(text: str, source: str = "<string>") -> Scenario:
    """Validate scenario text; `source` names it in messages (usually the file path)."""
    return _build(text, source, None)


def write_scenario(path: str | os.PathLike[str], text: str, validate: bool = True,
                   overwrite: bool = True) -> Path:
    """Write a scenario file atomically. With `validate`, text that would not load is refused
    before anything is written."""
    if validate:
        loads(text, str(path))
    return write_atomic(path, text, overwrite=overwrite)


# -- the document --------------------------------------------------------------------------
def _build(text: str, source: str, path: Path | None) -> Scenario:
    doc = _parse_toml(text, source)
    _check_sections(doc, source)
    head = Table(source, "[scenario]", doc["scenario"], SCENARIO_KEYS,
                 required={"name": 'name = "hgx-h100-tp8"'})
    name = head.string("name", pattern=_NAME, shape=_NAME_SHAPE)
    description = head.string("description", default="")
    seed = head.integer("seed", default=0, minimum=0, what="seed")
    policy = check_policy(head, "policy", head.string("policy", default="default"))

    cluster, spec, notes = machine.topology(source, doc["topology"])
    placement, views = machine.placement(source, doc.get("placement"), cluster)
    world = len(placement)
    cluster = _versions(source, doc.get("versions", {}), cluster)
    faults, cluster = machine.faults(source, doc.get("fault", []), cluster, world)
    groups = _groups(source, doc.get("group", []), world)
    workload = _workload(source, doc.get("workload", {}))
    expectations = tuple(_expectation(source, n, e, groups, workload, world)
                         for n, e in enumerate(doc.get("expect", []), 1))
    return Scenario(name=name, cluster=cluster, placement=placement, groups=groups,
                    workload=workload, faults=faults, policy=policy, expectations=expectations,
                    seed=seed, description=description, topology_spec=spec, path=path,
                    extra={"topology_warnings": notes} if notes else {}, views=views)


_POS_RE = re.compile(r"\s*\(at (?:line (\d+), column (\d+)|end of document)\)\s*$")


def _parse_toml(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise ScenarioError(f"{source}: TOML nested deeper than Python's reader can follow; a "
                            f"scenario is a few tables deep: flatten it") from None
    except tomllib.TOMLDecodeError as e:
        # Python 3.11's message ends "(at line L, column C)" or "(at end of document)";
        # move the position to the front, compiler style, so editors can jump to it.
        msg = str(e)
        m = _POS_RE.search(msg)
        if not m:
            raise ScenarioError(f"{source}: TOML syntax error: {msg}") from None
        what = msg[:m.start()]
        if m.group(1):
            where = f"line {m.group(1)}, column {m.group(2)}"
        else:
            where = f"line {max(1, len(text.splitlines()))} (end of file)"
        raise ScenarioError(f"{source}: {where}: TOML syntax error: {what}") from None


def _label(name: str) -> str:
    return f"[[{name}]]" if SECTIONS[name] else f"[{name}]"


def _check_sections(doc: Mapping[str, Any], source: str) -> None:
    accepted = ", ".join(_label(s) for s in SECTIONS)
    for key, value in doc.items():
        if key not in SECTIONS:
            if isinstance(value, (dict, list)):
                hint = did_you_mean(key, SECTIONS)
                raise ScenarioError(f"{source}: [{key}]: unknown table{hint}; accepted tables: "
                                    f"{accepted}")
            owner = _owner_of(key)
            hint = f" (did you mean {owner} {key}?)" if owner else ""
            raise ScenarioError(f"{source}: {key}: a top-level key outside any table{hint}; "
                                f"put it in one of {accepted}")
        if SECTIONS[key]:
            if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
                raise ScenarioError(f"{source}: {_label(key)}: must be an array of tables; "
                                    f"write [[{key}]] (double brackets) before each entry")
        elif not isinstance(value, dict):
            raise ScenarioError(f"{source}: [{key}]: must be one table, got {describe(value)}; "
                                f"write [{key}] (single brackets) once")
    for key in ("scenario", "topology"):
        if key not in doc:
            example = ('[scenario]\nname = "my-scenario"' if key == "scenario"
                       else '[topology]\npreset = "hgx-h100-8"')
            raise ScenarioError(f"{source}: [{key}]: missing; every scenario needs it, e.g.\n"
                                f"{example}")


def _owner_of(key: str) -> str:
    """The table a stray top-level key most likely belongs to (for the hint)."""
    for table, keys in (("[scenario]", SCENARIO_KEYS), ("[topology]", machine.PRESET_KEYS),
                        ("[workload]", WORKLOAD_KEYS), ("[placement]", machine.PLACEMENT_KEYS)):
        if key in keys:
            return table
    return ""


# -- versions, groups, workload, expectations ----------------------------------------------
def _versions(source: str, data: Mapping[str, Any], cluster: Any) -> Any:
    """`[versions]`: driver, cuda, torch, nccl as strings ("2.10.0"); the fields left out keep
    the installed defaults (commsim/versions.py)."""
    from commsim.versions import FIELDS
    if not data:
        return cluster
    t = Table(source, "[versions]", data, tuple(FIELDS))
    try:
        versions = cluster.versions.with_fields(dict(data), where=f"{source}: [versions]")
    except UserError as e:
        raise ScenarioError(str(e)) from None
    return dataclasses.replace(cluster, versions=versions) if t else cluster


# -- groups, workload, expectations --------------------------------------------------------
def _groups(source: str, items: Sequence[Mapping[str, Any]], world: int) -> tuple[Group, ...]:
    if not items:
        return (Group("world", tuple(range(world))),)  # no [[group]]: all ranks together
    groups: list[Group] = []
    first: dict[str, int] = {}
    for n, data in enumerate(items, 1):
        t = Table(source, f"[[group]] #{n}", data, GROUP_KEYS,
                  required={"name": 'name = "tp"', "ranks": 'ranks = "0..7"'})
        name = t.string("name", pattern=_NAME, shape=_NAME_SHAPE)
        if name in first:
            raise t.error(f"group name {name!r} is already used by [[group]] #{first[name]}; "
                          f"group names must be unique", "name")
        first[name] = n
        groups.append(Group(name, parse_ranks(t, "ranks", data["ranks"], world)))
    return tuple(groups)


def _workload(source: str, data: Mapping[str, Any]) -> Workload:
    t = Table(source, "[workload]", data, WORKLOAD_KEYS)
    d = Workload()
    ops = t.choices("ops", OPS, 'ops = ["all_reduce"]', what="op") or d.ops
    dtypes = t.choices("dtypes", DTYPES, 'dtypes = ["bfloat16"]', what="dtype") or d.dtypes
    sizes = d.sizes
    raw = t.array("sizes", 'sizes = ["4KiB", "1MiB", 8192]')
    if raw is not None:
        parsed: list[int] = []
        for v in raw:
            b = parse_size(t, "sizes", v)
            if b in parsed:
                raise t.error(f"size {v!r} ({b} bytes) is listed twice", "sizes")
            parsed.append(b)
        sizes = tuple(parsed)
    for b in sizes:
        for dt in dtypes:
            # A message is a whole number of elements; a remainder would silently be dropped.
            if b % DTYPE_BYTES[dt]:
                raise t.error(f"size {b} bytes is not a whole number of {dt} elements "
                              f"({DTYPE_BYTES[dt]} bytes each); use a multiple of "
                              f"{DTYPE_BYTES[dt]}", "sizes")
    return Workload(ops=ops, sizes=sizes, dtypes=dtypes,
                    graph_capture=t.boolean("graph_capture", d.graph_capture),
                    discard_capture=t.boolean("discard_capture", d.discard_capture),
                    iterations=t.integer("iterations", d.iterations, minimum=1, what="iterations"),
                    allocator=_choice(t, "allocator", ALLOCATORS, d.allocator),
                    setup=_choice(t, "setup", SETUPS, d.setup),
                    nccl_env=_nccl_env(t),
                    fd_transport=_choice(t, "fd_transport", tuple(TRANSPORTS), d.fd_transport))


def _nccl_env(t: Table) -> tuple[tuple[str, str], ...]:
    """`nccl_env = { NCCL_NVLS_ENABLE = "0" }`: names and values as NCCL reads them, checked
    against what commsim models (commsim/libmodels/nccl_rules.py)."""
    if "nccl_env" not in t:
        return ()
    raw = t.data["nccl_env"]
    if not isinstance(raw, Mapping):
        raise t.error(f"expected a table of NCCL_* = \"value\", got {describe(raw)}; e.g. "
                      f'nccl_env = {{ NCCL_NVLS_ENABLE = "0" }}', "nccl_env")
    from commsim.libmodels.nccl_rules import parse_env
    from commsim.errors import UserError
    env = {}
    for k, v in raw.items():
        if isinstance(v, bool) or not isinstance(v, (str, int)):
            raise t.error(f"{k}: expected a string or integer, got {describe(v)}", "nccl_env")
        env[k] = str(v)
    try:
        parse_env(env)
    except UserError as e:
        raise t.error(str(e), "nccl_env") from None
    return tuple(sorted(env.items()))


def _choice(t: Table, key: str, accepted: Sequence[str], default: str) -> str:
    if key not in t:
        return default
    return check_choice(t, key, t.data[key], accepted)


def _expectation(source: str, n: int, data: Mapping[str, Any], groups: Sequence[Group],
                 workload: Workload, world: int) -> Expectation:
    t = Table(source, f"[[expect]] #{n}", data, EXPECT_KEYS)
    names = [g.name for g in groups]
    forms = [k for k in EXPECT_FORMS if k in data]
    if len(forms) > 1:
        raise t.error(f"gives {' and '.join(forms)}; one expectation says one thing: backend "
                      f"(which backend a group picks), error (which CUDA error a step returns), "
                      f"wrong_data, transport, fallback or undefined; write one [[expect]] "
                      f"each", None)
    if not forms and "leak" not in data:
        raise t.error('says nothing; give backend = "fabric" (one of ' + ", ".join(backend_names())
                      + '), or error = "cudaErrorInvalidResourceHandle" with step = "init", '
                      "or leak = true, wrong_data = true, transport = \"P2P\" with pair = [0, 1], "
                      "fallback = \"nccl\", undefined = true", None)
    group = t.string("group")
    if group is not None and group not in names:
        raise t.error(f"unknown group {group!r}{did_you_mean(group, names)}; groups in this "
                      f"file: {', '.join(names)}", "group")
    op = t.string("op")
    if op is not None:
        check_choice(t, "op", op, OPS, what="op")
        if op not in workload.ops:
            raise t.error(f"op {op!r} is not run; [workload] ops are {', '.join(workload.ops)}",
                          "op")
    size = None
    if "size" in data:
        size = parse_size(t, "size", data["size"])
        if size not in workload.sizes:
            raise t.error(f"size {data['size']!r} ({size} bytes) is not run; [workload] sizes "
                          f"are {', '.join(str(s) for s in workload.sizes)} bytes", "size")
    backend = None
    if "backend" in data:
        backend = check_choice(t, "backend", data["backend"], backend_names(), what="backend")
        if group is None:
            if len(names) != 1:
                raise t.error(f"a backend expectation needs group = \"...\" when the file has "
                              f"several groups; groups: {', '.join(names)}", "group")
            group = names[0]  # one group only: the expectation can only be about it
    error = step = None
    if "error" in data:
        error = check_cuda_error(t, "error", data["error"])
        if "step" not in data:
            raise t.error(f"missing; an error expectation says at which step, e.g. step = "
                          f"\"init\" (one of {', '.join(STEPS)})", "step")
    message = t.string("message")
    undefined = t.boolean("undefined", False)
    if message is not None and error is None and not undefined:
        raise t.error("message applies only with error = \"...\" (text the error's message "
                      "or diagnosis must contain) or undefined = true (text of the event)",
                      "message")
    if "step" in data:
        if error is None:
            raise t.error("step applies only with error = \"...\"", "step")
        step = check_choice(t, "step", data["step"], STEPS, what="step")
    rank = t.integer("rank", minimum=0, what="rank")
    if rank is not None and rank >= world:
        raise t.error(f"rank {rank} is out of range; accepted: 0..{world - 1} "
                      f"(world size {world})", "rank")
    outcome = _outcome(t, data, names, groups, group, world)
    return Expectation(group=outcome.pop("group", group), op=op, size=size, backend=backend,
                       error=error, step=step, rank=rank, leak=t.boolean("leak", False),
                       message=message, undefined=undefined, **outcome)


def _outcome(t: Table, data: Mapping[str, Any], names: Sequence[str], groups: Sequence[Group],
             group: str | None, world: int) -> dict[str, Any]:
    """The keys of the outcomes that are not errors: wrong_data/max_error, transport/pair,
    fallback (commsim/scenario/outcomes.py judges them)."""
    out: dict[str, Any] = {}
    if t.boolean("wrong_data", False):
        out["wrong_data"] = True
    if "max_error" in data:
        v = data["max_error"]
        if not out.get("wrong_data"):
            raise t.error("max_error applies only with wrong_data = true", "max_error")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or v != v or v == float("inf"):
            raise t.error(f"expected a number > 0 (the largest absolute error of the result), got "
                          f"{describe(v)}; e.g. max_error = 0.5", "max_error")
        out["max_error"] = float(v)
    if "transport" in data:
        out["transport"] = t.string("transport")
        raw = t.array("pair", "pair = [0, 1]")
        if raw is None:
            raise t.error("missing; a transport expectation names two ranks, e.g. pair = [0, 1]",
                          "pair")
        if len(raw) != 2 or raw[0] == raw[1]:
            raise t.error(f"expected two different ranks, e.g. pair = [0, 1]; got {raw!r}", "pair")
        pair = tuple(t.check_int(r, "pair", 0, world - 1, what="rank") for r in raw)
        owners = [g.name for g in groups if set(pair) <= set(g.ranks)]
        if group is None:
            if not owners:
                raise t.error(f"ranks {pair[0]} and {pair[1]} share no group; NCCL's transports "
                              f"are per group", "pair")
            out["group"] = owners[0]
        elif group not in owners:
            raise t.error(f"ranks {pair[0]} and {pair[1]} are not both in group {group!r}", "pair")
        out["pair"] = pair
    elif "pair" in data:
        raise t.error("pair applies only with transport = \"...\"", "pair")
    if "fallback" in data:
        out["fallback"] = check_choice(t, "fallback", data["fallback"], backend_names(),
                                       what="backend")
        if group is None:
            if len(names) != 1:
                raise t.error(f"a fallback expectation needs group = \"...\" when the file has "
                              f"several groups; groups: {', '.join(names)}", "group")
            out["group"] = names[0]
    return out
