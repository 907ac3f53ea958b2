"""Import a host shape from `nvidia-smi topo -m` output, as users paste it into bug reports.

`parse_topo_matrix` (nvidia_smi_parse.py) reads the text; `build_cluster` repeats that host and adds
what the matrix cannot say (GPU attributes, NVLink domain, P2P), returning the assumptions it
made as warnings so the user can override them. `cluster_from_matrix_table` is the same import
for the explicit `[topology]` table of a scenario file (docs/scenario-format.md).

Rejections name the source and what is accepted: a guessed topology would make a regression
scenario test the wrong machine.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, Mapping

from commsim.topology import gpu_models
from commsim.topology.gpu_models import GpuSpec
from commsim.topology.limits import check_size
from commsim.topology.model import (
    Cluster, FabricInfo, FabricState, Gpu, GpuRef, Host, Link, NvlinkDomain, TopologyError,
    ZERO_UUID, matrix_from,
)
from commsim.topology.presets import _cluster_uuid, _uuid  # same derivations as the presets, so shapes compare
from commsim.topology.render import topo_matrix
from commsim.topology.shape import nvswitch_shape
from commsim.topology.importers.nvidia_smi_parse import (  # re-exported: this module is the importer's public face
    P2P_CELLS, ParsedHost, is_gpu_row, looks_like_header, parse_p2p_matrix, parse_topo_matrix,
)

__all__ = [
    "DOMAINS", "P2P_CELLS", "ParsedHost", "TABLE_KEYS", "build_cluster", "switch_shape",
    "cluster_from_matrix_table", "matrix_table", "parse_p2p_matrix", "parse_topo_matrix",
]

DOMAINS = ("none", "node", "rack")

# -- building a cluster -----------------------------------------------------------------


def _first_non_nvlink(parsed: ParsedHost) -> str:
    for i, j in parsed.pairs():
        if not parsed.link(i, j).is_nvlink:
            return f"GPU{i}-GPU{j} is {parsed.cells[i][j]}"
    return ""


def switch_shape(parsed: ParsedHost, spec: GpuSpec | None) -> tuple[bool, str]:
    """Whether the pasted matrix is an NVSwitch board, and why (rows T1-T3, shape.py)."""
    return nvswitch_shape(parsed.gpu_count, [(i, j, parsed.link(i, j)) for i, j in parsed.pairs()],
                          spec)


def _resolve_domain(parsed: ParsedHost, hosts: int, domain: str | None,
                    spec: GpuSpec | None, warnings: list[str]) -> str:
    n = parsed.gpu_count
    nvswitch, why = switch_shape(parsed, spec)
    tray = nvswitch and n == 4 and parsed.nvlink_counts() == {18}
    if domain is not None:
        if domain not in DOMAINS:
            raise TopologyError(f"unknown NVLink domain {domain!r}; accepted: {', '.join(DOMAINS)}")
        if domain != "none" and not parsed.all_nvlink:
            raise TopologyError(
                f"domain {domain!r} needs NVLink between every GPU pair (an NVSwitch fabric), but "
                f"{_first_non_nvlink(parsed)} in {parsed.source}; use domain 'none'")
        if domain != "none" and not nvswitch:
            warnings.append(f"domain {domain!r} kept as given, but the matrix reads as no NVSwitch: "
                            f"{why}")
        return domain
    if hosts > 1 and tray:
        warnings.append(
            f"NVLink domain inferred as 'rack': {hosts} hosts of 4 GPUs with NV18 between every "
            f"pair is the GB200 NVL72 tray shape, so all {hosts * n} GPUs are one multi-node "
            f"NVLink domain (MNNVL, IMEX channel 0 on every host); pass --domain node (one "
            f"domain per host) or --domain none to override")
        return "rack"
    if nvswitch:
        warnings.append(
            f"NVLink domain inferred as 'node': {why} (single-node domain, zero cluster UUID); "
            f"pass --domain rack if the hosts share one multi-node NVLink fabric, or --domain none")
        if spec is not None and spec.key in ("GB200", "GB300", "GH200"):
            warnings.append(f"{spec.model} hosts are normally part of a rack NVLink domain; "
                            f"pass --domain rack to model that")
        return "node"
    if parsed.all_nvlink and n >= 2:
        warnings.append(f"NVLink domain inferred as 'none': {why}; pass --domain node to "
                        f"override")
    return "none"


def _infer_spec(parsed: ParsedHost, domain: str, warnings: list[str]) -> GpuSpec:
    counts = parsed.nvlink_counts()
    # The shape decides, not the domain: `--domain none` on an NVSwitch board is still that board.
    board = switch_shape(parsed, None)[0]
    if domain == "rack" and parsed.gpu_count == 4 and counts == {18}:
        spec, why = gpu_models.GB200, "4 GPUs per host with NV18 all pairs in a rack domain"
    elif board and counts == {12}:
        spec, why = gpu_models.NV12_NVSWITCH_DEFAULT, "NV12 between every pair (HGX A100 board)"
    elif board:
        spec, why = gpu_models.NVSWITCH_DEFAULT, "NVLink between every pair (NVSwitch-class)"
    else:
        spec = gpu_models.UNKNOWN
        warnings.append(
            f"GPU model not given and not inferable from this matrix: assumed compute "
            f"capability {spec.compute_capability[0]}.{spec.compute_capability[1]}, "
            f"{spec.memory_gib} GiB, no multicast, no fabric handles; pass --gpu-model NAME "
            f"(known: {gpu_models.KNOWN_NAMES})")
        return spec
    warnings.append(f"GPU model not given: assumed {spec.name_for(domain != 'none')} ({why}); pass "
                    f"--gpu-model NAME to change it (known: {gpu_models.KNOWN_NAMES})")
    return spec


def _links(parsed: ParsedHost, spec: GpuSpec, model: str,
           warnings: list[str]) -> tuple[tuple[Link | None, ...], ...]:
    pcie = [(i, j) for i, j in parsed.pairs() if not parsed.link(i, j).is_nvlink]
    if parsed.p2p is not None:
        off = [f"GPU{i}-GPU{j}" for i, j in parsed.pairs()
               if parsed.link(i, j).is_nvlink and not parsed.p2p[i][j]]
        if off:
            warnings.append(f"P2P matrix {parsed.p2p_source} says NVLink pair(s) {', '.join(off)} "
                            f"have no P2P; kept as given")
        table, codes = parsed.p2p, parsed.p2p_codes

        def given(i: int, j: int) -> Link:
            lk = Link.parse(parsed.cells[i][j] or "", p2p=bool(table[i][j]))
            why = codes[i][j] if codes is not None else None
            # NS ("not supported") is what a bare refusal reads as; the others name a cause.
            keep = why and why != "NS" and not lk.p2p
            return dataclasses.replace(lk, p2p_reason=why) if keep else lk
        return matrix_from(parsed.gpu_count, given)
    pcie_p2p = spec.pcie_p2p is not False
    if pcie and pcie_p2p:
        warnings.append("P2P for PCIe pairs was assumed allowed (no p2p matrix given); pass "
                        "--p2p FILE with `nvidia-smi topo -p2p r` output to set it per pair")
    elif pcie:
        warnings.append(f"P2P for PCIe pairs set to not supported: {model} is a GeForce card "
                        f"(cuDeviceCanAccessPeer = 0); pass --p2p FILE to override")
    return matrix_from(parsed.gpu_count, lambda i, j: Link.parse(
        parsed.cells[i][j] or "", p2p=True if parsed.link(i, j).is_nvlink else pcie_p2p))


def build_cluster(parsed: ParsedHost, hosts: int, domain: str | None = None,
                  gpu_model: str | None = None, *, host_prefix: str = "node",
                  name: str | None = None) -> tuple[Cluster, list[str]]:
    """Repeat the parsed host `hosts` times as `<host_prefix>-0..N-1`.

    Returns the cluster and the assumptions made (warnings). `domain` is none | node | rack,
    or None to infer it; `gpu_model` a name from gpu_models.KNOWN, or None to infer it.
    """
    if isinstance(hosts, bool) or not isinstance(hosts, int) or hosts < 1:
        raise TopologyError(f"host count must be an integer >= 1 (how many hosts of this shape), "
                            f"got {hosts!r}")
    check_size(hosts, parsed.gpu_count, parsed.source)
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", host_prefix or ""):
        raise TopologyError(f"host prefix {host_prefix!r} is not a hostname start; use letters, "
                            f"digits, '.', '_', '-'")
    warnings: list[str] = list(parsed.notes)
    given = gpu_models.resolve(gpu_model) if gpu_model else None
    dom = _resolve_domain(parsed, hosts, domain, given[0] if given else None, warnings)
    nvswitch = dom != "none"
    if given:
        spec, model, mem = given
        model = model or spec.name_for(nvswitch)
    else:
        spec = _infer_spec(parsed, dom, warnings)
        model, mem = spec.name_for(nvswitch), spec.memory_gib * gpu_models.GiB
    links = _links(parsed, spec, model, warnings)
    uuid = _cluster_uuid(host_prefix) if dom == "rack" else ZERO_UUID
    if dom == "rack":
        # Rack-wide: one NVML cluster UUID and clique, IMEX channel 0 on every tray (presets).
        fab = FabricInfo(cluster_uuid=uuid, clique_id=1, state=FabricState.COMPLETED)
    elif dom == "node":
        fab = FabricInfo(state=FabricState.COMPLETED)  # NVSwitch board: zero UUID (row F2)
    else:
        fab = FabricInfo()                             # no fabric manager: NOT_SUPPORTED
    out_hosts, domains, members = [], [], []
    for h in range(hosts):
        hn = f"{host_prefix}-{h}"
        gpus = tuple(Gpu(index=i, uuid=_uuid(hn, i), model=model,
                         compute_capability=spec.compute_capability, memory_bytes=mem,
                         fabric_handle=spec.fabric and nvswitch,
                         multicast=spec.multicast and nvswitch,
                         gpu_direct_rdma=spec.gpu_direct_rdma, fabric=fab)
                     for i in range(parsed.gpu_count))
        out_hosts.append(Host(name=hn, gpus=gpus, links=links, arch=spec.arch,
                              imex_channels=(0,) if dom == "rack" else ()))
        refs = [GpuRef(hn, i) for i in range(parsed.gpu_count)]
        if dom == "node":
            domains.append(NvlinkDomain(f"{hn}-nvswitch", tuple(refs)))
        members += refs
    if dom == "rack":
        domains.append(NvlinkDomain(f"{host_prefix}-domain", tuple(members), cluster_uuid=uuid))
    src = (f"imported from {parsed.source} (nvidia-smi topo -m): {hosts} host(s) of "
           f"{parsed.gpu_count} GPUs, domain {dom}")
    cluster = Cluster(name=name or Path(parsed.source).stem or "imported", hosts=tuple(out_hosts),
                      domains=tuple(domains), source=src)
    return cluster, warnings


# -- the explicit `[topology]` table of a scenario file ---------------------------------

TABLE_KEYS = ("hosts", "host_prefix", "gpu_model", "domain", "matrix", "p2p_matrix")


def _table_text(value: object, source: str, key: str, p2p: bool) -> str:
    """A matrix given as `topo -m` text, or as an array of rows (strings or arrays of cells)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value:
        rows = []
        for i, r in enumerate(value):
            if isinstance(r, str):
                rows.append(r)
            elif isinstance(r, list) and all(isinstance(c, (str, bool)) for c in r):
                # P2P as booleans: the diagonal (a GPU with itself) is X whatever it says.
                rows.append("\t".join(("X" if i == j else "OK" if c else "NS")
                                      if isinstance(c, bool) else c for j, c in enumerate(r)))
            else:
                raise TopologyError(f"{source}: [topology] {key}: rows must be strings or arrays "
                                    f"of cells, got {r!r}")
        # Rows given as bare cells get GPU names and a header, so one parser reads both forms.
        if not looks_like_header(rows[0]):
            n = len(rows)
            body = [r if is_gpu_row(r) else f"GPU{i}\t{r}" for i, r in enumerate(rows)]
            rows = ["\t" + "\t".join(f"GPU{j}" for j in range(n))] + body
        return "\n".join(rows)
    kind = "OK/NS cells" if p2p else "topo -m cells"
    raise TopologyError(f"{source}: [topology] {key}: expected the matrix as a multi-line string "
                        f"(`nvidia-smi topo -m` text) or an array of rows of {kind}, got {value!r}")


def cluster_from_matrix_table(table: Mapping[str, Any], source: str,
                              warnings: list[str] | None = None) -> Cluster:
    """The Cluster of an explicit `[topology]` table: keys hosts (default 1), host_prefix
    (default "node"), gpu_model, domain (none | node | rack; inferred when absent), matrix
    (required) and p2p_matrix. Assumptions are appended to `warnings` when given."""
    where = f"{source}: [topology]"
    stray = [k for k in table if k not in TABLE_KEYS]
    if stray:
        raise TopologyError(f"{where} {stray[0]}: unknown key; an explicit matrix topology takes "
                            f"{', '.join(TABLE_KEYS)}")
    if "matrix" not in table:
        raise TopologyError(f"{where}: needs matrix = '''<nvidia-smi topo -m text>'''")
    hosts = table.get("hosts", 1)
    if isinstance(hosts, bool) or not isinstance(hosts, int) or hosts < 1:
        raise TopologyError(f"{where} hosts: expected an integer >= 1, got {hosts!r}")
    for key in ("host_prefix", "gpu_model", "domain"):
        if key in table and not isinstance(table[key], str):
            raise TopologyError(f"{where} {key}: expected a string, got {table[key]!r}")
    p2p_text = None
    if "p2p_matrix" in table:
        p2p_text = _table_text(table["p2p_matrix"], source, "p2p_matrix", True)
    parsed = parse_topo_matrix(_table_text(table["matrix"], source, "matrix", False),
                               f"{where} matrix", p2p_text, f"{where} p2p_matrix")
    try:
        cluster, notes = build_cluster(parsed, hosts, table.get("domain"), table.get("gpu_model"),
                                       host_prefix=table.get("host_prefix", "node"),
                                       name=Path(source).stem or "imported")
    except TopologyError as e:
        if str(e).startswith(source):
            raise
        raise TopologyError(f"{where}: {e}") from None
    if warnings is not None:
        warnings.extend(notes)
    return cluster


def matrix_table(cluster: Cluster, host_prefix: str) -> dict[str, Any]:
    """The `[topology]` table that rebuilds `cluster` (an imported one: identical hosts named
    `<host_prefix>-N`). Every assumption is written out explicitly, P2P included."""
    host = cluster.hosts[0]
    link_part, _, p2p_part = topo_matrix(host).partition("\n\nP2P (cuDeviceCanAccessPeer):\n")
    if any(d.cluster_uuid != ZERO_UUID for d in cluster.domains):
        domain = "rack"
    else:
        domain = "node" if cluster.domains else "none"
    table: dict[str, Any] = {"hosts": len(cluster.hosts), "host_prefix": host_prefix}
    model = host.gpus[0].model
    if model != gpu_models.UNKNOWN.model:
        table["gpu_model"] = model
    table.update(domain=domain, matrix=link_part + "\n", p2p_matrix=p2p_part + "\n")
    return table
