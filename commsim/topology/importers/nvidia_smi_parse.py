"""Parsing of `nvidia-smi topo -m` and `nvidia-smi topo -p2p r` text as pasted in bug reports.

Prose before the header, NIC rows and columns, the affinity columns and the legends are skipped;
what remains must be a square, symmetric GPU matrix. Rejections name the source, the line,
what was wrong and what is accepted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from ..model import Link, TopologyError

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
        if head is None:
            continue
        # A header is followed by a GPU row; a lone "GPU0" in prose is not, so keep looking.
        nxt = next((ln.split() for ln in lines[idx + 1:] if ln.strip()), [""])
        if _GPU.match(nxt[0].upper()):
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


def looks_like_header(line: str) -> bool:
    """Whether `line` is a GPU header row (GPU0 GPU1 ... [NICs] [affinity column names])."""
    return _header(line.split()) is not None


def is_gpu_row(line: str) -> bool:
    tokens = line.split()
    return bool(tokens) and _GPU.match(tokens[0].upper()) is not None
