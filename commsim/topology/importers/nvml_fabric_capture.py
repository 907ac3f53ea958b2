"""Reading NVML GPU fabric captures: the Fabric sections of `nvidia-smi -q` text (also as
`grep -C` cuts them), the <fabric> elements of `nvidia-smi -q -x` XML, JSON with NVML's field
names (`state`, `status`, `cliqueId`, `clusterUuid`, as `nvmlGpuFabricInfo_t` names them)
wherever a tool nests it (a log line carrying it as an escaped string included), and the
two-column tables of tools that read NVML (`| Clique ID | 4026 |`).

What people paste is often cut short or has a GPU whose values do not read: every GPU whose
record is complete enough is imported, each other one is a warning naming its line, and the
file is refused only when no GPU is usable.

A record carries the fields the capture had; `missing` names those it lacked, so a partial
capture merges over the topology's values instead of inventing them (row T6), and `notes`
says what was assumed.
"""

from __future__ import annotations

import json
import re
import uuid as uuidlib
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from commsim.util.fileio import read_input
from commsim.topology.model import FabricInfo, FabricState, NVML_ERROR_UNKNOWN, NVML_SUCCESS, TopologyError, ZERO_UUID

FIELDS = ("state", "status", "clique_id", "cluster_uuid")

# How nvidia-smi prints nvmlGpuFabricState_t; "N/A" is what a GPU without fabric shows.
_STATES = {"completed": FabricState.COMPLETED, "in progress": FabricState.IN_PROGRESS,
           "not started": FabricState.NOT_STARTED, "not supported": FabricState.NOT_SUPPORTED,
           "n/a": FabricState.NOT_SUPPORTED}
STATE_WORDS = "Completed, In Progress, Not Started, N/A (or the NVML values 3, 2, 1, 0)"
_GPU_HEADER = re.compile(r"^GPU\s+[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]\s*$")


class FabricInfoError(TopologyError):
    """Fabric info that cannot be read or does not fit the topology."""


@dataclass(frozen=True)
class FabricRecord:
    """One GPU's fabric info and where it was read (for messages)."""

    info: FabricInfo
    status_text: str = "Success"
    where: str = ""
    missing: frozenset[str] = frozenset()   # FIELDS the capture lacked: keep the topology's
    notes: tuple[str, ...] = ()


# -- parsing ----------------------------------------------------------------------------


def _state(value: Any, where: str) -> FabricState:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 3:
        return FabricState(value)
    if isinstance(value, str):
        key = value.strip().lower().replace("_", " ")
        key = key.removeprefix("nvml gpu fabric state ")
        if key in _STATES:
            return _STATES[key]
    raise FabricInfoError(f"{where}: fabric State {value!r} is not one of {STATE_WORDS}")


def _status(value: Any, where: str) -> tuple[int, str]:
    if isinstance(value, int) and not isinstance(value, bool):
        return (NVML_SUCCESS, "Success") if value == 0 else (value, f"NVML error {value}")
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in ("success", "nvml_success", "n/a", ""):
            return NVML_SUCCESS, text or "Success"
        return NVML_ERROR_UNKNOWN, text
    raise FabricInfoError(f"{where}: fabric Status {value!r} is not a string or an NVML code")


def _clique(value: Any, where: str) -> int:
    if value is None or (isinstance(value, str) and value.strip().upper() in ("N/A", "")):
        return 0
    try:
        n = int(str(value).strip(), 0)
    except ValueError:
        raise FabricInfoError(f"{where}: CliqueId {value!r} is not an integer") from None
    if not 0 <= n < 1 << 32:
        raise FabricInfoError(f"{where}: CliqueId {n} is outside 0..2^32-1 (an unsigned int)")
    return n


def _uuid(value: Any, where: str) -> bytes:
    if value is None:
        return ZERO_UUID
    text = str(value).strip()
    if text.upper() in ("N/A", ""):
        return ZERO_UUID
    try:
        return uuidlib.UUID(text).bytes
    except ValueError:
        raise FabricInfoError(f"{where}: ClusterUUID {text!r} is not a UUID (16 bytes as "
                              f"8-4-4-4-12 hex digits, e.g. "
                              f"00000000-0000-0000-0000-000000000000)") from None


def _record(fields: Mapping[str, Any], where: str) -> FabricRecord:
    """One GPU's record from the fields found; absent ones are named, not invented (T6)."""
    missing = frozenset(f for f in FIELDS if f not in fields)
    if missing == frozenset(FIELDS):
        raise FabricInfoError(f"{where}: fabric info without State, Status, CliqueId or "
                              f"ClusterUUID; accepted state words: {STATE_WORDS}")
    status, text = _status(fields.get("status", "Success"), where)
    info = FabricInfo(cluster_uuid=_uuid(fields.get("cluster_uuid"), where),
                      clique_id=_clique(fields.get("clique_id"), where),
                      state=_state(fields["state"], where) if "state" in fields
                      else FabricState.NOT_SUPPORTED, status=status)
    notes = ()
    if missing:
        names = ", ".join(sorted(missing))
        notes = (f"{where}: partial fabric info, no {names}; kept the topology's value(s)",)
    return FabricRecord(info, text, where, missing, notes)


_TEXT_KEYS = {"state": "state", "status": "status", "cliqueid": "clique_id",
              "clusteruuid": "cluster_uuid"}


def parse_fabric_text(text: str, source: str = "<nvidia-smi -q>") -> list[FabricRecord]:
    """The Fabric sections of `nvidia-smi -q` output, one record per GPU in file order (the
    tool lists GPUs by PCI bus id, which is the index order). Fabric blocks pasted without
    their GPU headers count one GPU each."""
    lines = text.splitlines()
    out: list[FabricRecord] = []
    bad: list[str] = []
    seen_gpu_header = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if _GPU_HEADER.match(line.strip()):
            seen_gpu_header = True
        if line.strip() == "Fabric":
            indent = len(line) - len(line.lstrip())
            fields: dict[str, str] = {}
            j = i + 1
            while j < len(lines) and lines[j].strip():
                sub = lines[j]
                if len(sub) - len(sub.lstrip()) <= indent:
                    break
                key, sep, value = sub.partition(":")
                norm = re.sub(r"\s+", "", key).lower()
                if sep and norm in _TEXT_KEYS and _TEXT_KEYS[norm] not in fields:
                    fields[_TEXT_KEYS[norm]] = value.strip()
                j += 1
            _keep(out, bad, fields, f"{source} line {i + 1}")
            i = j
            continue
        i += 1
    if not out and not bad:
        out = _table_records(lines, source, bad)
    _refuse_if_none(out, bad, source)
    if not out:
        hint = (" (the GPU sections have none: the driver predates fabric info, or the output "
                "was cut)") if seen_gpu_header else ""
        raise FabricInfoError(f"{source}: no 'Fabric' section found{hint}; expected "
                              f"`nvidia-smi -q` output whose GPU sections hold 'Fabric' with "
                              f"State, Status, CliqueId and ClusterUUID lines")
    return _with_warnings(out, bad)


def _keep(out: list[FabricRecord], bad: list[str], fields: Mapping[str, Any], where: str) -> None:
    """Append the record of one GPU, or, when its values do not read, the reason to `bad`."""
    try:
        out.append(_record(fields, where))
    except FabricInfoError as e:
        bad.append(str(e))


def _refuse_if_none(out: list[FabricRecord], bad: list[str], source: str) -> None:
    if bad and not out:
        raise FabricInfoError(f"{source}: no GPU's fabric info is usable: {bad[0]}"
                              + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""))


def _with_warnings(out: list[FabricRecord], bad: list[str], cut: str = "") -> list[FabricRecord]:
    """The records, the first carrying a warning per GPU left out (and where a cut fell)."""
    warn = tuple(f"skipped: {b}" for b in bad) + ((cut,) if cut else ())
    if not warn:
        return out
    first = out[0]
    out[0] = FabricRecord(first.info, first.status_text, first.where, first.missing,
                          first.notes + warn)
    return out


# Row names of the two-column tables tools that read NVML print (gpud's fabric-manager
# component, leptonai/gpud#1108: "| Clique ID | 0 |", "| State | Not Supported |").
_TABLE_KEYS = {"state": "state", "status": "status", "cliqueid": "clique_id",
               "clusteruuid": "cluster_uuid"}
_TABLE_ROW = re.compile(r"^\s*\|\s*([^|]+?)\s*\|\s*([^|]*?)\s*\|\s*$")


def _table_records(lines: list[str], source: str, bad: list[str]) -> list[FabricRecord]:
    """One record per table (or per `GPU UUID` row, which starts a GPU), from its rows."""
    out: list[FabricRecord] = []
    fields: dict[str, str] = {}
    start: int | None = None      # the line the GPU's rows began on

    def close() -> None:
        nonlocal start
        if fields:
            _keep(out, bad, dict(fields), f"{source} line {(start or 0) + 1}")
            fields.clear()
        start = None
    for n, line in enumerate(lines):
        m = _TABLE_ROW.match(line)
        if m is None:
            if line.strip().startswith("+-") or not line.strip():
                continue
            close()
            continue
        key = re.sub(r"\s+", "", m.group(1)).lower()
        if key in ("gpuuuid", "uuid"):
            close()
            start = n
        elif key in _TABLE_KEYS:
            start = n if start is None else start
            fields.setdefault(_TABLE_KEYS[key], m.group(2))
    close()
    return out


_JSON_KEYS = {"state": "state", "status": "status", "clique_id": "clique_id",
              "cliqueid": "clique_id", "cluster_uuid": "cluster_uuid",
              "clusteruuid": "cluster_uuid"}


_JSON_WRAPPERS = ("fabric", "gpufabricinfo", "gpu_fabric_info", "fabricinfo")


def _json_gpu(obj: Any, where: str) -> FabricRecord:
    if not isinstance(obj, dict):
        raise FabricInfoError(f"{where}: expected an object with state, status, cliqueId, "
                              f"clusterUuid (NVML's nvmlGpuFabricInfo_t names); got {obj!r}")
    for k, v in obj.items():   # {"index": 0, "fabric": {...}} as per-GPU dumps nest it
        if k.lower() in _JSON_WRAPPERS and isinstance(v, dict):
            return _json_gpu(v, f"{where} {k}")
    fields, ignored = {}, []
    for k, v in obj.items():
        norm = _JSON_KEYS.get(k.lower())
        if norm is None:
            ignored.append(k)
            continue
        fields[norm] = v
    rec = _record(fields, where)
    if ignored:
        note = (f"{where}: ignored key(s) {', '.join(map(repr, ignored))}; read: state, status, "
                f"cliqueId, clusterUuid")
        rec = FabricRecord(rec.info, rec.status_text, rec.where, rec.missing, rec.notes + (note,))
    return rec


def parse_fabric_json(text: str, source: str = "<json>") -> dict[str | None, list[FabricRecord]]:
    """A list of per-GPU objects (one host, key None) or an object of host name -> list."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        return {None: _salvage_json(text, source, e)}
    nested = _nested_gpus(data)
    if nested is not None:
        data = nested
    if isinstance(data, dict) and set(data) == {"hosts"} and isinstance(data["hosts"], dict):
        data = data["hosts"]
    if isinstance(data, dict) and set(data) == {"gpus"} and isinstance(data["gpus"], list):
        data = data["gpus"]
    if isinstance(data, list):
        return {None: [_json_gpu(g, f"{source} [{i}]") for i, g in enumerate(data)]}
    if isinstance(data, dict) and all(isinstance(v, list) for v in data.values()):
        return {h: [_json_gpu(g, f"{source} {h}[{i}]") for i, g in enumerate(v)]
                for h, v in data.items()}
    raise FabricInfoError(f"{source}: expected a list of per-GPU fabric objects or an object "
                          f"of host name -> list of them")


def _has_fabric(obj: Any) -> bool:
    keys = {_JSON_KEYS.get(k.lower()) for k in obj} if isinstance(obj, dict) else set()
    return "state" in keys and len(keys & set(FIELDS)) >= 2


def _nested_gpus(data: Any) -> list | None:
    """Per-GPU fabric objects a tool's document holds somewhere other than at the top (a
    `fabric_states` list; a string field carrying JSON, as log lines do), or None."""
    if isinstance(data, list) or (isinstance(data, dict) and (
            set(data) <= {"gpus", "hosts"} or all(isinstance(v, list) for v in data.values()))):
        return None           # the shapes parse_fabric_json reads itself (host name -> list too)
    todo, seen = [data], 0
    while todo and seen < 10000:
        x = todo.pop(0)
        seen += 1
        if isinstance(x, list) and x and all(_has_fabric(g) for g in x):
            return x
        if isinstance(x, dict):
            todo.extend(x.values())
        elif isinstance(x, list):
            todo.extend(x)
        elif isinstance(x, str) and x.lstrip().startswith(("{", "[")):
            try:
                todo.append(json.loads(x))
            except json.JSONDecodeError:
                pass
    return None


def _salvage_json(text: str, source: str, err: json.JSONDecodeError) -> list[FabricRecord]:
    """JSON cut off mid-way (or a log line quoting it with escaped quotes): every complete
    per-GPU object before the cut is read; the file is refused only when none is."""
    body = text.replace('\\"', '"') if '\\"' in text else text
    dec = json.JSONDecoder()
    out: list[FabricRecord] = []
    bad: list[str] = []
    pos, end = 0, 0
    while True:
        pos = body.find("{", pos)
        if pos < 0:
            break
        try:
            obj, stop = dec.raw_decode(body, pos)
        except json.JSONDecodeError:
            pos += 1
            continue
        if _has_fabric(obj):
            line = body.count("\n", 0, pos) + 1
            try:
                out.append(_json_gpu(obj, f"{source} line {line}"))
            except FabricInfoError as e:
                bad.append(str(e))
            pos, end = stop, stop
        else:
            pos += 1
    if not out:
        _refuse_if_none(out, bad, source)
        raise FabricInfoError(f"{source} line {err.lineno} column {err.colno}: malformed JSON "
                              f"({err.msg}) and no complete per-GPU fabric object before it; "
                              f"expected a list of per-GPU fabric objects or an object of host "
                              f"name -> list")
    cut = (f"{source} line {body.count(chr(10), 0, end) + 1}: the JSON is cut off or malformed "
           f"after its GPU object {len(out) + len(bad)} ({err.msg}, line {err.lineno} column "
           f"{err.colno}); read the {len(out)} complete one(s) before it")
    return _with_warnings(out, bad, cut)


_XML_KEYS = {"state": "state", "status": "status", "cliqueid": "clique_id",
             "clique_id": "clique_id", "clusteruuid": "cluster_uuid", "cluster_uuid": "cluster_uuid"}


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1].lower()


_XML_GPU = re.compile(r"<gpu\b[^>]*>.*?</gpu>", re.DOTALL)


def parse_fabric_xml(text: str, source: str = "<nvidia-smi -q -x>") -> list[FabricRecord]:
    """The <fabric> element of each <gpu> of `nvidia-smi -q -x` output, in file order (the
    tool lists GPUs by PCI bus id = index order). A GPU without <fabric> (a driver that
    predates it, or a capture cut short) is skipped with a note on the first record."""
    if re.search(r"<!(DOCTYPE|ENTITY)", text, re.IGNORECASE):
        raise FabricInfoError(f"{source}: XML with a DOCTYPE or ENTITY declaration is refused "
                              f"(nvidia-smi does not write one); remove it")
    cut = ""
    try:
        gpus = [el for el in ET.fromstring(text).iter() if _local(el.tag) == "gpu"]
    except ET.ParseError as e:
        line, col = e.position
        # Cut off mid-way (or broken after some GPUs): the <gpu> elements complete before it.
        gpus = []
        for m in _XML_GPU.finditer(text):
            try:
                gpus.append(ET.fromstring(m.group(0)))
            except ET.ParseError:
                continue
        if not gpus:
            raise FabricInfoError(f"{source} line {line} column {col + 1}: malformed XML ({e}) "
                                  f"and no complete <gpu> element before it; expected "
                                  f"`nvidia-smi -q -x` output") from None
        cut = (f"{source} line {line} column {col + 1}: the XML is cut off or malformed ({e}); "
               f"read the {len(gpus)} complete <gpu> element(s) before it")
    out: list[FabricRecord] = []
    skipped: list[str] = []
    bad: list[str] = []
    for n, gpu in enumerate(gpus):
        label = f"{source} gpu #{n} ({gpu.get('id', '?')})"
        fab = next((el for el in gpu if _local(el.tag) == "fabric"), None)
        if fab is None:
            skipped.append(label)
            continue
        fields = {}
        for el in fab:
            key = _XML_KEYS.get(_local(el.tag))
            if key is not None and key not in fields:
                fields[key] = (el.text or "").strip()
        _keep(out, bad, fields, label)
    _refuse_if_none(out, bad, source)
    if not out:
        raise FabricInfoError(f"{source}: no <gpu> with a <fabric> element; expected "
                              f"`nvidia-smi -q -x` output of a driver that reports fabric info")
    if skipped:
        note = f"{len(skipped)} <gpu> element(s) without <fabric> skipped (first {skipped[0]})"
        first = out[0]
        out[0] = FabricRecord(first.info, first.status_text, first.where, first.missing,
                              first.notes + (note,))
    return _with_warnings(out, bad, cut)


# JSON keys of fabric info in a log or a fragment that does not start as JSON ("state": or,
# quoted inside a string, \"state\":).
_JSONISH = re.compile(r'\\?"(state|cliqueId|clique_id|clusterUuid|cluster_uuid)\\?"\s*:')


def load_fabric_file(path: str | Path) -> dict[str | None, list[FabricRecord]]:
    """One file: JSON or XML (by content) or `nvidia-smi -q` text. Host key None = not named."""
    p = Path(path)
    try:
        # read_input: a FIFO or /dev/zero is refused instead of read for good.
        text = read_input(p).decode("utf-8-sig", errors="replace")
    except FileNotFoundError:
        raise FabricInfoError(f"{p}: no such file; give `nvidia-smi -q` (or -q -x) output or a "
                              f"JSON fabric-info file") from None
    except IsADirectoryError:
        raise FabricInfoError(f"{p}: is a directory; give a file") from None
    except OSError as e:
        raise FabricInfoError(f"{p}: cannot read: {e.strerror}") from None
    head = text.lstrip()
    if head.startswith(("{", "[")) or _JSONISH.search(text) and "Fabric" not in text:
        return parse_fabric_json(text, str(p))
    if head.startswith("<"):
        return {None: parse_fabric_xml(text, str(p))}
    return {None: parse_fabric_text(text, str(p))}
