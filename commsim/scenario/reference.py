"""Rank inputs and the reference they are checked against, in O(message) memory.

A rank's input is a pure function of (seed, group, group size, rank, op, numel, dtype,
element index): rank r of a group reads the window that starts `STRIDE * r` elements into
one pseudo-random tape of small integers drawn for (seed, group, op, numel, dtype). Every
rank's input is therefore a view of one tape (no per-rank copy, however many ranks hold
their input at once), any replay in any process regenerates the same bytes, and the
reference is accumulated rank by rank over one message, never by stacking every rank's
input (the old runner's `torch.stack(...).double()` was 23 s of a 44 s rack profile).

From SHARED_MIN bytes on, the windows start a page apart (one page of elements between ranks
instead of STRIDE) and the tape in the dtype lives in a sealed memfd
(commsim/sim/shared_pages.py), so that staging a rank's input into simulated device memory
maps the tape's pages copy-on-write instead of copying them: 72 ranks staging 8 MiB each cost
one tape, not 72 copies.

Inputs are integers in [-8, 8], exact in every dtype, so the sum of a group's inputs is an
integer; it is accumulated exactly in an integer array (int16 while the group is small
enough that no sum can overflow, else int32), which is bitwise the float64 sum rank by rank
and costs a fifth of the memory traffic. The check keeps the old contract, max |y - ref| <=
RTOL * max |ref| + 1e-6 in float64; a fast path first compares the result's bytes with the
reference rounded into the dtype, and is taken only when that rounding is itself proven
within the tolerance (so it can never pass what the float64 comparison would fail).
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
import torch

from commsim.scenario.message import ESIZE, SHARED_MIN, message_numel  # noqa: F401  (re-exported)
from commsim.sim import shared_pages
from commsim.sim.shared_pages import PAGE, SealedArray

TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Tolerances against the float64 reference: inputs are exact in every dtype, so the error is
# the final rounding of a float32 sum back into the dtype (one ulp of the result).
RTOL = {"float32": 1e-6, "float16": 1e-3, "bfloat16": 8e-3}
# Integers of at most this magnitude are exact in the dtype (2 ** its significand's bits,
# IEEE 754 binary32 / binary16, bfloat16's 8): a reference made of them rounds to itself.
EXACT_INT = {"float32": 2 ** 24, "float16": 2 ** 11, "bfloat16": 2 ** 8}
STRIDE = 61          # elements between consecutive ranks' windows on the tape (a prime)
LOW, HIGH = -8, 8    # input values
CHUNK = 1 << 20      # elements per step of the float64 comparison (bounds its temporaries)
MEMO = 3             # references kept per run (ranks of a group move through ops together)
BYTES_COMPARED = 64 * 1024   # up to this size outputs are compared as bytes objects


# One PCG64 whose state is set from the key at every tape: building a generator per tape
# (PCG64(seed) runs numpy's SeedSequence) was 35 of the 45 us a small tape cost. The lock keeps
# a tape whole where real threads make references (a greenlet never switches inside one).
_BITS = np.random.PCG64(0)
_DRAW = np.random.Generator(_BITS)
_DRAW_LOCK = threading.Lock()
_INC = 0xDA3E39CB94B95BDB        # PCG64's increment: any odd constant; fixed, so tapes replay


def _key(*parts: Any) -> int:
    # hashlib, not hash(): str hashing is salted per process, and a replay in another process
    # must see the same inputs. 128 bits: PCG64's whole state.
    d = hashlib.blake2b(repr(parts).encode(), digest_size=16).digest()
    return int.from_bytes(d, "little")


def stride(numel: int, dtype: str) -> int:
    """Elements between consecutive ranks' windows: STRIDE, or one page of elements for a
    message of SHARED_MIN bytes or more (page-aligned windows stage by mapping)."""
    esz = ESIZE[dtype]
    return PAGE // esz if numel * esz >= SHARED_MIN else STRIDE


def tape(seed: int, group: str, size: int, op: str, numel: int, dtype: str) -> np.ndarray:
    """The group's integer tape for one op: `numel + stride * (size - 1)` int8 values."""
    n = numel + stride(numel, dtype) * (size - 1)
    state = {"bit_generator": "PCG64", "state": {"state": _key(seed, group, op, numel, dtype), "inc": _INC},
             "has_uint32": 0, "uinteger": 0}
    with _DRAW_LOCK:
        _BITS.state = state
        return _DRAW.integers(LOW, HIGH + 1, size=n, dtype=np.int8)


def make_input(seed: int, group: str, size: int, rank: int, op: str, numel: int,
               dtype: str) -> torch.Tensor:
    """Rank `rank`'s input (a fresh tensor; the runner shares views through `Reference`)."""
    s = stride(numel, dtype)
    t = tape(seed, group, size, op, numel, dtype)[s * rank: s * rank + numel]
    return torch.from_numpy(t.copy()).to(TORCH[dtype])


def _bytes(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.uint8).numpy()


def _equal(a: np.ndarray, b: np.ndarray) -> bool:
    """np.array_equal block by block: its temporary is a block's size, not the message's
    (a 256 MiB result compared whole made a 256 MiB mask on every rank's check). Blocks are
    rows of a 2-D pair (an all-gather's windows), slices of a 1-D one. Up to BYTES_COMPARED
    the two are compared as bytes objects instead: a copy of each, compared in C, costs less
    than np.array_equal's Python layer (0.1 us vs 1.6 at 16 bytes, 2.0 vs 3.4 at 64 KiB)."""
    if a.shape != b.shape:
        return False
    if a.nbytes <= BYTES_COMPARED:
        return a.tobytes() == b.tobytes()
    if a.shape[-1] % 8 == 0 and a.strides[-1] == b.strides[-1] == 1:
        # As 8-byte words (equal exactly when the bytes are): an eighth of the elements and of
        # the mask (1 MiB: 28 us vs 46).
        a, b = a.view(np.uint64), b.view(np.uint64)
    block = 8 * CHUNK // a.itemsize       # elements of 8 MiB
    step = block if a.ndim == 1 else max(1, block // max(a.shape[1], 1))
    return all(np.array_equal(a[i:i + step], b[i:i + step]) for i in range(0, a.shape[0], step))


def windows(tape: np.ndarray, stride: int, size: int, numel: int) -> np.ndarray:
    """Every rank's window of a contiguous tape as the rows of one read-only (size, numel)
    view (numpy refuses one that would reach past the tape's end). Made by the ndarray
    constructor over the tape's buffer: a quarter of numpy's as_strided cost (1.6 us vs 5.8)."""
    v = np.ndarray((size, numel), tape.dtype, buffer=tape, strides=(stride * tape.itemsize, tape.itemsize))
    v.flags.writeable = False
    return v


COLUMNS = 32         # tape columns per block of window_sum: its temporaries stay in cache
# Up to this many ranks window_sum adds the windows one after the other (numpy's sum over the
# rows of `windows`): `size` passes over the message, against the running sums' fixed cost
# of about 25 passes plus a loop per column block; measured crossover 24-32 ranks (a 16-rank
# 64 KiB window: 36 us against 435 us; 72 ranks at 1 MiB: 3.6 ms against 1.0 ms).
DIRECT_UP_TO = 24


def window_sum(ints: np.ndarray, stride: int, size: int, numel: int, dtype: type) -> np.ndarray:
    """sum over r < size of ints[stride * r: stride * r + numel], exactly, in `dtype`.

    Seen as rows of `stride` elements, window r starts r rows down the tape, so row q of the
    sum is a sliding sum of `size` rows: a difference of two running sums down the rows. That
    is a few passes over the tape instead of one pass over the message per rank (72 at rack
    scale), and O(message) memory: the running sums are made a block of columns at a time.
    Small groups (DIRECT_UP_TO) add their windows directly: fewer passes for them. Either
    way the sum is of integers, exact, so the two agree bit for bit."""
    if size <= DIRECT_UP_TO:
        return windows(ints, stride, size, numel).sum(axis=0, dtype=dtype)
    rows_out = -(-numel // stride)          # rows of the result (the last may be partial)
    rows = rows_out + size - 1              # rows of the tape they read
    need = rows * stride
    t = ints[:need] if ints.size >= need else np.concatenate([ints, np.zeros(need - ints.size, ints.dtype)])
    tape2d = t.reshape(rows, stride)
    out = np.empty(rows_out * stride, dtype)
    out2d = out.reshape(rows_out, stride)
    for c0 in range(0, stride, COLUMNS):
        c1 = min(stride, c0 + COLUMNS)
        run = np.cumsum(tape2d[:, c0:c1], axis=0, dtype=np.int32)     # exact: |run| <= 8 * rows
        part = run[size - 1:].copy()
        part[1:] -= run[:rows_out - 1]
        out2d[:, c0:c1] = part
    return out[:numel]


@dataclass
class Span:
    """What one rank's output is checked against (ranks with the same output share one)."""

    parts: list[tuple[int, np.ndarray, float]]   # (offset, exact values, added constant)
    numel: int                                   # elements of the output
    tol: float                                   # RTOL * max |ref| + 1e-6 over the parts
    # The reference rounded into the dtype, as raw bytes shaped like the output's (one row
    # per rank for an all-gather), where that rounding is itself within `tol` of the exact
    # values, so a bitwise match passes the float64 check too; else None (no fast path).
    rounded: np.ndarray | None


SMALL_ONES_KEPT = 64
_SMALL_ONES: dict[tuple[int, str], torch.Tensor] = {}


class Reference:
    """One op of one group: every rank's input (views of one tape in the dtype) and the
    exact integer result each rank must get back, with the check of a rank's output."""

    def __init__(self, seed: int, group: str, size: int, op: str, numel: int, dtype: str):
        self.op, self.size, self.numel, self.dtype = op, size, numel, dtype
        self.stride = stride(numel, dtype)
        self.ints = tape(seed, group, size, op, numel, dtype)
        self.values = self._in_dtype(self.ints, dtype)
        self.total: np.ndarray | None = None      # the exact sum (reduce ops)
        self._expected: torch.Tensor | None = None
        self._spans: dict[int, Span] = {}
        self._ones: torch.Tensor | None = None
        if op != "all_gather":
            self.total = window_sum(self.ints, self.stride, size, numel,
                                    np.int16 if size * max(-LOW, HIGH) + 1 < 2 ** 15 else np.int32)
            # Only an all-gather's check reads the windows again; the integer tape (a byte
            # per element, 128 MiB at 256 MiB of bfloat16) goes once the sum is made.
            self.ints = None

    def _in_dtype(self, ints: np.ndarray, dtype: str) -> torch.Tensor:
        """The tape in the dtype: in a sealed memfd from SHARED_MIN bytes on (staged inputs
        then share its pages), else a plain tensor."""
        t = torch.from_numpy(ints)
        esz = ESIZE[dtype]
        if self.numel * esz < SHARED_MIN or not shared_pages.AVAILABLE:
            return t.to(TORCH[dtype])
        self.sealed = SealedArray(ints.size * esz,
                                  lambda a: torch.from_numpy(a).view(TORCH[dtype]).copy_(t))
        return torch.from_numpy(self.sealed.array).view(TORCH[dtype])

    def window(self, rank: int) -> np.ndarray:
        assert self.ints is not None, "a reduction keeps its sum, not its integer tape"
        return self.ints[self.stride * rank: self.stride * rank + self.numel]

    def input(self, rank: int) -> torch.Tensor:
        """Rank `rank`'s input: a read-only view by contract (callers copy before writing)."""
        return self.values[self.stride * rank: self.stride * rank + self.numel]

    def ones(self) -> torch.Tensor:
        """The fused all-reduce + RMSNorm's residual and weight: ones of the message's shape,
        made once. Read-only like the inputs (the op reads both and writes neither)."""
        if self._ones is None:
            if self.numel * ESIZE[self.dtype] < SHARED_MIN:
                # Small ones are shared by every reference of that shape, across runs (a
                # sweep asks for the same few shapes in most scenarios).
                key = (self.numel, self.dtype)
                ones = _SMALL_ONES.get(key)
                if ones is None:
                    if len(_SMALL_ONES) >= SMALL_ONES_KEPT:
                        _SMALL_ONES.pop(next(iter(_SMALL_ONES)))
                    ones = _SMALL_ONES[key] = torch.ones(self.numel, dtype=TORCH[self.dtype])
                self._ones = ones
            else:
                self._ones = torch.ones(self.numel, dtype=TORCH[self.dtype])
        return self._ones

    # -- what each rank must get back -----------------------------------------------------
    def _parts(self, rank: int) -> list[tuple[int, np.ndarray, float]]:
        """(offset in the output, exact values, added constant) per span of the output."""
        if self.op == "all_gather":
            return [(j * self.numel, self.window(j), 0.0) for j in range(self.size)]
        assert self.total is not None
        if self.op == "reduce_scatter":
            per = self.numel // self.size
            return [(0, self.total[rank * per:(rank + 1) * per], 0.0)]
        # all_reduce_rmsnorm: the checked output is all_reduce(x) + residual (ones)
        return [(0, self.total, 1.0 if self.op == "all_reduce_rmsnorm" else 0.0)]

    def _expected_all(self) -> torch.Tensor:
        """The reduced sum rounded into the dtype the way the communicator rounds it."""
        if self._expected is None:
            e = torch.from_numpy(self.total).to(TORCH[self.dtype])
            if self.op == "all_reduce_rmsnorm":
                e = (e.float() + 1.0).to(TORCH[self.dtype])
            self._expected = e
        return self._expected

    def _expected_part(self, rank: int, j: int, off: int, n: int) -> torch.Tensor:
        if self.op == "all_gather":
            return self.input(j)
        lo = rank * n if self.op == "reduce_scatter" else 0
        return self._expected_all()[lo:lo + n]

    def _rounded_bytes(self, rank: int, n_out: int) -> np.ndarray:
        """The rounded reference of `rank`'s output as raw bytes: an all-gather's is every
        rank's window of the tape in the dtype (a strided view, no copy), one row each."""
        esz = ESIZE[self.dtype]
        if self.op == "all_gather":
            return windows(_bytes(self.values), self.stride * esz, self.size, self.numel * esz)
        lo = rank * n_out if self.op == "reduce_scatter" else 0
        return _bytes(self._expected_all())[lo * esz:(lo + n_out) * esz]

    def span(self, rank: int) -> Span:
        """What `rank`'s output is checked against, made once per distinct output: every
        rank's for an all-reduce or all-gather, each rank's own for a reduce-scatter."""
        key = rank if self.op == "reduce_scatter" else 0
        sp = self._spans.get(key)
        if sp is None:
            parts = self._parts(rank)
            n_out = sum(len(v) for _, v, _ in parts)
            peak = self._peak(parts)
            tol = RTOL[self.dtype] * peak + 1e-6
            # An integer reference within EXACT_INT rounds to itself: no error to measure.
            exact = peak <= EXACT_INT[self.dtype] or all(
                self._rounding_error(rank, j, off, v, c) <= tol for j, (off, v, c) in enumerate(parts))
            sp = self._spans[key] = Span(parts, n_out, tol,
                                         self._rounded_bytes(rank, n_out) if exact else None)
        return sp

    def _peak(self, parts: list[tuple[int, np.ndarray, float]]) -> float:
        """max |ref| over the parts; an all-gather's over its windows at once (two passes over
        one view, not two per rank)."""
        if self.op == "all_gather":
            w = windows(self.ints, self.stride, self.size, self.numel)
            return max(abs(float(w.max())), abs(float(w.min())))
        return max((max(abs(float(v.max()) + c), abs(float(v.min()) + c)) if len(v) else abs(c))
                   for _, v, c in parts)

    def _rounding_error(self, rank: int, j: int, off: int, v: np.ndarray, c: float) -> float:
        """max |rounded - exact| over one part of the output."""
        e = self._expected_part(rank, j, off, len(v))
        err = 0.0
        for s in range(0, len(v), CHUNK):
            err = max(err, float(np.abs(e[s:s + CHUNK].double().numpy() - (v[s:s + CHUNK] + c)).max()))
        return err

    def check(self, y: torch.Tensor, rank: int) -> str | None:
        """None when `y` is within tolerance of the float64 reference, else the error."""
        sp = self.span(rank)
        if tuple(y.shape) != (sp.numel,):
            return f"max error inf > {sp.tol}"
        if (y.dtype == TORCH[self.dtype] and sp.rounded is not None
                and _equal(_bytes(y).reshape(sp.rounded.shape), sp.rounded)):
            return None
        flat = y.reshape(-1)
        err = 0.0
        for off, v, c in sp.parts:
            for s in range(0, len(v), CHUNK):
                # Bounded by the part too: an all-gather's parts sit one after the other.
                got = flat[off + s: off + min(s + CHUNK, len(v))].double().numpy()
                err = max(err, float(np.abs(got - (v[s:s + CHUNK] + c)).max()))
        return None if err <= sp.tol else f"max error {err} > {sp.tol}"


_MAX_ERROR = re.compile(r"max error (\S+) > ")


def max_error_of(mismatch: str) -> float:
    """The largest absolute error a mismatch line of `Reference.check` reports (inf for a
    result of the wrong shape)."""
    m = _MAX_ERROR.search(mismatch)
    return float(m.group(1)) if m else float("inf")


class Inputs:
    """The references of one run, made on demand and dropped least-recently-used (they are a
    pure function of the key, so a dropped one is simply made again). Read-only, so sharing
    them between in-process ranks bypasses no process boundary: they stand for each rank's
    own data and never cross the group layer.

    `ahead`: the keys the run will ask for, where known. The small ones (under SHARED_MIN
    bytes) are made at once, one after the other, and kept for the whole run: made between
    the ranks' driver calls, which evict numpy's code and data from the caches, each cost
    about half again as much (in process, 400 scenarios: 0.70 -> 0.49 ms per scenario), and a
    capture then eager pass asks for each twice. Large ones stay on demand, at most MEMO at
    a time (their memory)."""

    def __init__(self, seed: int, ahead: Iterable[tuple[str, int, str, int, str]] = ()) -> None:
        self.seed = seed
        self.memo: OrderedDict[tuple, Reference] = OrderedDict()
        self.kept: dict[tuple, Reference] = {}
        for key in ahead:
            gname, size, op, numel, dt = key
            if numel * ESIZE[dt] < SHARED_MIN and key not in self.kept:
                self.kept[key] = Reference(seed, gname, size, op, numel, dt)

    def get(self, gname: str, size: int, op: str, numel: int, dt: str) -> Reference:
        key = (gname, size, op, numel, dt)
        ref = self.kept.get(key)
        if ref is not None:
            return ref
        ref = self.memo.get(key)
        if ref is None:
            ref = self.memo[key] = Reference(self.seed, gname, size, op, numel, dt)
            while len(self.memo) > MEMO:
                self.memo.popitem(last=False)
        self.memo.move_to_end(key)
        return ref
