"""Merge NVML GPU fabric info into a topology: per GPU the cluster UUID, clique id, state and
status that `nvmlDeviceGetGpuFabricInfo` returns (reference §4.1) and `nvidia-smi -q` prints
in each GPU's "Fabric" section:

    Fabric
        State                             : Completed
        Status                            : Success
        CliqueId                          : 32766
        ClusterUUID                       : 8b7e3c1a-5d2f-4e6b-9a0c-1f2e3d4c5b6a

The same as JSON: `[{"state": "Completed", "status": "Success", "clique_id": 1,
"cluster_uuid": "..."}, ...]` for one host, or `{"<host>": [...], ...}` for several.

`merge_fabric` writes the values onto the GPUs and re-derives the NVLink domains the way the
libraries read them (reference §4.2): GPUs sharing one non-zero cluster UUID are one domain,
across hosts; a zero UUID is "no MNNVL" even with state Completed (row F2), so such a host
keeps at most its own NVSwitch domain. Everything surprising is returned as a warning: the
zero-UUID trap, differing cliques (row F3), states other than Completed (row F1), a failed
status (row F4), a multi-node domain on hosts without IMEX (row V3).
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid as uuidlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..model import (
    Cluster, FabricInfo, FabricState, GpuRef, Host, NVML_ERROR_UNKNOWN, NVML_SUCCESS,
    NvlinkDomain, TopologyError, ZERO_UUID,
)

__all__ = ["FabricRecord", "FabricInfoError", "load_fabric_file", "merge_fabric",
           "parse_fabric_json", "parse_fabric_text"]

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
    if "state" not in fields:
        raise FabricInfoError(f"{where}: fabric info without State; accepted: {STATE_WORDS}")
    status, text = _status(fields.get("status", "Success"), where)
    info = FabricInfo(cluster_uuid=_uuid(fields.get("cluster_uuid"), where),
                      clique_id=_clique(fields.get("clique_id"), where),
                      state=_state(fields["state"], where), status=status)
    return FabricRecord(info, text, where)


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


def _json_gpu(obj: Any, where: str) -> FabricRecord:
    if not isinstance(obj, dict):
        raise FabricInfoError(f"{where}: expected an object with state, status, clique_id, "
                              f"cluster_uuid; got {obj!r}")
    fields = {}
    for k, v in obj.items():
        norm = _JSON_KEYS.get(k.lower())
        if norm is None:
            raise FabricInfoError(f"{where}: unknown key {k!r}; accepted: state, status, "
                                  f"clique_id, cluster_uuid")
        fields[norm] = v
    return _record(fields, where)


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
    if isinstance(data, list):
        return {None: [_json_gpu(g, f"{source} [{i}]") for i, g in enumerate(data)]}
    if isinstance(data, dict) and all(isinstance(v, list) for v in data.values()):
        return {h: [_json_gpu(g, f"{source} {h}[{i}]") for i, g in enumerate(v)]
                for h, v in data.items()}
    raise FabricInfoError(f"{source}: expected a list of per-GPU fabric objects or an object "
                          f"of host name -> list of them")


def load_fabric_file(path: str | Path) -> dict[str | None, list[FabricRecord]]:
    """One file: JSON (by content) or `nvidia-smi -q` text. Host key None = not named."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8-sig", errors="replace")
    except FileNotFoundError:
        raise FabricInfoError(f"{p}: no such file; give `nvidia-smi -q` output or a JSON "
                              f"fabric-info file") from None
    except IsADirectoryError:
        raise FabricInfoError(f"{p}: is a directory; give a file") from None
    if text.lstrip().startswith(("{", "[")):
        return parse_fabric_json(text, str(p))
    return {None: parse_fabric_text(text, str(p))}


# -- merging ----------------------------------------------------------------------------


def _assign(cluster: Cluster, infos: Sequence[tuple[str | None, list[FabricRecord]]]
            ) -> dict[str, list[FabricRecord]]:
    """Host name -> records. Named entries go to that host; unnamed ones fill the remaining
    hosts in cluster order."""
    names = [h.name for h in cluster.hosts]
    out: dict[str, list[FabricRecord]] = {}
    for host, recs in infos:
        if host is None:
            continue
        if host not in names:
            raise FabricInfoError(f"fabric info names host {host!r}, which the topology does not "
                                  f"have; hosts: {', '.join(names)}")
        if host in out:
            raise FabricInfoError(f"fabric info for host {host!r} given twice")
        out[host] = recs
    free = [n for n in names if n not in out]
    unnamed = [recs for host, recs in infos if host is None]
    if len(unnamed) > len(free):
        raise FabricInfoError(f"{len(unnamed)} unnamed fabric-info file(s) but only {len(free)} "
                              f"host(s) left to give them to ({', '.join(free) or 'none'}); name "
                              f"hosts with HOST=FILE")
    for name, recs in zip(free, unnamed):
        out[name] = recs
    for name, recs in out.items():
        n = len(cluster.host(name).gpus)
        if len(recs) != n:
            where = recs[0].where.rsplit(" line", 1)[0] if recs else "fabric info"
            raise FabricInfoError(f"{where}: {len(recs)} GPU fabric section(s) for host {name}, "
                                  f"which has {n} GPUs; give one per GPU, in index order")
    return out


def _describe(recs: Sequence[tuple[GpuRef, FabricRecord]]) -> str:
    hosts = sorted({r.host for r, _ in recs})
    return f"{len(recs)} GPU(s) on {', '.join(hosts[:4])}{' ...' if len(hosts) > 4 else ''}"


def _domains(cluster: Cluster) -> tuple[NvlinkDomain, ...]:
    by_uuid: dict[bytes, list[GpuRef]] = {}
    zero: list[GpuRef] = []
    for h in cluster.hosts:
        for g in h.gpus:
            ref = GpuRef(h.name, g.index)
            (zero if g.fabric.cluster_uuid == ZERO_UUID else by_uuid.setdefault(
                g.fabric.cluster_uuid, [])).append(ref)
    domains = [NvlinkDomain(f"mnnvl-{u.hex()[:8]}", tuple(m), cluster_uuid=u)
               for u, m in by_uuid.items()]
    zero_hosts = {r.host for r in zero}
    for h in cluster.hosts:
        if h.name not in zero_hosts:
            continue
        refs = [r for r in zero if r.host == h.name]
        switch = all(l is None or l.is_nvlink for row in h.links for l in row)
        if switch and len(refs) == len(h.gpus) and len(h.gpus) > 1:
            # A zero UUID with the whole host on NVLink: an NVSwitch board that is its own
            # single-node domain (multicast within the host), as the HGX presets are.
            domains.append(NvlinkDomain(f"{h.name}-nvswitch", tuple(refs)))
    return tuple(domains)


def merge_fabric(cluster: Cluster, infos: Sequence[tuple[str | None, list[FabricRecord]]]
                 ) -> tuple[Cluster, list[str]]:
    """`cluster` with the given fabric info on its GPUs and NVLink domains re-derived from it.

    `infos` = (host name or None, one record per GPU in index order), e.g. from
    `load_fabric_file`. Hosts without info keep theirs. Returns the new cluster and warnings."""
    assigned = _assign(cluster, infos)
    warnings: list[str] = []
    hosts: list[Host] = []
    for h in cluster.hosts:
        recs = assigned.get(h.name)
        if recs is None:
            if assigned:
                warnings.append(f"host {h.name}: no fabric info given; kept the topology's")
            hosts.append(h)
            continue
        gpus = tuple(dataclasses.replace(g, fabric=r.info) for g, r in zip(h.gpus, recs))
        hosts.append(dataclasses.replace(h, gpus=gpus))
    merged = dataclasses.replace(cluster, hosts=tuple(hosts), domains=())
    recs = [(GpuRef(h.name, g.index), r) for h in merged.hosts if h.name in assigned
            for g, r in zip(h.gpus, assigned[h.name])]
    _warn_states(recs, warnings)
    domains = _domains(merged)
    merged = dataclasses.replace(merged, domains=domains,
                                 source=(cluster.source + "; " if cluster.source else "") +
                                 f"fabric info merged for {len(assigned)} host(s)")
    _warn_domains(cluster, merged, warnings)
    return merged, warnings


def _warn_states(recs: list[tuple[GpuRef, FabricRecord]], warnings: list[str]) -> None:
    completed_zero = [(r, x) for r, x in recs if x.info.state == FabricState.COMPLETED
                      and x.info.cluster_uuid == ZERO_UUID]
    if completed_zero:
        warnings.append(
            f"{_describe(completed_zero)} report state Completed with an all-zero cluster UUID: "
            f"the fabric manager runs but this is no multi-node NVLink domain (NCCL and NVSHMEM "
            f"read a zero UUID as 'no MNNVL', row F2); at most each host's own NVSwitch board "
            f"is a domain")
    for state in (FabricState.IN_PROGRESS, FabricState.NOT_STARTED):
        hit = [(r, x) for r, x in recs if x.info.state == state]
        if hit:
            warnings.append(
                f"{_describe(hit)} report state {state.name.replace('_', ' ').title()}: fabric "
                f"(MNNVL) is declined for any group holding them until the state is Completed "
                f"(row F1); first at {hit[0][1].where}")
    bad = [(r, x) for r, x in recs if x.info.state == FabricState.COMPLETED
           and x.info.status != NVML_SUCCESS]
    if bad:
        warnings.append(f"{_describe(bad)} report state Completed with status "
                        f"{bad[0][1].status_text!r}: not MNNVL for TensorRT-LLM and commsim "
                        f"(row F4); first at {bad[0][1].where}")


def _warn_domains(before: Cluster, after: Cluster, warnings: list[str]) -> None:
    for d in after.domains:
        if not d.multi_node:
            continue
        cliques = sorted({after.gpu(m).fabric.clique_id for m in d.members})
        if len(cliques) > 1:
            warnings.append(
                f"domain {d.name}: one cluster UUID but cliques {cliques}: NCCL counts them as "
                f"one NVLink domain but uses P2P across cliques only with "
                f"NCCL_MNNVL_CROSS_CLIQUE=1 (row F3)")
        no_imex = [h for h in d.hosts if not after.host(h).imex_channels]
        if no_imex:
            warnings.append(f"domain {d.name}: host(s) {', '.join(no_imex)} have no IMEX channel; "
                            f"FABRIC handles fail NOT_PERMITTED there (row V3)")
        no_attr = [str(m) for m in d.members if not after.gpu(m).fabric_handle]
        if no_attr:
            warnings.append(f"domain {d.name}: {len(no_attr)} GPU(s) lack the fabric-handle "
                            f"attribute (first {no_attr[0]}); FABRIC memory cannot be created "
                            f"there (row V4)")
    for h in after.hosts:
        uuids = {g.fabric.cluster_uuid for g in h.gpus}
        if len(uuids) > 1:
            warnings.append(f"host {h.name}: its GPUs report {len(uuids)} different cluster "
                            f"UUIDs; they are split over NVLink domains as reported")
    was = {m for d in before.domains if d.multi_node for m in d.members}
    now = {m for d in after.domains if d.multi_node for m in d.members}
    if was - now:
        warnings.append(f"{len(was - now)} GPU(s) the topology put in a multi-node NVLink domain "
                        f"are in none by their fabric info (zero or differing cluster UUIDs)")
