"""Merge NVML GPU fabric info into a topology: per GPU the cluster UUID, clique id, state and
status that `nvmlDeviceGetGpuFabricInfo` returns and `nvidia-smi -q` prints
in each GPU's "Fabric" section:

    Fabric
        State                             : Completed
        Status                            : Success
        CliqueId                          : 32766
        ClusterUUID                       : 8b7e3c1a-5d2f-4e6b-9a0c-1f2e3d4c5b6a

The same as JSON: `[{"state": "Completed", "status": "Success", "clique_id": 1,
"cluster_uuid": "..."}, ...]` for one host, or `{"<host>": [...], ...}` for several.

`merge_fabric` writes the values onto the GPUs and re-derives the NVLink domains the way the
libraries read them: GPUs sharing one non-zero cluster UUID are one domain,
across hosts; a zero UUID is "no MNNVL" even with state Completed (row F2), so such a host
keeps at most its own NVSwitch domain. Everything surprising is returned as a warning: the
zero-UUID trap, differing cliques (row F3), states other than Completed (row F1), a failed
status (row F4), a multi-node domain on hosts without IMEX (row V3).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from commsim.topology.shape import host_shape
from commsim.topology.importers.nvml_fabric_capture import (  # re-exported: this module is the importer's public face
    FabricInfoError, FabricRecord, load_fabric_file, parse_fabric_json, parse_fabric_text,
    parse_fabric_xml,
)
from commsim.topology.model import (
    Cluster, FabricInfo, FabricState, GpuRef, Host, NVML_ERROR_UNKNOWN, NVML_SUCCESS,
    NvlinkDomain, TopologyError, ZERO_UUID,
)

__all__ = ["FabricRecord", "FabricInfoError", "load_fabric_file", "merge_fabric",
           "parse_fabric_json", "parse_fabric_text", "parse_fabric_xml"]

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
        if len(recs) > n or not recs:
            where = recs[0].where.rsplit(" line", 1)[0] if recs else "fabric info"
            raise FabricInfoError(f"{where}: {len(recs)} GPU fabric section(s) for host {name}, "
                                  f"which has {n} GPUs; give one per GPU, in index order")
    return out


def _over(old: FabricInfo, rec: FabricRecord) -> FabricInfo:
    """The captured fields over the topology's; the ones the capture lacked stay (row T6)."""
    if not rec.missing:
        return rec.info
    return dataclasses.replace(rec.info, **{f: getattr(old, f) for f in rec.missing})


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
        switch = host_shape(h)[0]
        if switch and len(refs) == len(h.gpus):
            # A zero UUID on an NVSwitch board: its own single-node domain (multicast within
            # the host), as the HGX presets are. An NV# mesh is no switch (row T2).
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
        if len(recs) < len(h.gpus):
            warnings.append(f"host {h.name}: fabric info for {len(recs)} of {len(h.gpus)} GPUs "
                            f"(a partial capture); GPU{len(recs)}.. keep the topology's")
        for r in recs:
            warnings.extend(r.notes)
        gpus = tuple(dataclasses.replace(g, fabric=_over(g.fabric, recs[g.index]))
                     if g.index < len(recs) else g for g in h.gpus)
        hosts.append(dataclasses.replace(h, gpus=gpus))
    merged = dataclasses.replace(cluster, hosts=tuple(hosts), domains=())
    recs = [(GpuRef(h.name, g.index), dataclasses.replace(r, info=g.fabric))
            for h in merged.hosts if h.name in assigned
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
