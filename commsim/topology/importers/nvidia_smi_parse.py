"""Parsing of `nvidia-smi topo -m` and `nvidia-smi topo -p2p r` text as pasted in bug reports.

Prose before the header, NIC rows and columns, the affinity columns and the legends are skipped;
what remains must be a square, symmetric GPU matrix. Rejections name the source, the line,
what was wrong and what is accepted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from commsim.topology.limits import MAX_GPUS_PER_HOST
from commsim.topology.model import Link, TopologyError

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
    # The `topo -p2p` cell per pair (OK, NS, CNS ...) when given: why a pair has no P2P (T4).
    p2p_codes: tuple[tuple[str | None, ...], ...] | None = None
    notes: tuple[str, ...] = ()                        # what the parser assumed (truncation)

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
    rows: dict[int, tuple[int, list[str]]]  # GPU index -> (line number, GPU cells, maybe short)
    end: int                                # index of the first line after the block
    truncated: str = ""                     # how the table was cut short ("" = complete)


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
    if n > MAX_GPUS_PER_HOST:        # before its n^2 cells are read
        raise _err(source, idx + 1, f"the header names {n:,} GPUs, more than the "
                                    f"{MAX_GPUS_PER_HOST} one host may have; give one host's "
                                    f"`nvidia-smi topo -m`")
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
        if len(cells) > width or (len(cells) < width and not _last_gpu_row(lines, k)):
            cols = f"{n} GPU columns" + (f" and {len(devices)} NIC columns" if devices else "")
            what = "GPU cells" if not devices else "cells"
            raise _err(source, ln, f"GPU{i} row has {len(cells)} {what}, header has {cols} "
                                   f"(line {idx + 1}); every row needs one cell per column")
        if len(cells) < width and cells and not _whole_cell(cells[-1]):
            cells.pop()         # the paste ends inside a cell ("NV" of "NV18")
        rows[i] = (ln, cells[:n])
        k += 1
    cut = []
    if rows:
        last = max(rows)
        if len(rows[last][1]) < n:
            cut.append(f"the GPU{last} row (line {rows[last][0]}) stops after "
                       f"{len(rows[last][1])} of {n} GPU cells")
    missing = [i for i in range(n) if i not in rows]
    gaps = [i for i in missing if rows and i < max(rows)]
    if gaps or len(rows) < 2 and missing:
        raise _err(source, idx + 1, f"header has {n} GPU columns but no row for "
                                    f"{', '.join(f'GPU{i}' for i in gaps or missing)}; paste the "
                                    f"whole matrix")
    if missing:
        cut.append(f"no row for {', '.join(f'GPU{i}' for i in missing)}")
    return _Block(idx + 1, n, devices, rows, k, "; ".join(cut))


def _whole_cell(c: str) -> bool:
    if c == "X" or c in P2P_CELLS:
        return True
    try:
        Link.parse(c)
        return True
    except TopologyError:
        return False


def _last_gpu_row(lines: list[str], k: int) -> bool:
    """Whether line k is the last GPU row of its block (a paste cut there is a truncation)."""
    nxt = next((ln.split() for ln in lines[k + 1:] if ln.strip()), None)
    return nxt is None or _GPU.match(nxt[0].upper()) is None


def _complete(block: _Block, source: str, what: str) -> tuple[list[list[str | None]], int, str]:
    """The GPU cells as an n x n grid with gaps of a truncated table filled from the mirror
    cell, and how many leading GPUs are fully known (all of them for a complete table). A
    truncation is reported in the note, never silently (row T5)."""
    n = block.gpus
    grid: list[list[str | None]] = [[None] * n for _ in range(n)]
    for i, (_, cells) in block.rows.items():
        for j, c in enumerate(cells):
            grid[i][j] = c
    for i in range(n):
        for j in range(n):
            if i != j and grid[i][j] is None:
                grid[i][j] = grid[j][i]
    keep = n
    for m in range(2, n + 1):
        if any(grid[i][j] is None for i in range(m) for j in range(m) if i != j):
            keep = m - 1
            break
    if not block.truncated:
        return grid, keep, ""
    if keep < 2:
        raise _err(source, block.header_line, f"the {what} is cut short ({block.truncated}) "
                                              f"before two GPUs are complete; paste the whole matrix")
    kept = f"all {n} GPUs, the missing cells read from their mirror cells" if keep == n else \
        f"GPU0..GPU{keep - 1} only (the cells between the later GPUs are not in the paste)"
    return grid, keep, (f"{source}: the {what} is cut short ({block.truncated}); imported {kept}; "
                        f"paste the whole matrix to import it as the machine is")


def _no_header(source: str, what: str) -> TopologyError:
    return _err(source, None,
                f"no GPU header found; expected {what}: a line of column names starting with "
                f"GPU0 (e.g. '\\tGPU0\\tGPU1\\tNIC0\\tCPU Affinity'), followed by one row per GPU")


def _link_cells(block: _Block, source: str) -> tuple[tuple[tuple[str | None, ...], ...], str]:
    n = block.gpus
    grid, keep, note = _complete(block, source, "`topo -m` matrix")
    out: list[list[str | None]] = [[None] * keep for _ in range(keep)]
    for i in range(keep):
        ln = block.rows[i][0] if i in block.rows else block.header_line
        for j in range(keep):
            c = grid[i][j]
            where = f"GPU{i} row, column GPU{j}"
            if i == j:
                if c is not None and c != "X":
                    raise _err(source, ln, f"{where}: the diagonal cell must be X (self), got {c!r}")
                continue
            if c == "X":
                raise _err(source, ln, f"{where}: X (self) is only allowed on the diagonal; "
                                       f"accepted: {ACCEPTED_LINKS}")
            try:
                out[i][j] = Link.parse(c or "").label
            except TopologyError:
                hint = ("; this looks like `nvidia-smi topo -p2p r` output, give it as the P2P "
                        "matrix (--p2p FILE)") if c in P2P_CELLS else ""
                raise _err(source, ln, f"{where}: unknown cell {c!r}; accepted: "
                                       f"{ACCEPTED_LINKS}{hint}") from None
    del n
    _check_symmetric(block, out, source, "link")
    return tuple(tuple(r) for r in out), note


def _check_symmetric(block: _Block, m: Sequence[Sequence[object]], source: str, what: str) -> None:
    for i in range(len(m)):
        for j in range(i + 1, len(m)):
            if m[i][j] != m[j][i]:
                a, b = block.rows[i][1][j], block.rows[j][1][i]
                raise _err(source, block.rows[j][0],
                           f"asymmetric matrix: GPU{j} row says GPU{j}-GPU{i} is {b} but the GPU{i} "
                           f"row (line {block.rows[i][0]}) says {a}; a {what} is the same both ways, "
                           f"fix one of the two cells")


def _p2p_cells(block: _Block, source: str
               ) -> tuple[tuple[tuple[bool | None, ...], ...], tuple[tuple[str | None, ...], ...], str]:
    grid, keep, note = _complete(block, source, "P2P matrix")
    out: list[list[bool | None]] = [[None] * keep for _ in range(keep)]
    codes: list[list[str | None]] = [[None] * keep for _ in range(keep)]
    for i in range(keep):
        ln = block.rows[i][0] if i in block.rows else block.header_line
        for j in range(keep):
            c = grid[i][j]
            if c is not None and (c == "X") != (i == j):
                raise _err(source, ln, f"GPU{i} row, column GPU{j}: X (self) belongs on the "
                                       f"diagonal only, got {c!r}")
            if i == j:
                continue
            if c not in P2P_CELLS:
                raise _err(source, ln, f"GPU{i} row, column GPU{j}: unknown P2P cell {c!r}; "
                                       f"accepted: {', '.join(P2P_CELLS)} (only OK means P2P allowed)")
            out[i][j], codes[i][j] = c == P2P_OK, c
    _check_symmetric(block, out, source, "P2P answer (the model keeps one per pair)")
    return tuple(tuple(r) for r in out), tuple(tuple(r) for r in codes), note


def parse_p2p_matrix(text: str, source: str = "<p2p>") -> tuple[tuple[bool | None, ...], ...]:
    """The `nvidia-smi topo -p2p r` matrix: True where the cell is OK, None on the diagonal."""
    block = _find_block(text.splitlines(), 0, source)
    if block is None:
        raise _no_header(source, "`nvidia-smi topo -p2p r` output")
    return _p2p_cells(block, source)[0]


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


# `nvidia-smi topo -p2p <mode>`: r = read, w = write (the P2P fact), n = over NVLink,
# a = atomics, p = prop (informational here).
_P2P_MODE = re.compile(r"topo\s+-p2p\s+([rwnap])\b", re.IGNORECASE)
_P2P_FACT_MODES = ("r", "w", "")


def _is_p2p_block(block: _Block) -> bool:
    cells = [c for i, (_, row) in block.rows.items() for j, c in enumerate(row) if i != j]
    return bool(cells) and all(c in P2P_CELLS for c in cells)


def _following_p2p(lines: list[str], start: int, source: str,
                   notes: list[str]) -> list[tuple[_Block, str]]:
    """`topo -p2p` blocks pasted after the matrix (OK, NS, CNS, GNS, TNS, U cells), each with
    its mode letter when the command line was pasted too ("" when not)."""
    out: list[tuple[_Block, str]] = []
    pos = start
    while True:
        titled = _embedded_p2p(lines, pos, source) if not out else None
        block = titled or _find_block(lines, pos, source)
        if block is None or not _is_p2p_block(block):
            return out
        between = "\n".join(lines[pos:block.header_line - 1])
        modes = _P2P_MODE.findall(between)
        mode = modes[-1].lower() if modes else ""
        if mode not in _P2P_FACT_MODES:
            notes.append(f"{source} line {block.header_line}: `topo -p2p {mode}` block read for "
                         f"reference only; the P2P fact comes from the r/w blocks")
        out.append((block, mode))
        pos = block.end


def parse_topo_matrix(text: str, source: str = "<input>", p2p_text: str | None = None,
                      p2p_source: str = "<p2p>") -> ParsedHost:
    """Parse `nvidia-smi topo -m` output; `p2p_text` is optional `topo -p2p r` output.

    `topo -p2p r|w` blocks following the matrix (as pasted in bug reports, or the "P2P"
    section `commsim topo show` prints) are read too when no separate `p2p_text` is given;
    several are ANDed (a pair has P2P when every read/write block says OK). A table cut short
    imports what is there, with a note (ParsedHost.notes).
    """
    lines = text.splitlines()
    block = _find_block(lines, 0, source)
    if block is None:
        raise _no_header(source, "`nvidia-smi topo -m` output")
    cells, note = _link_cells(block, source)
    notes = [note] if note else []
    p2p_blocks: list[tuple[_Block, str, str]] = []
    if p2p_text is not None:
        pb = _find_block(p2p_text.splitlines(), 0, p2p_source)
        if pb is None:
            raise _no_header(p2p_source, "`nvidia-smi topo -p2p r` output")
        p2p_blocks.append((pb, "", p2p_source))
    else:
        p2p_blocks += [(b, m, source) for b, m in _following_p2p(lines, block.end, source, notes)]
    p2p, codes, psrc = None, None, None
    for pb, mode, src in p2p_blocks:
        if mode not in _P2P_FACT_MODES:
            continue
        m, c, pnote = _p2p_cells(pb, src)
        if pnote:
            notes.append(pnote)
        if pb.gpus != block.gpus:
            raise _err(src, None,
                       f"P2P matrix has {pb.gpus} GPUs but the topo matrix ({source}) has "
                       f"{block.gpus}; give both from the same machine")
        p2p, codes = _and_p2p(p2p, codes, m, c)
        psrc = psrc or src
    n = len(cells)
    if p2p is not None and len(p2p) != n:
        # One of the two was cut short: keep the GPUs both know.
        n = min(n, len(p2p))
        cells = tuple(r[:n] for r in cells[:n])
        p2p = tuple(r[:n] for r in p2p[:n])
        codes = tuple(r[:n] for r in codes[:n])
    return ParsedHost(source, cells, len(block.devices), p2p, psrc, codes, tuple(notes))


def _and_p2p(p2p, codes, m, c):
    """Combine two P2P blocks: allowed only where both say OK; the first refusal's code kept."""
    if p2p is None:
        return m, c
    n = min(len(p2p), len(m))
    out = tuple(tuple(None if i == j else bool(p2p[i][j] and m[i][j]) for j in range(n))
                for i in range(n))
    why = tuple(tuple(None if i == j else (codes[i][j] if codes[i][j] != P2P_OK else c[i][j])
                      for j in range(n)) for i in range(n))
    return out, why


def looks_like_header(line: str) -> bool:
    """Whether `line` is a GPU header row (GPU0 GPU1 ... [NICs] [affinity column names])."""
    return _header(line.split()) is not None


def is_gpu_row(line: str) -> bool:
    tokens = line.split()
    return bool(tokens) and _GPU.match(tokens[0].upper()) is not None
