"""Reading NVML GPU fabric captures: the Fabric sections of `nvidia-smi -q` text, the
<fabric> elements of `nvidia-smi -q -x` XML, and JSON with NVML's field names (`state`,
`status`, `cliqueId`, `clusterUuid`, as `nvmlGpuFabricInfo_t` names them).

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
            out.append(_record(fields, f"{source} line {i + 1}"))
            i = j
            continue
        i += 1
    if not out:
        hint = (" (the GPU sections have none: the driver predates fabric info, or the output "
                "was cut)") if seen_gpu_header else ""
        raise FabricInfoError(f"{source}: no 'Fabric' section found{hint}; expected "
                              f"`nvidia-smi -q` output whose GPU sections hold 'Fabric' with "
                              f"State, Status, CliqueId and ClusterUUID lines")
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
        raise FabricInfoError(f"{source} line {e.lineno} column {e.colno}: malformed JSON "
                              f"({e.msg}); expected a list of per-GPU fabric objects or an "
                              f"object of host name -> list") from None
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


_XML_KEYS = {"state": "state", "status": "status", "cliqueid": "clique_id",
             "clique_id": "clique_id", "clusteruuid": "cluster_uuid", "cluster_uuid": "cluster_uuid"}


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1].lower()


def parse_fabric_xml(text: str, source: str = "<nvidia-smi -q -x>") -> list[FabricRecord]:
    """The <fabric> element of each <gpu> of `nvidia-smi -q -x` output, in file order (the
    tool lists GPUs by PCI bus id = index order). A GPU without <fabric> (a driver that
    predates it, or a capture cut short) is skipped with a note on the first record."""
    if re.search(r"<!(DOCTYPE|ENTITY)", text, re.IGNORECASE):
        raise FabricInfoError(f"{source}: XML with a DOCTYPE or ENTITY declaration is refused "
                              f"(nvidia-smi does not write one); remove it")
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        line, col = e.position
        raise FabricInfoError(f"{source} line {line} column {col + 1}: malformed XML ({e}); "
                              f"expected `nvidia-smi -q -x` output") from None
    gpus = [el for el in root.iter() if _local(el.tag) == "gpu"]
    out: list[FabricRecord] = []
    skipped: list[str] = []
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
        out.append(_record(fields, label))
    if not out:
        raise FabricInfoError(f"{source}: no <gpu> with a <fabric> element; expected "
                              f"`nvidia-smi -q -x` output of a driver that reports fabric info")
    if skipped:
        note = f"{len(skipped)} <gpu> element(s) without <fabric> skipped (first {skipped[0]})"
        first = out[0]
        out[0] = FabricRecord(first.info, first.status_text, first.where, first.missing,
                              first.notes + (note,))
    return out


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
    if head.startswith(("{", "[")):
        return parse_fabric_json(text, str(p))
    if head.startswith("<"):
        return {None: parse_fabric_xml(text, str(p))}
    return {None: parse_fabric_text(text, str(p))}
