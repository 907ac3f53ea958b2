"""Import a host shape from `nvidia-smi topo -m` output, as users paste it into bug reports.

`parse_topo_matrix` reads the text (prose before the header, NIC rows and columns, affinity
columns and the legends are skipped); `build_cluster` repeats that host and adds what the
matrix cannot say (GPU attributes, NVLink domain, P2P), returning the assumptions it made as
warnings so the user can override them. `cluster_from_matrix_table` is the same import for the
explicit `[topology]` table of a scenario file (docs/scenario-format.md).

Rejections name the source, the line and what is accepted: a guessed topology would make a
regression scenario test the wrong machine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from . import gpu_models
from .gpu_models import GpuSpec
from .model import (
    Cluster, FabricInfo, FabricState, Gpu, GpuRef, Host, Link, NvlinkDomain, TopologyError,
    ZERO_UUID, matrix_from,
)
from .presets import _cluster_uuid, _uuid  # same derivations as the presets, so shapes compare
from .render import topo_matrix

DOMAINS = ("none", "node", "rack")
P2P_OK = "OK"
# `nvidia-smi topo -p2p <r|w|n|a|p>` legend: everything but OK means "no P2P" for our purpose.
P2P_CELLS = ("OK", "NS", "CNS", "GNS", "TNS", "U")
ACCEPTED_LINKS = "NV<count> (e.g. NV18), PIX, PXB, PHB, NODE, SYS, and X on the diagonal"

_GPU = re.compile(r"^GPU(\d+)$")
# Device columns after the GPUs: NIC0.. (current tools) or mlx5_0.. (older tools).
_DEVICE = re.compile(r"^(NIC\d+|[A-Za-z][A-Za-z0-9]*_\d+)$")
_AFFINITY_WORDS = {"CPU", "AFFINITY", "NUMA", "GPU", "ID"}
# Affinity cells ("0-71", "0,2-5", "0", "N/A") end the link cells of a row.
_AFFINITY_CELL = re.compile(r"^(N/A|\d[\d,\-]*)$")


@dataclass(frozen=True)
class ParsedHost:
    """One host's GPU-to-GPU part of `topo -m`, plus an optional P2P matrix."""

    source: str
    cells: tuple[tuple[str | None, ...], ...]          # link labels; None on the diagonal
    nic_count: int = 0                                 # NIC columns seen (ignored)
    p2p: tuple[tuple[bool | None, ...], ...] | None = None  # None: no P2P matrix given
    p2p_source: str | None = None

    @property
    def gpu_count(self) -> int:
        return len(self.cells)

    def link(self, i: int, j: int) -> Link:
        return Link.parse(self.cells[i][j] or "")

    def pairs(self) -> list[tuple[int, int]]:
        n = self.gpu_count
        return [(i, j) for i in range(n) for j in range(i + 1, n)]

    @property
    def all_nvlink(self) -> bool:
        return all(self.link(i, j).is_nvlink for i, j in self.pairs())

    def nvlink_counts(self) -> set[int]:
        return {self.link(i, j).nvlinks for i, j in self.pairs() if self.link(i, j).is_nvlink}


@dataclass
class _Block:
    header_line: int
    gpus: int
    devices: tuple[str, ...]
    rows: dict[int, tuple[int, list[str]]]  # GPU index -> (line number, cells)
    end: int                                # index of the first line after the block


def _err(source: str, line: int | None, msg: str) -> TopologyError:
    return TopologyError(f"{source}{f' line {line}' if line else ''}: {msg}")


def _header(tokens: list[str]) -> tuple[int, tuple[str, ...]] | None:
    """(GPU columns, device columns) if these tokens are a `topo -m` header, else None."""
    n = 0
    while n < len(tokens) and tokens[n].upper() == f"GPU{n}":
        n += 1
    if n == 0:
        return None
    k = n
    while k < len(tokens) and _DEVICE.match(tokens[k]):
        k += 1
    # Anything but the affinity column names means this is prose mentioning GPU0.
    if any(t.upper() not in _AFFINITY_WORDS for t in tokens[k:]):
        return None
    return n, tuple(tokens[n:k])


def _find_block(lines: list[str], start: int, source: str) -> _Block | None:
    for idx in range(start, len(lines)):
        head = _header(lines[idx].split())
        if head is not None:
            return _read_rows(lines, idx, head, source)
    return None


def _read_rows(lines: list[str], idx: int, head: tuple[int, tuple[str, ...]],
               source: str) -> _Block:
    n, devices = head
    dev_names = {d.upper() for d in devices}
    width = n + len(devices)
    rows: dict[int, tuple[int, list[str]]] = {}
    k = idx + 1
    while k < len(lines):
        tokens = lines[k].split()
        if not tokens:          # pastes often double-space lines
            k += 1
            continue
        name = tokens[0].upper()
        m = _GPU.match(name)
        if m is None:
            if name in dev_names or re.match(r"^NIC\d+$", name):
                k += 1          # NIC rows: the GPU-NIC paths do not change GPU-GPU semantics
                continue
            break               # the legend, a P2P section, or prose: the block is over
        i, ln = int(m.group(1)), k + 1
        if i >= n:
            raise _err(source, ln, f"GPU{i} row, but the header (line {idx + 1}) has {n} GPU "
                                   f"columns GPU0..GPU{n - 1}; add the missing columns")
        if i in rows:
            raise _err(source, ln, f"second GPU{i} row (the first is line {rows[i][0]}); "
                                   f"each GPU has one row")
        cells = []
        for t in tokens[1:]:
            if _AFFINITY_CELL.match(t):
                break
            cells.append(t.upper())
        if len(cells) != width:
            cols = f"{n} GPU columns" + (f" and {len(devices)} NIC columns" if devices else "")
            what = "GPU cells" if not devices else "cells"
            raise _err(source, ln, f"GPU{i} row has {len(cells)} {what}, header has {cols} "
                                   f"(line {idx + 1}); every row needs one cell per column")
        rows[i] = (ln, cells[:n])
        k += 1
    missing = [i for i in range(n) if i not in rows]
    if missing:
        raise _err(source, idx + 1, f"header has {n} GPU columns but no row for "
                                    f"{', '.join(f'GPU{i}' for i in missing)}; paste the whole matrix")
    return _Block(idx + 1, n, devices, rows, k)


def _no_header(source: str, what: str) -> TopologyError:
    return _err(source, None,
                f"no GPU header found; expected {what}: a line of column names starting with "
                f"GPU0 (e.g. '\\tGPU0\\tGPU1\\tNIC0\\tCPU Affinity'), followed by one row per GPU")


def _link_cells(block: _Block, source: str) -> tuple[tuple[str | None, ...], ...]:
    n = block.gpus
    out: list[list[str | None]] = [[None] * n for _ in range(n)]
    for i in range(n):
        ln, cells = block.rows[i]
        for j, c in enumerate(cells):
            where = f"GPU{i} row, column GPU{j}"
            if i == j:
                if c != "X":
                    raise _err(source, ln, f"{where}: the diagonal cell must be X (self), got {c!r}")
                continue
            if c == "X":
                raise _err(source, ln, f"{where}: X (self) is only allowed on the diagonal; "
                                       f"accepted: {ACCEPTED_LINKS}")
            try:
                out[i][j] = Link.parse(c).label
            except TopologyError:
                hint = ("; this looks like `nvidia-smi topo -p2p r` output, give it as the P2P "
                        "matrix (--p2p FILE)") if c in P2P_CELLS else ""
                raise _err(source, ln, f"{where}: unknown cell {c!r}; accepted: "
                                       f"{ACCEPTED_LINKS}{hint}") from None
    _check_symmetric(block, out, source, "link")
    return tuple(tuple(r) for r in out)


def _check_symmetric(block: _Block, m: Sequence[Sequence[object]], source: str, what: str) -> None:
    for i in range(block.gpus):
        for j in range(i + 1, block.gpus):
            if m[i][j] != m[j][i]:
                a, b = block.rows[i][1][j], block.rows[j][1][i]
                raise _err(source, block.rows[j][0],
                           f"asymmetric matrix: GPU{j} row says GPU{j}-GPU{i} is {b} but the GPU{i} "
                           f"row (line {block.rows[i][0]}) says {a}; a {what} is the same both ways, "
                           f"fix one of the two cells")


def _p2p_cells(block: _Block, source: str) -> tuple[tuple[bool | None, ...], ...]:
    n = block.gpus
    out: list[list[bool | None]] = [[None] * n for _ in range(n)]
    for i in range(n):
        ln, cells = block.rows[i]
        for j, c in enumerate(cells):
            if (c == "X") != (i == j):
                raise _err(source, ln, f"GPU{i} row, column GPU{j}: X (self) belongs on the "
                                       f"diagonal only, got {c!r}")
            if i == j:
                continue
            if c not in P2P_CELLS:
                raise _err(source, ln, f"GPU{i} row, column GPU{j}: unknown P2P cell {c!r}; "
                                       f"accepted: {', '.join(P2P_CELLS)} (only OK means P2P allowed)")
            out[i][j] = c == P2P_OK
    _check_symmetric(block, out, source, "P2P answer (the model keeps one per pair)")
    return tuple(tuple(r) for r in out)


def parse_p2p_matrix(text: str, source: str = "<p2p>") -> tuple[tuple[bool | None, ...], ...]:
    """The `nvidia-smi topo -p2p r` matrix: True where the cell is OK, None on the diagonal."""
    block = _find_block(text.splitlines(), 0, source)
    if block is None:
        raise _no_header(source, "`nvidia-smi topo -p2p r` output")
    return _p2p_cells(block, source)


def _embedded_p2p(lines: list[str], start: int, source: str) -> _Block | None:
    """A "P2P ..." title line directly followed by a GPU header (as render.topo_matrix
    prints it); anything looser could mistake a second machine's matrix for P2P answers."""
    for idx in range(start, len(lines)):
        if not lines[idx].strip().upper().startswith("P2P"):
            continue
        nxt = next((k for k in range(idx + 1, len(lines)) if lines[k].strip()), None)
        if nxt is not None:
            head = _header(lines[nxt].split())
            if head is not None:
                return _read_rows(lines, nxt, head, source)
        return None
    return None


def parse_topo_matrix(text: str, source: str = "<input>", p2p_text: str | None = None,
                      p2p_source: str = "<p2p>") -> ParsedHost:
    """Parse `nvidia-smi topo -m` output; `p2p_text` is optional `topo -p2p r` output.

    A P2P section following the matrix, as `commsim topo show` prints it, is read too when no
    separate `p2p_text` is given, so a rendered topology imports back unchanged.
    """
    lines = text.splitlines()
    block = _find_block(lines, 0, source)
    if block is None:
        raise _no_header(source, "`nvidia-smi topo -m` output")
    cells = _link_cells(block, source)
    p2p, psrc = None, None
    if p2p_text is not None:
        pb = _find_block(p2p_text.splitlines(), 0, p2p_source)
        if pb is None:
            raise _no_header(p2p_source, "`nvidia-smi topo -p2p r` output")
        p2p, psrc = _p2p_cells(pb, p2p_source), p2p_source
    else:
        pb = _embedded_p2p(lines, block.end, source)
        if pb is not None:
            p2p, psrc = _p2p_cells(pb, source), source
    if p2p is not None and len(p2p) != len(cells):
        raise _err(psrc or p2p_source, None,
                   f"P2P matrix has {len(p2p)} GPUs but the topo matrix ({source}) has "
                   f"{len(cells)}; give both from the same machine")
    return ParsedHost(source, cells, len(block.devices), p2p, psrc)


# -- building a cluster -----------------------------------------------------------------


def _first_non_nvlink(parsed: ParsedHost) -> str:
    for i, j in parsed.pairs():
        if not parsed.link(i, j).is_nvlink:
            return f"GPU{i}-GPU{j} is {parsed.cells[i][j]}"
    return ""


def _resolve_domain(parsed: ParsedHost, hosts: int, domain: str | None,
                    spec: GpuSpec | None, warnings: list[str]) -> str:
    n = parsed.gpu_count
    nvswitch = parsed.all_nvlink and n >= 4
    tray = parsed.all_nvlink and n == 4 and parsed.nvlink_counts() == {18}
    if domain is not None:
        if domain not in DOMAINS:
            raise TopologyError(f"unknown NVLink domain {domain!r}; accepted: {', '.join(DOMAINS)}")
        if domain != "none" and not parsed.all_nvlink:
            raise TopologyError(
                f"domain {domain!r} needs NVLink between every GPU pair (an NVSwitch fabric), but "
                f"{_first_non_nvlink(parsed)} in {parsed.source}; use domain 'none'")
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
            f"NVLink domain inferred as 'node': NVLink between every pair of {n} GPUs is read as "
            f"one NVSwitch board per host (single-node domain, zero cluster UUID); pass "
            f"--domain rack if the hosts share one multi-node NVLink fabric, or --domain none")
        if spec is not None and spec.key in ("GB200", "GH200"):
            warnings.append(f"{spec.model} hosts are normally part of a rack NVLink domain; "
                            f"pass --domain rack to model that")
        return "node"
    return "none"


def _infer_spec(parsed: ParsedHost, domain: str, warnings: list[str]) -> GpuSpec:
    counts = parsed.nvlink_counts()
    if domain == "rack" and parsed.gpu_count == 4 and counts == {18}:
        spec, why = gpu_models.GB200, "4 GPUs per host with NV18 all pairs in a rack domain"
    elif domain != "none" and counts == {12}:
        spec, why = gpu_models.NV12_NVSWITCH_DEFAULT, "NV12 between every pair (HGX A100 board)"
    elif domain != "none":
        spec, why = gpu_models.NVSWITCH_DEFAULT, "NVLink between every pair (NVSwitch-class)"
    else:
        spec = gpu_models.UNKNOWN
        warnings.append(
            f"GPU model not given and not inferable from this matrix: assumed compute "
            f"capability {spec.compute_capability[0]}.{spec.compute_capability[1]}, "
            f"{spec.memory_gib} GiB, no multicast, no fabric handles; pass --gpu-model NAME "
            f"(known: {gpu_models.KNOWN_NAMES})")
        return spec
    warnings.append(f"GPU model not given: assumed {spec.name_for(True)} ({why}); pass "
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
        table = parsed.p2p
        return matrix_from(parsed.gpu_count, lambda i, j: Link.parse(parsed.cells[i][j] or "",
                                                                     p2p=bool(table[i][j])))
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
    if not isinstance(hosts, int) or hosts < 1:
        raise TopologyError(f"host count must be an integer >= 1 (how many hosts of this shape), "
                            f"got {hosts!r}")
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", host_prefix or ""):
        raise TopologyError(f"host prefix {host_prefix!r} is not a hostname start; use letters, "
                            f"digits, '.', '_', '-'")
    warnings: list[str] = []
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
        if not rows[0].split() or not _header(rows[0].split()):
            n = len(rows)
            body = [r if _GPU.match((r.split() or [""])[0].upper()) else f"GPU{i}\t{r}"
                    for i, r in enumerate(rows)]
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
