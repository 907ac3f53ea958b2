"""Workspace layout of one rank, shared by the reference kernels, the backends that allocate
it and device/kernels/commsim_common.cuh:

    [0, FLAGS_BYTES)                 three flag arrays (start, mid, end) of MAX_RANKS uint32
    [DATA, DATA + capacity)          this rank's input, written before launch
    [SCRATCH, SCRATCH + capacity)    reduced chunks / results (SCRATCH = DATA + capacity)
"""

from __future__ import annotations

MAX_RANKS = 128
START, MID, END = 0, 4 * MAX_RANKS, 8 * MAX_RANKS
FLAGS_BYTES = 4096
DATA = FLAGS_BYTES


def workspace_bytes(capacity: int) -> int:
    return FLAGS_BYTES + 2 * capacity


def chunks(n: int, ws: int) -> list[tuple[int, int]]:
    """Element ranges of a two-shot split: the first n % ws chunks get one extra element."""
    base, extra = divmod(n, ws)
    out, lo = [], 0
    for i in range(ws):
        hi = lo + base + (1 if i < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out
