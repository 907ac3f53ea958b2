"""In-process groups: LocalWorld, LocalGroup and the collective matching behind them.

Matching: each group keeps, per rank, the sequence number of that rank's next collective in
the group; the ranks' n-th calls meet in one round keyed by n. A round checks that every
arrival is the same call (kind, and src / op / subgroup spec), completes when the last rank
arrives, and wakes the others. Arrival is O(1); completion is O(size).

By value: what crosses a group is pickled once at completion and unpickled by each receiver,
so ranks never share Python objects (a process boundary would not allow it, and handles must
survive pickling). The senders are parked inside the collective until completion, so the
snapshot equals the objects at call time. Values nothing can change (scalars, tuples and
frozen dataclasses of them: commsim/group/sharing.py) are shared, not pickled.

Arrays are the exception (`combine_arrays`, the data path of simulated collectives): the
function of every rank's array is computed once, by the last arrival, over the ranks' own
arrays (the senders are parked, so they are unchanged), and every rank gets the same
read-only result. Pickling each rank's message into every receiver cost ranks x message per
rank, ranks^2 x message in all (a 576-rank all-reduce moved gigabytes).

The scheduler (`commsim.runtime.scheduler`) is re-exported here: `from commsim.group.local
import Scheduler, wait_until` is the usual import for rank code.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable, Sequence, TypeVar

import numpy as np

from commsim.group.base import REDUCE_OPS, readonly
from commsim.group.calls import (ALL_GATHER, ALL_REDUCE, BARRIER, BROADCAST, COMBINE, NEW_SUBGROUP,
                                 called as _called, label as _label,
                                 reduce_values as _reduce)
from commsim.group.sharing import all_immutable, immutable
from commsim.runtime.diagnosis import (CollectiveMismatch, Diagnosis, GroupError, RankFailed, rank_word,
                     short_error)
from commsim.runtime.scheduler import (Event, Outcome, Scheduler, _BLOCKED, _RUNNABLE, current_rank,
                        current_scheduler, in_rank, now, sleep, wait_until, yield_now)

__all__ = [
    "LocalWorld", "LocalGroup", "Scheduler", "Outcome", "Event", "current_scheduler",
    "in_rank", "current_rank", "now", "sleep", "wait_until", "yield_now",
]

T = TypeVar("T")

_ABSENT = object()  # a round's slot for a rank that has not arrived
_PICKLE = pickle.HIGHEST_PROTOCOL


class _Core:
    """State shared by all members of one group (what the group's transport would hold)."""

    __slots__ = ("name", "global_ranks", "size", "rank_of", "rounds", "failed", "store")

    def __init__(self, name: str, global_ranks: tuple[int, ...]) -> None:
        self.name = name
        self.global_ranks = global_ranks
        self.size = len(global_ranks)
        self.rank_of = {w: g for g, w in enumerate(global_ranks)}  # world rank -> group rank
        self.rounds: dict[int, _Round] = {}
        self.failed: dict[int, BaseException] = {}  # world rank -> why it died
        self.store: dict[str, _StoreKey] = {}       # keyed exchanges in progress

    def open_waits(self) -> list["_Round | _StoreKey"]:
        """Every round and keyed exchange some member is parked in."""
        return list(self.rounds.values()) + list(self.store.values())


class _Round:
    """The meeting of the members' seq-th collective in a group."""

    __slots__ = ("core", "seq", "kind", "param", "tag", "values", "count", "waiters",
                 "result", "blob", "broken", "calls", "shown")

    def __init__(self, core: _Core, seq: int, kind: str, param: Any, tag: str) -> None:
        self.core = core
        self.seq = seq
        self.kind = kind
        self.param = param
        self.tag = tag  # the first arriver's; each rank's own tag is on its rank record
        self.values: list[Any] = [_ABSENT] * core.size
        self.count = 0
        self.waiters: list[Any] = []  # scheduler rank records parked here
        self.result: Any = None
        self.blob = False  # result is a pickle each receiver loads
        # Once broken, later arrivals fail at once: (exception class, message).
        self.broken: tuple[type[GroupError], str] | None = None
        self.calls: list[tuple[int, str, str]] = []  # (world rank, call, tag), on mismatch
        self.shown: list[tuple[int, str]] = []       # (world rank, the call as the program made it)

    @property
    def group_name(self) -> str:
        return self.core.name

    def arrivals(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """World ranks that arrived and that did not."""
        gr = self.core.global_ranks
        arrived = tuple(gr[i] for i, v in enumerate(self.values) if v is not _ABSENT)
        missing = tuple(gr[i] for i, v in enumerate(self.values) if v is _ABSENT)
        return arrived, missing

    def withdraw(self, rec: Any, exc: BaseException) -> None:
        """A parked rank leaves with an error (timeout, hang, peer failure); the round can
        no longer complete, so later arrivals are told instead of parking."""
        self.values[rec.grank] = _ABSENT
        self.count -= 1
        self.waiters.remove(rec)
        if self.broken is None:
            cls = type(exc) if isinstance(exc, GroupError) else GroupError
            self.broken = (cls, f"rank {rec.rank} gave up on it with {type(exc).__name__}")


class _StoreKey:
    """One keyed exchange in a group's store: members post under `key` and wait until every
    member has posted. Unlike a _Round it has no sequence number: ranks meet by key, as they
    do through a TCPStore (PyTorch's symmetric-memory rendezvous), so ranks that compute
    different keys never meet and wait for each other until the hang is diagnosed.
    Quacks like a _Round for the scheduler's diagnosis (group_name, seq, kind, arrivals)."""

    __slots__ = ("core", "key", "seq", "kind", "tag", "values", "count", "waiters", "taken",
                 "broken")

    def __init__(self, core: _Core, key: str, tag: str) -> None:
        self.core = core
        self.key = key
        self.seq = 0          # shown as '#0': a store key has no collective sequence number
        self.kind = f"exchange(key={key!r})"
        self.tag = tag
        self.values: list[Any] = [_ABSENT] * core.size
        self.count = 0
        self.waiters: list[Any] = []
        self.taken = 0        # members that read the result; the key is dropped after the last
        self.broken: tuple[type[GroupError], str] | None = None

    @property
    def group_name(self) -> str:
        return self.core.name

    def arrivals(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        gr = self.core.global_ranks
        return (tuple(gr[i] for i, v in enumerate(self.values) if v is not _ABSENT),
                tuple(gr[i] for i, v in enumerate(self.values) if v is _ABSENT))

    def withdraw(self, rec: Any, exc: BaseException) -> None:
        self.waiters.remove(rec)
        if self.broken is None:
            cls = type(exc) if isinstance(exc, GroupError) else GroupError
            self.broken = (cls, f"rank {rec.rank} gave up on it with {type(exc).__name__}")


def _check_timeout(timeout: float | None) -> None:
    if timeout is not None and timeout < 0:
        raise ValueError(f"negative timeout {timeout}")


class LocalGroup:
    """One rank's handle on a group (implements commsim.group.base.Group). Each rank has its
    own handle; using another rank's handle is an error, as it would be across processes."""

    __slots__ = ("_core", "_rank", "_world_rank", "_seq", "_sched", "_world")

    def __init__(self, core: _Core, rank: int, world: "LocalWorld") -> None:
        self._core = core
        self._rank = rank
        self._world_rank = core.global_ranks[rank]
        self._seq = 0
        self._world = world
        self._sched = world.scheduler

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._core.size

    @property
    def name(self) -> str:
        return self._core.name

    @property
    def global_ranks(self) -> tuple[int, ...]:
        return self._core.global_ranks

    @property
    def world_rank(self) -> int:
        return self._world_rank

    def __repr__(self) -> str:
        return (f"LocalGroup({self._core.name!r}, rank={self._rank}, size={self._core.size}, "
                f"world_rank={self._world_rank})")

    # ---- collectives -------------------------------------------------------------------

    def barrier(self, *, timeout: float | None = None, tag: str = "") -> None:
        self._collective(BARRIER, True, None, timeout, tag)

    def all_gather_object(self, obj: Any, *, timeout: float | None = None,
                          tag: str = "") -> list[Any]:
        return self._collective(ALL_GATHER, obj, None, timeout, tag)

    def broadcast_object(self, obj: Any, src: int, *, timeout: float | None = None,
                         tag: str = "") -> Any:
        if not 0 <= src < self._core.size:
            raise ValueError(f"broadcast_object: src {src} is not a rank of group "
                             f"{self._core.name!r} (size {self._core.size})")
        return self._collective(BROADCAST, obj, src, timeout, tag)

    def all_reduce_object(self, value: T, op: str, *, timeout: float | None = None,
                          tag: str = "") -> T:
        if op not in REDUCE_OPS:
            raise ValueError(f"all_reduce_object: op {op!r} is not one of {REDUCE_OPS}")
        return self._collective(ALL_REDUCE, value, op, timeout, tag)

    def combine_arrays(self, arr: np.ndarray, fn: Callable[..., np.ndarray], args: tuple = (), *,
                       timeout: float | None = None, tag: str = "") -> np.ndarray:
        """fn([every rank's arr], *args), computed once by the last arrival over the ranks'
        own arrays (no copy: the others are parked until then), shared read-only by every
        rank. fn and args (hashable) are matched like an all_reduce's op."""
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"combine_arrays: arr is a {type(arr).__name__}, not a numpy array")
        return self._collective(COMBINE, arr, (fn, tuple(args)), timeout, tag)

    def exchange(self, key: str, obj: Any, *, timeout: float | None = None,
                 tag: str = "") -> list[Any]:
        """Post obj under `key` in the group's store and return every member's object once
        all have posted (a store-based all-gather, keyed rather than sequenced)."""
        sched = self._sched
        rec = sched._current
        if rec is None or rec.rank != self._world_rank or sched._in_pred:
            raise GroupError(self._wrong_context("exchange", rec))
        if sched._abort is not None:
            sched._aborted(rec)
        if timeout is not None:
            _check_timeout(timeout)
        core = self._core
        sched.trace.append(("exchange", rec.rank, core.name, key, tag))
        slot = core.store.get(key)
        if slot is None:
            slot = core.store[key] = _StoreKey(core, key, tag)
        if slot.values[self._rank] is not _ABSENT:
            raise GroupError(f"group {core.name!r} exchange: rank {self._world_rank} posted key "
                             f"{key!r} twice; each exchange needs a fresh key")
        if core.failed:
            raise self._peer_failed(slot, slot.kind, 0, tag)
        if slot.broken is not None:
            cls, why = slot.broken
            raise cls(f"group {core.name!r} {slot.kind} (tag {slot.tag!r}) was abandoned ({why})")
        try:
            # By value, as through a store; immutable scalars need no copy.
            slot.values[self._rank] = (False, obj) if immutable(obj) else (
                True, pickle.dumps(obj, _PICKLE))
        except Exception as exc:
            raise GroupError(f"group {core.name!r} {slot.kind}: the object of rank "
                             f"{self._world_rank} does not pickle: {short_error(exc)}") from exc
        slot.count += 1
        if slot.count == core.size:
            self._wake(slot.waiters)
        else:
            self._park(rec, slot, timeout, tag)
        slot.taken += 1
        if slot.taken == core.size:
            del core.store[key]
        return [pickle.loads(v) if blob else v for blob, v in slot.values]

    def new_subgroup(self, ranks: Sequence[int], name: str, *, timeout: float | None = None,
                     tag: str = "") -> "LocalGroup | None":
        spec = tuple(int(r) for r in ranks)
        if not spec or len(set(spec)) != len(spec) or not all(
                0 <= r < self._core.size for r in spec):
            raise ValueError(f"new_subgroup {name!r}: ranks {list(spec)} must be distinct ranks "
                             f"of group {self._core.name!r} (size {self._core.size})")
        return self._collective(NEW_SUBGROUP, None, (spec, name), timeout,
                                tag or f"new_subgroup {name!r}")

    def _collective(self, kind: str, obj: Any, param: Any, timeout: float | None,
                    tag: str) -> Any:
        sched = self._sched
        rec = sched._current
        if rec is None or rec.rank != self._world_rank or sched._in_pred:
            raise GroupError(self._wrong_context(kind, rec))
        if sched._abort is not None:
            sched._aborted(rec)
        if timeout is not None:
            _check_timeout(timeout)
        core = self._core
        seq = self._seq
        self._seq = seq + 1
        sched.trace.append((kind, rec.rank, core.name, seq, tag))
        if core.failed:
            raise self._peer_failed(core.rounds.get(seq), kind, seq, tag)
        rounds = core.rounds
        rnd = rounds.get(seq)
        if rnd is None:
            rnd = rounds[seq] = _Round(core, seq, kind, param, tag)
        elif rnd.broken is not None or rnd.kind != kind or rnd.param != param:
            raise self._bad_round(rnd, kind, param, tag)
        rnd.values[self._rank] = obj
        rnd.count += 1
        if rnd.count == core.size:
            del rounds[seq]
            self._complete(rnd)
            self._wake(rnd.waiters)
        else:
            self._park(rec, rnd, timeout, tag)
        if kind == BARRIER:
            return None
        if rnd.blob:
            return pickle.loads(rnd.result)
        if kind == ALL_GATHER:
            return list(rnd.result)
        if kind == NEW_SUBGROUP:
            sub: _Core = rnd.result
            mine = sub.rank_of.get(self._world_rank)
            return None if mine is None else self._world._handle(sub, mine)
        return rnd.result

    def _wake(self, waiters: list[Any]) -> None:
        """The last arrival completes the meeting: every parked member becomes runnable."""
        runnable = self._sched._runnable
        for w in waiters:
            w.state = _RUNNABLE
            w.token += 1
            runnable.append(w)

    def _park(self, rec: Any, blocker: "_Round | _StoreKey", timeout: float | None,
              tag: str) -> None:
        """Wait in `blocker` until the last member arrives; raises what a timeout, hang or
        peer failure injected."""
        sched = self._sched
        rec.state = _BLOCKED
        rec.blocker = blocker
        rec.grank = self._rank
        rec.tag = tag
        rec.timeout = timeout
        blocker.waiters.append(rec)
        if timeout is not None:
            sched._add_timer(rec, sched._now + timeout)
        sched._block(rec)

    def _complete(self, rnd: _Round) -> None:
        """Compute the round's result once, for every receiver."""
        kind = rnd.kind
        if kind == BARRIER:
            return
        try:
            if kind == NEW_SUBGROUP:
                spec, name = rnd.param
                gr = self._core.global_ranks
                rnd.result = self._world._new_core(name, tuple(gr[r] for r in spec))
                return
            if kind == COMBINE:
                fn, args = rnd.param
                rnd.result = readonly(fn(list(rnd.values), *args))
                return
            if kind == ALL_GATHER:
                data: Any = rnd.values
                scalar = all_immutable(data)
            else:
                data = rnd.values[rnd.param] if kind == BROADCAST else _reduce(
                    rnd.param, rnd.values)
                scalar = immutable(data)
            if scalar:
                rnd.result = data
            else:
                rnd.result = pickle.dumps(data, _PICKLE)
                rnd.blob = True
        except Exception as exc:
            self._fail_round(rnd, exc)

    def _fail_round(self, rnd: _Round, exc: Exception) -> None:
        """The result could not be built (an object does not pickle, values do not reduce):
        every member learns why, naming the rank(s) whose object is at fault."""
        bad = []
        if rnd.kind != COMBINE and isinstance(exc, (pickle.PicklingError, TypeError, AttributeError)):
            for i, v in enumerate(rnd.values):
                try:
                    pickle.dumps(v, _PICKLE)
                except Exception:
                    bad.append(self._core.global_ranks[i])
        who = f" (the object of {rank_word(bad)} does not pickle)" if bad else ""
        msg = (f"group {self._core.name!r} collective #{rnd.seq} {_label(rnd.kind, rnd.param)} "
               f"(tag {rnd.tag!r}) failed{who}: {short_error(exc)}")
        for w in list(rnd.waiters):
            err = GroupError(msg)
            err.__cause__ = exc
            self._sched._interrupt(w, err)
        raise GroupError(msg) from exc

    # ---- errors ------------------------------------------------------------------------

    def _wrong_context(self, kind: str, rec: Any) -> str:
        where = f"group {self._core.name!r} {kind}"
        if self._sched._in_pred:
            return f"{where} called inside a wait_until predicate; predicates must not block"
        if rec is None:
            return f"{where} called outside a rank (no scheduler is running this code)"
        return (f"{where}: handle of rank {self._world_rank} used by rank {rec.rank}; each "
                f"rank must use its own handle (LocalWorld.group(rank))")

    def _bad_round(self, rnd: _Round, kind: str, param: Any, tag: str) -> GroupError:
        """An arrival that cannot join the round: a mismatch, or a round already broken."""
        me = self._sched._current.rank
        core = self._core
        if rnd.broken is not None and not rnd.calls:
            cls, why = rnd.broken
            arrived, missing = rnd.arrivals()
            msg = (f"group {core.name!r} collective #{rnd.seq} {_label(rnd.kind, rnd.param)} "
                   f"(tag {rnd.tag!r}) was abandoned ({why}); rank {me} arrived at "
                   f"t={self._sched.now:g}, too late")
            return cls(msg)
        if not rnd.calls:  # first mismatch in this round: record who called what so far
            gr = core.global_ranks
            first = _label(rnd.kind, rnd.param)
            rnd.calls = [(gr[i], first, rnd.tag) for i, v in enumerate(rnd.values)
                         if v is not _ABSENT]
            rnd.shown = [(r, _called(rnd.kind, rnd.param, rnd.tag)) for r, _, _ in rnd.calls]
        rnd.calls.append((me, _label(kind, param), tag))
        rnd.shown.append((me, _called(kind, param, tag)))
        merged: dict[str, list[int]] = {}
        for r, call in rnd.shown:
            merged.setdefault(call, []).append(r)
        parts = [f"{rank_word(rs)} called {call}" for call, rs in merged.items()]
        msg = f"collective mismatch in group {core.name!r} #{rnd.seq}: " + "; ".join(parts)
        calls = tuple(rnd.calls)
        if rnd.broken is None:
            rnd.broken = (CollectiveMismatch, msg)
            for w in list(rnd.waiters):
                self._sched._interrupt(w, CollectiveMismatch(msg, calls))
        return CollectiveMismatch(msg, calls)

    def _peer_failed(self, rnd: _Round | None, kind: str, seq: int, tag: str) -> RankFailed:
        sched = self._sched
        core = self._core
        failed = tuple(core.failed.items())
        if rnd is not None:
            arrived, missing = rnd.arrivals()
        else:
            arrived, missing = (), tuple(r for r in core.global_ranks)
        me = sched._current.rank
        arrived = tuple(sorted(set(arrived) | {me}))
        missing = tuple(r for r in missing if r != me)
        d = Diagnosis("rank failed", sched.rank_states(), sched.now, group=core.name, seq=seq,
                      collective=kind, tag=tag, arrived=arrived, missing=missing,
                      failed=failed)
        r0, e0 = failed[0]
        return RankFailed(d.message(), d, r0, e0)


class LocalWorld:
    """`size` in-process ranks with a world group, run by a seeded Scheduler.

    world = LocalWorld(8, seed=1)
    outcomes = world.run(lambda g: g.all_gather_object(g.rank))
    """

    def __init__(self, size: int, seed: int, *, max_steps: int = 10_000_000,
                 max_hang_rounds: int = 8, name: str = "world") -> None:
        if size < 1:
            raise ValueError(f"LocalWorld: size must be >= 1, got {size}")
        self.size = size
        self.scheduler = Scheduler(seed, max_steps=max_steps, max_hang_rounds=max_hang_rounds)
        self.scheduler.failure_hooks.append(self._rank_failed)
        self._cores_of: list[list[_Core]] = [[] for _ in range(size)]
        core = self._new_core(name, tuple(range(size)))
        self._world = [LocalGroup(core, r, self) for r in range(size)]
        self._shared: dict[str, _Core] = {}

    def group(self, rank: int) -> LocalGroup:
        """The world group handle of `rank` (the same object on every call)."""
        return self._world[rank]

    def shared_group(self, key: str, name: str, global_ranks: Sequence[int],
                     rank: int) -> LocalGroup:
        """`rank`'s handle on a group made without a collective of its own: every member
        asking for `key` gets a handle on the same group. For callers whose members already
        agreed on the membership (MPI's Comm.Split settles it with an all-gather)."""
        members = tuple(int(r) for r in global_ranks)
        core = self._shared.get(key)
        if core is None:
            core = self._shared[key] = self._new_core(name, members)
        elif core.global_ranks != members:
            raise GroupError(f"shared group {name!r}: rank {members[rank]} asked for members "
                             f"{list(members)}, the group has {list(core.global_ranks)}")
        return LocalGroup(core, rank, self)

    def run(self, fn: Callable[[LocalGroup], T]) -> list[Outcome[T]]:
        """Run fn(world.group(rank)) as every rank."""
        return self.scheduler.run([lambda h=h: fn(h) for h in self._world])

    @property
    def trace(self) -> list[tuple]:
        return self.scheduler.trace

    def trace_hash(self) -> str:
        return self.scheduler.trace_hash()

    def _new_core(self, name: str, global_ranks: tuple[int, ...]) -> _Core:
        core = _Core(name, global_ranks)
        for w in global_ranks:
            self._cores_of[w].append(core)
        return core

    def _handle(self, core: _Core, rank: int) -> LocalGroup:
        return LocalGroup(core, rank, self)

    def _rank_failed(self, rank: int, exc: BaseException) -> None:
        """A rank died: every open round of its groups that waits for it fails now with
        RankFailed naming it (as a real peer's connection would drop), and later collectives
        of those groups fail at once."""
        sched = self.scheduler
        for core in self._cores_of[rank]:
            core.failed[rank] = exc
            for rnd in core.open_waits():
                if rnd.broken is not None or not rnd.waiters:
                    continue
                arrived, missing = rnd.arrivals()
                d = Diagnosis("rank failed", sched.rank_states(), sched.now, group=core.name,
                              seq=rnd.seq, collective=rnd.kind, tag=rnd.tag, arrived=arrived,
                              missing=missing, failed=((rank, exc),))
                rnd.broken = (RankFailed, f"rank {rank} failed with {short_error(exc)}")
                for w in list(rnd.waiters):
                    sched._interrupt(w, RankFailed(d.message(), d, rank, exc))
