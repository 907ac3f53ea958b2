"""Hang diagnosis: the errors a blocked collective or spin wait ends with, and the diagnosis
they carry. The runtime (scheduler, wait_until) raises them; the groups above reuse them.

Every error names world ranks ("rank 3" is world rank 3 in every message, whatever group it
is about), the group, the collective's sequence number (#0 is a rank's first collective in
that group) and the caller's tag, so a person can find the call site and lifecycle step from
the message alone, e.g.

    hang in group 'tp' collective #3 all_gather_object (tag 'ipc.register: exchange graph
    handles'): ranks 0,1 arrived; ranks 2,3 did not — rank 2 finished; rank 3 is blocked in
    barrier (tag 'close') of group 'world' #5
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

# RankState.status values.
RUNNING = "running"      # the rank whose code is executing right now
RUNNABLE = "runnable"    # ready, waiting for the scheduler to pick it
NOT_STARTED = "not started"
BLOCKED = "blocked"      # inside a collective
WAITING = "waiting"      # inside wait_until
SLEEPING = "sleeping"    # inside sleep (virtual time)
FINISHED = "finished"
FAILED = "failed"


class GroupError(Exception):
    """Base of every group-layer error. `diagnosis` is set where the scheduler built one."""

    def __init__(self, message: str, diagnosis: "Diagnosis | None" = None) -> None:
        super().__init__(message)
        self.diagnosis = diagnosis


class CollectiveMismatch(GroupError):
    """Ranks of one group met at the same sequence number with different calls (kind, src, op,
    or subgroup spec). `calls` lists (world rank, call, tag) for every rank that arrived."""

    def __init__(self, message: str, calls: Sequence[tuple[int, str, str]] = ()) -> None:
        super().__init__(message)
        self.calls = tuple(calls)


class HangDetected(GroupError):
    """No rank can make progress (or the step budget ran out: reason 'livelock')."""


class GroupTimeout(HangDetected):
    """A collective or wait_until ran past its timeout in virtual time."""


class RankFailed(GroupError):
    """A peer this collective needs has died (its rank function raised)."""

    def __init__(self, message: str, diagnosis: "Diagnosis | None" = None,
                 failed_rank: int | None = None, cause: BaseException | None = None) -> None:
        super().__init__(message, diagnosis)
        self.failed_rank = failed_rank
        self.cause = cause


def short_error(exc: BaseException) -> str:
    """`ValueError('boom')`, with the first line of the message only (nested diagnoses are long)."""
    text = str(exc).split("\n", 1)[0]
    if len(text) > 160:
        text = text[:157] + "..."
    return f"{type(exc).__name__}({text!r})"


def format_ranks(ranks: Iterable[int]) -> str:
    """'0-3,5,7' — runs of three or more collapse to a range so 72-rank messages stay short."""
    rs = sorted(ranks)
    parts: list[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{rs[i]}-{rs[j]}")
        else:
            parts.extend(str(r) for r in rs[i:j + 1])
        i = j + 1
    return ",".join(parts)


def rank_word(ranks: Sequence[int]) -> str:
    """'rank 2' or 'ranks 0,1'."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"


def _tag(tag: str | None) -> str:
    return f"tag {tag!r}" if tag else "no tag"


@dataclass(frozen=True)
class RankState:
    """Where one world rank is at the moment of a diagnosis."""

    rank: int
    status: str
    group: str | None = None        # BLOCKED: the group, seq, collective and the rank's own tag
    seq: int | None = None
    collective: str | None = None
    tag: str | None = None
    what: str | None = None         # WAITING: the wait_until description
    until: float | None = None      # SLEEPING / timed WAITING or BLOCKED: virtual deadline
    error: BaseException | None = None  # FAILED: the exception that ended the rank

    def phrase(self, plural: bool = False) -> str:
        """Verb phrase after 'rank N' / 'ranks N,M': 'finished', 'is blocked in ...'."""
        be = "are" if plural else "is"
        s = self.status
        if s == FINISHED:
            return "finished"
        if s == FAILED:
            return f"failed with {short_error(self.error)}" if self.error else "failed"
        if s == BLOCKED:
            text = (f"{be} blocked in {self.collective} ({_tag(self.tag)}) of group "
                    f"{self.group!r} #{self.seq}")
        elif s == WAITING:
            text = f"{be} waiting until {self.what!r}"
        elif s == SLEEPING:
            return f"{be} sleeping until t={self.until:g}"
        elif s == NOT_STARTED:
            return f"{'have' if plural else 'has'} not started"
        else:
            return f"{be} {s}"
        if self.until is not None:
            text += f" (times out at t={self.until:g})"
        return text

    def _key(self) -> tuple:
        # Identity of the phrase without the rank, to merge ranks in the same place. Errors
        # merge by their printed form, not by object.
        err = short_error(self.error) if self.error is not None else None
        return (self.status, self.group, self.seq, self.collective, self.tag, self.what,
                self.until, err)


def describe_states(states: Iterable[RankState]) -> str:
    """'ranks 0,1 are blocked in ...; rank 2 finished' — ranks in the same place merged."""
    merged: dict[tuple, tuple[RankState, list[int]]] = {}
    for st in states:
        entry = merged.setdefault(st._key(), (st, []))
        entry[1].append(st.rank)
    return "; ".join(f"{rank_word(rs)} {st.phrase(len(rs) > 1)}" for st, rs in merged.values())


@dataclass(frozen=True)
class Diagnosis:
    """Why a rank cannot proceed, and where every rank of the world is.

    reason: 'hang', 'timeout', 'rank failed', 'livelock' or 'abandoned'. For a rank stuck in a
    collective, group/seq/collective/tag name the collective it expected and arrived/missing
    the world ranks of that group that did / did not reach it; for a rank stuck in wait_until,
    rank and what name the wait.
    """

    reason: str
    ranks: tuple[RankState, ...]
    time: float = 0.0
    group: str | None = None
    seq: int | None = None
    collective: str | None = None
    tag: str | None = None
    arrived: tuple[int, ...] = ()
    missing: tuple[int, ...] = ()
    rank: int | None = None
    what: str | None = None
    timeout: float | None = None
    failed: tuple[tuple[int, BaseException], ...] = ()
    note: str | None = None
    clock: str = "virtual"      # 'real' in process mode (commsim.group.torch_dist)
    _message: list = field(default_factory=list, repr=False, compare=False)

    def state_of(self, rank: int) -> RankState:
        return self.ranks[rank]

    def message(self) -> str:
        if not self._message:  # cached: the same diagnosis is shared by all ranks of a round
            self._message.append(self._build())
        return self._message[0]

    __str__ = message

    def _build(self) -> str:
        if self.reason in ("livelock", "abandoned"):
            head = f"{self.reason}: {self.note}"
            tail = describe_states(self.ranks)
            return f"{head} — {tail}"
        if self.reason == "timeout":
            prefix = f"timeout after {self.timeout:g} s of {self.clock} time (t={self.time:g})"
        elif self.reason == "rank failed":
            prefix = "; ".join(f"rank {r} failed with {short_error(e)}" for r, e in self.failed)
        else:
            prefix = self.reason
        if self.note:
            prefix = f"{prefix} ({self.note})"
        if self.collective is not None:
            where = (f"group {self.group!r} collective #{self.seq} {self.collective} "
                     f"({_tag(self.tag)})")
            if self.reason == "rank failed":
                head = f"{prefix}; {where} cannot complete"
            else:
                head = f"{prefix} in {where}"
            if self.arrived:
                head += f": {rank_word(self.arrived)} arrived"
                if self.missing:
                    head += f"; {rank_word(self.missing)} did not"
            elif self.missing:
                head += f": none of {rank_word(self.missing)} arrived"
            missing = set(self.missing)
            detail = describe_states(s for s in self.ranks if s.rank in missing)
            text = f"{head} — {detail}" if detail else head
            return f"{text}\n  all ranks at t={self.time:g}: {describe_states(self.ranks)}"
        if self.what is not None:
            head = f"{prefix}: rank {self.rank} is waiting until {self.what!r}"
            others = describe_states(s for s in self.ranks if s.rank != self.rank)
            return f"{head} — {others}" if others else head
        return f"{prefix} — {describe_states(self.ranks)}"
