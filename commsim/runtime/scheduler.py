"""A deterministic, seeded, cooperative scheduler for in-process ranks.

Each rank runs as a greenlet. Rank code is plain synchronous Python; it gives up control only
at switch points: a blocking collective, `wait_until`, `sleep`, `yield_now`, or returning.
At every switch point the next rank to resume is drawn from `random.Random(seed)`, so a run
is a function of the seed and replays exactly; `trace_hash()` fingerprints it.

Ranks switch to each other directly (one greenlet switch per hand-off); the hub (the caller
of `run`) only gets control when a rank finishes or nothing is runnable. Then it advances
virtual time to the earliest deadline (waking sleepers, else raising GroupTimeout in the
waits that ran out) or, with no deadline pending, declares a hang: HangDetected, with a
diagnosis of every rank, is raised inside every blocked rank so each unwinds through its
`finally` blocks. Cleanup code may run collectives again; those are scheduled and diagnosed
the same way. Termination is guaranteed by `max_hang_rounds` and `max_steps`: past either,
the scheduler aborts (every further blocking call raises HangDetected at once) and, should a
rank still not finish, abandons it.

Code deep in a rank (a simulated kernel spinning on a device flag) finds the scheduler
through the module functions `current_scheduler()`, `wait_until()`, `yield_now()`, ...
"""

from __future__ import annotations

import hashlib
import heapq
import random
import threading
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Generic, NamedTuple, Sequence, TypeVar

from greenlet import GreenletExit, greenlet

from commsim.runtime import diagnosis as E
from commsim.runtime.diagnosis import Diagnosis, GroupError, GroupTimeout, HangDetected, RankState

T = TypeVar("T")

# Internal rank states (ints: compared on the hot path).
_RUNNABLE, _BLOCKED, _WAITING, _SLEEPING, _FINISHED, _FAILED = range(6)
_PARKED = (_BLOCKED, _WAITING, _SLEEPING)

# Steps a rank gets to unwind after an abort before it is abandoned.
_ABORT_BUDGET = 100_000

_tls = threading.local()  # .sched: the Scheduler running in this thread, if any


class Event(NamedTuple):
    """One trace entry. The trace stores plain tuples in this field order (cheaper than
    building a NamedTuple per event); `Scheduler.events()` returns them as Event."""

    kind: str            # collective name, or 'yield', 'wait', 'sleep', 'time', 'finish', ...
    rank: int            # world rank (-1 for scheduler events such as 'time')
    group: str | None
    seq: int | None
    tag: str | None


@dataclass(slots=True)
class Outcome(Generic[T]):
    """What one rank's function produced: `value`, or the exception in `error`."""

    rank: int
    value: T | None = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def unwrap(self) -> T:
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


class _Rank:
    """Scheduler-side record of one rank. Slots: it is touched on every switch."""

    __slots__ = ("rank", "glet", "state", "pending", "blocker", "grank", "tag", "what",
                 "pred", "deadline", "timeout", "token", "value", "error", "started")

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.glet: greenlet | None = None
        self.state = _RUNNABLE
        self.pending: BaseException | None = None  # raised in the rank when it resumes
        self.blocker: Any = None   # _BLOCKED: the collective round (see local._Round)
        self.grank = 0             # _BLOCKED: this rank's index in the blocker's group
        self.tag: str | None = None
        self.what: str | None = None
        self.pred: Callable[[], bool] | None = None
        self.deadline: float | None = None
        self.timeout: float | None = None
        self.token = 0             # bumped on every wake-up; stale timer entries mismatch
        self.value: Any = None
        self.error: BaseException | None = None
        self.started = False


class Scheduler:
    """Runs N rank functions as greenlets, interleaved by a seeded RNG. Runs once."""

    def __init__(self, seed: int, *, max_steps: int = 10_000_000,
                 max_hang_rounds: int = 8) -> None:
        self.seed = seed
        self.max_steps = max_steps
        self.max_hang_rounds = max_hang_rounds
        self.trace: list[tuple] = []
        # Called as hook(rank, exc) inside the dying rank when a rank function raises;
        # the local group layer uses it to fail peers blocked on that rank at once.
        self.failure_hooks: list[Callable[[int, BaseException], None]] = []
        self._rand = random.Random(seed).random
        self._now = 0.0
        self._steps = 0
        self._step_cap = max_steps  # max_steps, then the end of the abort's unwinding budget
        self._ranks: list[_Rank] = []
        self._runnable: list[_Rank] = []
        self._waiting: list[_Rank] = []
        self._timers: list[tuple[float, int, _Rank, int]] = []  # heap
        self._timer_seq = 0
        self._current: _Rank | None = None
        self._in_pred = False
        self._hub: greenlet | None = None
        self._fresh: _Rank | None = None   # picked by a rank, not started yet: the hub starts it
        self._alive = 0
        self._hang_rounds = 0
        self._abort: Diagnosis | None = None
        self._hard_stop = False
        self._killing = False  # unwinding abandoned ranks with GreenletExit
        self._ran = False

    # ---- running -------------------------------------------------------------------------

    def run(self, fns: Sequence[Callable[[], T]]) -> list[Outcome[T]]:
        """Run fns[i] as rank i until every rank has finished or failed."""
        if self._ran:
            raise GroupError("a Scheduler runs once; make a new one (the same seed replays)")
        if getattr(_tls, "sched", None) is not None:
            raise GroupError("Scheduler.run called while another scheduler runs in this thread")
        self._ran = True
        self._hub = greenlet.getcurrent()
        self._ranks = [_Rank(i) for i in range(len(fns))]
        for rec, fn in zip(self._ranks, fns):
            rec.glet = greenlet(partial(self._main, rec, fn))
        self._runnable = list(self._ranks)
        self._alive = len(self._ranks)
        _tls.sched = self
        try:
            while self._alive:
                rec, self._fresh = (self._fresh or self._pick()), None
                if rec is None:
                    self._stall()
                    continue
                self._current = rec
                rec.glet.switch()  # returns when a rank finishes or nothing is runnable
                self._current = None
        finally:
            _tls.sched = None
            self._current = None
        return [Outcome(r.rank, r.value, r.error) for r in self._ranks]

    def run_ranks(self, world_size: int, fn: Callable[[int], T]) -> list[Outcome[T]]:
        """Run fn(rank) for rank in range(world_size)."""
        return self.run([partial(fn, r) for r in range(world_size)])

    def _main(self, rec: _Rank, fn: Callable[[], Any]) -> None:
        rec.started = True
        try:
            err = rec.pending
            if err is not None:  # aborted before it ever ran
                rec.pending = None
                raise err
            value = fn()
        except Exception as exc:
            rec.state = _FAILED
            rec.error = exc
            self._alive -= 1
            self.trace.append(("fail", rec.rank, None, None, type(exc).__name__))
            for hook in self.failure_hooks:
                hook(rec.rank, exc)
        else:
            rec.state = _FINISHED
            rec.value = value
            self._alive -= 1
            self.trace.append(("finish", rec.rank, None, None, None))
        # returning switches to the hub (the greenlet's parent)

    # ---- the switch --------------------------------------------------------------------

    def _pick(self) -> _Rank | None:
        """Draw the next rank to resume among runnable ranks and waiters whose predicate now
        holds; None when there is none. Waiters are drawn like runnable ranks and their
        predicate checked only when drawn, so a waiter may resume right after its condition
        turns true or later (both interleavings are explored) and N waiters cost O(log N)
        predicate checks per switch on average rather than O(N)."""
        self._steps += 1
        if self._steps > self._step_cap and self._step_limit():
            return None
        runnable = self._runnable
        waiting = self._waiting
        nr = len(runnable)
        nw = len(waiting)
        rand = self._rand
        while True:
            n = nr + nw
            if n == 0:
                return None
            i = int(rand() * n) if n > 1 else 0
            if i < nr:
                rec = runnable[i]
                last = runnable.pop()
                if i < nr - 1:
                    runnable[i] = last
                return rec
            j = i - nr
            w = waiting[j]
            if self._check(w):
                waiting[j] = waiting[nw - 1]
                waiting[nw - 1] = waiting[-1]
                waiting.pop()
                w.state = _RUNNABLE
                w.pred = None
                w.token += 1
                return w
            # False now: move it past the end of this draw's candidates.
            nw -= 1
            waiting[j] = waiting[nw]
            waiting[nw] = w

    def _check(self, w: _Rank) -> bool:
        # The predicate runs on whichever stack is picking; make current_rank() answer for
        # the waiter, and forbid blocking inside it.
        prev = self._current
        self._current = w
        self._in_pred = True
        try:
            return bool(w.pred())  # type: ignore[misc]
        except Exception as exc:
            w.pending = exc  # resume the waiter so the predicate's error surfaces there
            return True
        finally:
            self._current = prev
            self._in_pred = False

    def _block(self, rec: _Rank) -> None:
        """Give up control; `rec` (the running rank) has registered where it waits. Returns
        when something resumed it, raising what was injected (timeout, hang, peer failure)."""
        nxt = self._pick()
        if nxt is not rec:
            if nxt is None:
                self._hub.switch()  # type: ignore[union-attr]
            elif not nxt.started:
                # A greenlet started from a rank's stack inherits that rank's recursion depth
                # (greenlet on CPython 3.11): 144 ranks each starting the next exceeded the
                # recursion limit. The hub starts fresh ranks from its own shallow stack.
                self._fresh = nxt
                self._hub.switch()  # type: ignore[union-attr]
            else:
                self._current = nxt
                nxt.glet.switch()  # type: ignore[union-attr]
        err = rec.pending
        if err is not None:
            rec.pending = None
            raise err

    def _enter(self, blocking: bool = True) -> _Rank:
        """The running rank, or an error when called outside a rank / inside a predicate."""
        rec = self._current
        if rec is None or self._in_pred:
            where = "inside a wait_until predicate" if self._in_pred else "outside a rank"
            raise GroupError(f"scheduler call {where}: only rank code may block")
        if blocking and self._abort is not None:
            self._aborted(rec)
        return rec

    def _aborted(self, rec: _Rank) -> None:
        """A blocking call after an abort raises HangDetected at once, so the rank unwinds.
        A rank that swallows it and calls again forever never switches, so these calls count
        as steps too; past the unwinding budget the rank is parked for good (the hub
        abandons it) instead of raising."""
        if self._killing:
            raise GreenletExit
        self._steps += 1
        if self._steps > self._step_cap:
            self._hard_stop = True
            self._hub.switch()  # type: ignore[union-attr]  # never resumed
        diag = self._abort
        raise HangDetected(diag.message(), diag)  # type: ignore[union-attr]

    def _add_timer(self, rec: _Rank, deadline: float) -> None:
        rec.deadline = deadline
        self._timer_seq += 1
        heapq.heappush(self._timers, (deadline, self._timer_seq, rec, rec.token))

    # ---- calls for rank code -----------------------------------------------------------

    @property
    def now(self) -> float:
        """Virtual time in seconds."""
        return self._now

    @property
    def steps(self) -> int:
        return self._steps

    @property
    def current_rank(self) -> int | None:
        rec = self._current
        return None if rec is None else rec.rank

    def yield_now(self) -> None:
        """Let the scheduler choose who runs next (possibly this rank again)."""
        rec = self._enter()
        self.trace.append(("yield", rec.rank, None, None, None))
        self._runnable.append(rec)
        self._block(rec)

    def sleep(self, seconds: float) -> None:
        """Block for `seconds` of virtual time (time moves only when nothing is runnable)."""
        if seconds < 0:
            raise ValueError(f"sleep: negative duration {seconds}")
        rec = self._enter()
        self.trace.append(("sleep", rec.rank, None, None, repr(float(seconds))))
        rec.state = _SLEEPING
        self._add_timer(rec, self._now + seconds)
        self._block(rec)

    def wait_until(self, predicate: Callable[[], bool], what: str,
                   timeout: float | None = None) -> None:
        """Block until predicate() is true; `what` describes the condition in diagnoses.
        Raises GroupTimeout after `timeout` virtual seconds, HangDetected when nothing else
        can run to make it true."""
        rec = self._enter(blocking=False)
        if predicate():
            return
        if self._abort is not None:
            self._aborted(rec)
        if timeout is not None and timeout < 0:
            raise ValueError(f"wait_until: negative timeout {timeout}")
        self.trace.append(("wait", rec.rank, None, None, what))
        rec.state = _WAITING
        rec.pred = predicate
        rec.what = what
        rec.timeout = timeout
        if timeout is not None:
            self._add_timer(rec, self._now + timeout)
        else:
            rec.deadline = None
        self._waiting.append(rec)
        self._block(rec)

    # ---- injecting errors --------------------------------------------------------------

    def _interrupt(self, rec: _Rank, exc: BaseException) -> None:
        """Make a parked rank runnable with `exc` to raise where it waits."""
        st = rec.state
        if st == _BLOCKED:
            rec.blocker.withdraw(rec, exc)
            rec.blocker = None
        elif st == _WAITING:
            self._waiting.remove(rec)
            rec.pred = None
        elif st in (_FINISHED, _FAILED):
            return
        rec.pending = exc
        if st != _RUNNABLE:
            rec.state = _RUNNABLE
            rec.token += 1
            self._runnable.append(rec)

    def _stall(self) -> None:
        """Nothing can run: move virtual time, or time out, or declare a hang."""
        if self._hard_stop:
            self._abandon()
            return
        timers = self._timers
        while timers and not self._timer_live(timers[0]):
            heapq.heappop(timers)
        if timers:
            if timers[0][0] > self._now:
                self._now = timers[0][0]
                self.trace.append(("time", -1, None, None, repr(self._now)))
            due = []
            while timers and timers[0][0] <= self._now:
                entry = heapq.heappop(timers)
                if self._timer_live(entry):
                    due.append(entry[2])
            sleepers = [r for r in due if r.state == _SLEEPING]
            if sleepers:
                # Sleepers first: one waking at the deadline may still satisfy a wait that
                # times out at the same instant. The timed waits stay due for the next stall.
                for r in sleepers:
                    r.state = _RUNNABLE
                    r.token += 1
                    self._runnable.append(r)
                for r in due:
                    if r.state != _RUNNABLE:
                        self._add_timer(r, r.deadline)  # type: ignore[arg-type]
                return
            self._deliver("timeout", due, GroupTimeout)
            return
        self._hang()

    def _timer_live(self, entry: tuple[float, int, _Rank, int]) -> bool:
        rec = entry[2]
        return rec.token == entry[3] and rec.state in _PARKED

    def _hang(self) -> None:
        parked = [r for r in self._ranks if r.state in (_BLOCKED, _WAITING)]
        if not parked:
            raise GroupError("scheduler invariant broken: ranks alive but none parked")
        self._hang_rounds += 1
        if self._hang_rounds > self.max_hang_rounds:
            note = (f"hang round {self._hang_rounds} exceeds max_hang_rounds="
                    f"{self.max_hang_rounds}; aborting")
            self._begin_abort(Diagnosis("hang", self.rank_states(), self._now, note=note))
            return
        self._deliver("hang", parked, HangDetected)

    def _deliver(self, kind: str, ranks: list[_Rank], exc: type) -> None:
        """Diagnose `ranks` together, trace each verdict, then interrupt each with `exc`
        (every trace entry first: the trace must not depend on what an interrupt runs)."""
        diags = self._diagnose_all(kind, ranks)
        for r, d in zip(ranks, diags):
            self.trace.append((kind, r.rank, d.group, d.seq, d.tag or d.what))
        for r, d in zip(ranks, diags):
            self._interrupt(r, exc(d.message(), d))

    def _step_limit(self) -> bool:
        """Past max_steps: abort once (livelock); past the abort budget: hard stop."""
        if self._abort is None:
            note = (f"{self._steps - 1} scheduler steps and ranks are still running "
                    f"(max_steps={self.max_steps})")
            self._begin_abort(Diagnosis("livelock", self.rank_states(), self._now, note=note))
            return False
        self._hard_stop = True
        return True

    def _begin_abort(self, diag: Diagnosis) -> None:
        """Raise HangDetected in every unfinished rank; from now on every blocking call
        raises at once, so each rank can only unwind."""
        self._abort = diag
        self._step_cap = self._steps + _ABORT_BUDGET
        self.trace.append(("abort", -1, None, None, diag.reason))
        for rec in self._ranks:
            if rec.state not in (_FINISHED, _FAILED):
                self._interrupt(rec, HangDetected(diag.message(), diag))

    def _abandon(self) -> None:
        """Ranks that did not unwind within the abort budget are failed without resuming."""
        for rec in self._ranks:
            if rec.state not in (_FINISHED, _FAILED):
                why = self._abort.message().split("\n", 1)[0] if self._abort else "hard stop"
                note = (f"rank {rec.rank} did not unwind within {_ABORT_BUDGET} steps after "
                        f"the abort ({why})")
                d = Diagnosis("abandoned", self.rank_states(), self._now, note=note)
                rec.state = _FAILED
                rec.error = HangDetected(d.message(), d)
                self.trace.append(("abandoned", rec.rank, None, None, None))
        self._alive = 0
        # Unwind the abandoned greenlets now, in a known state, rather than whenever the
        # garbage collector throws GreenletExit into them; every scheduler call they make on
        # the way out raises GreenletExit again, so none can switch away.
        self._killing = True
        try:
            for rec in self._ranks:
                g = rec.glet
                if g is not None and g and not g.dead:
                    try:
                        g.throw(GreenletExit)
                    except GreenletExit:
                        pass
        finally:
            self._killing = False

    # ---- diagnosis ---------------------------------------------------------------------

    def rank_states(self) -> tuple[RankState, ...]:
        """Where every rank is now."""
        out = []
        for rec in self._ranks:
            st = rec.state
            if st == _BLOCKED:
                b = rec.blocker
                until = rec.deadline if rec.timeout is not None else None
                out.append(RankState(rec.rank, E.BLOCKED, group=b.group_name, seq=b.seq,
                                     collective=b.kind, tag=rec.tag, until=until))
            elif st == _WAITING:
                until = rec.deadline if rec.timeout is not None else None
                out.append(RankState(rec.rank, E.WAITING, what=rec.what, until=until))
            elif st == _SLEEPING:
                out.append(RankState(rec.rank, E.SLEEPING, until=rec.deadline))
            elif st == _FINISHED:
                out.append(RankState(rec.rank, E.FINISHED))
            elif st == _FAILED:
                out.append(RankState(rec.rank, E.FAILED, error=rec.error))
            elif rec is self._current:
                out.append(RankState(rec.rank, E.RUNNING))
            elif not rec.started:
                out.append(RankState(rec.rank, E.NOT_STARTED))
            else:
                out.append(RankState(rec.rank, E.RUNNABLE))
        return tuple(out)

    def failed_ranks(self) -> tuple[tuple[int, BaseException], ...]:
        return tuple((r.rank, r.error) for r in self._ranks
                     if r.state == _FAILED and r.error is not None)

    def _diagnose_all(self, reason: str, recs: Sequence[_Rank]) -> list[Diagnosis]:
        """One diagnosis per parked rank, computed before any is interrupted so all see the
        same picture; ranks blocked in the same collective share one."""
        states = self.rank_states()
        failed = self.failed_ranks()
        shared: dict[int, Diagnosis] = {}
        out = []
        for rec in recs:
            if rec.state == _BLOCKED:
                b = rec.blocker
                d = shared.get(id(b))
                if d is None:
                    arrived, missing = b.arrivals()
                    d = Diagnosis(reason, states, self._now, group=b.group_name, seq=b.seq,
                                  collective=b.kind, tag=b.tag, arrived=arrived,
                                  missing=missing, timeout=rec.timeout, failed=failed)
                    shared[id(b)] = d
            else:
                d = Diagnosis(reason, states, self._now, rank=rec.rank, what=rec.what,
                              timeout=rec.timeout, failed=failed)
            out.append(d)
        return out

    # ---- trace -------------------------------------------------------------------------

    def events(self) -> list[Event]:
        return [Event(*e) for e in self.trace]

    def trace_hash(self) -> str:
        return hash_trace(self.trace)


def hash_trace(trace: list[tuple]) -> str:
    """sha256 of an event sequence (each event's repr and a newline): equal for equal seeds
    and programs. One update over the joined text hashes the same bytes as one update per
    event, without two calls per event."""
    text = "\n".join(map(repr, trace))
    return hashlib.sha256((text + "\n" if trace else "").encode()).hexdigest()


# ---- module-level access for code deep inside a rank ------------------------------------

def current_scheduler() -> Scheduler | None:
    """The scheduler running in this thread, or None outside one."""
    return getattr(_tls, "sched", None)


def in_rank() -> bool:
    s = getattr(_tls, "sched", None)
    return s is not None and s._current is not None


def current_rank() -> int | None:
    """The world rank whose code is running, or None outside a rank."""
    s = getattr(_tls, "sched", None)
    return None if s is None else s.current_rank


def now() -> float:
    """Virtual time of the running scheduler (0.0 outside one)."""
    s = getattr(_tls, "sched", None)
    return 0.0 if s is None else s._now


def yield_now() -> None:
    """Cooperative yield point; a no-op outside a rank (nothing else could run)."""
    s = getattr(_tls, "sched", None)
    if s is not None and s._current is not None:
        s.yield_now()


def sleep(seconds: float) -> None:
    """Virtual sleep inside a rank; a no-op outside one (there is no virtual clock)."""
    s = getattr(_tls, "sched", None)
    if s is not None and s._current is not None:
        s.sleep(seconds)


# Process mode (commsim.group.torch_dist): the rank is a real OS process, its peers change
# shared memory concurrently, so a false predicate is polled in real time by this waiter, which
# gives up with a diagnosis (timeout, or the rank that died) instead of hanging.
_process_wait: Callable[[Callable[[], bool], str, float | None], None] | None = None


def set_process_wait(fn: Callable[[Callable[[], bool], str, float | None], None] | None) -> None:
    """Install (or remove, with None) the real-time waiter wait_until uses outside a rank."""
    global _process_wait
    _process_wait = fn


def wait_until(predicate: Callable[[], bool], what: str, timeout: float | None = None) -> None:
    """Block the running rank until predicate() holds (see Scheduler.wait_until). Outside a
    rank nothing else can run to make a false predicate true, so that is a HangDetected,
    unless a process-mode waiter is installed (then other processes can make it true)."""
    s = getattr(_tls, "sched", None)
    if s is not None and s._current is not None:
        s.wait_until(predicate, what, timeout)
        return
    if _process_wait is not None:
        if not predicate():
            _process_wait(predicate, what, timeout)
        return
    if not predicate():
        raise HangDetected(f"hang: wait_until {what!r} called outside a rank and its predicate "
                           f"is false; nothing else can run to make it true")
