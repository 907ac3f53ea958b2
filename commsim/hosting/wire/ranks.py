"""The wire under the hosted mpi4py surface: how one rank reaches the other ranks.

A communicator is a Group (commsim.group.base) plus point-to-point mailboxes, both named by
the communicator's context id (`w` for COMM_WORLD, `w.3:1` for color 1 of its fourth
communicator-creating call...). Members agree on every id without a message of their own:
communicators are created collectively, in the same order on every member.

- inproc: the ranks are greenlets under the run's seeded scheduler. A communicator is a
  `LocalWorld.shared_group`, so a rank waiting in a collective that a peer never enters is
  the scheduler's diagnosed hang (who waits where, on whom), and a run replays per seed. A
  receive waits with the scheduler's `wait_until`: a receive nobody sends to is a hang too.
- procs: real processes. Collectives are `TorchDistGroup` rounds (keyed all-gathers with
  per-communicator sequence numbers, every value sealed with the run's HMAC secret) over the
  store the exec launcher hosts on 127.0.0.1 (kvstore.py); messages are sealed posts on a
  per-(communicator, source, destination) counter. A wait ends at the run's deadline with
  GroupTimeout naming the ranks that did not arrive, or, within POLL seconds, with
  RankFailed naming a peer whose process ended (the launcher marks it dead).
- a singleton (a process not started by mpirun, or a process a rank spawned): every
  communicator has one member; collectives answer locally, by value.
"""

from __future__ import annotations

import os
import pickle
import time
import weakref
from collections import deque
from typing import Any, Sequence

from commsim.runtime.scheduler import wait_until
from commsim.group.torch_dist import ProcessWorld
from commsim.hosting.wire.kvstore import StoreClient
from commsim.group.torch_dist import TorchDistGroup
from commsim.runtime.diagnosis import HangDetected

ANY_TAG = -1
STORE_ENV = "COMMSIM_HOSTING_MPI_STORE"    # host:port of the run's store (procs, mpirun)
T0_ENV = "COMMSIM_HOSTING_T0"              # the launcher's start, time.time()
SECRET_FILE = "mpi-secret"                 # in the run's private directory, 0600


def _copy(obj: Any) -> Any:
    """By value, as MPI's pickled messages are: the receiver never shares the sender's object."""
    return pickle.loads(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL))


class SoloGroup:
    """A one-member group (COMM_SELF, a singleton's COMM_WORLD)."""

    def __init__(self, name: str, world_rank: int) -> None:
        self.name = name
        self.rank = 0
        self.size = 1
        self.global_ranks = (world_rank,)

    def all_gather_object(self, obj: Any, *, timeout: float | None = None,
                          tag: str = "") -> list[Any]:
        return [_copy(obj)]


class Transport:
    """One rank's way to its peers; subclasses fill in groups and mailboxes."""

    solo = False

    def group(self, ctx: str, name: str, members: tuple[int, ...], index: int) -> Any:
        raise NotImplementedError

    def limit(self) -> float | None:
        """The timeout of the next wait (None: wait until the scheduler finds a hang)."""
        return None

    def send(self, ctx: str, src: int, dst: int, tag: int, obj: Any) -> None:
        raise NotImplementedError

    def recv(self, ctx: str, me: int, sources: Sequence[int], tag: int, what: str,
             members: tuple[int, ...]) -> tuple[int, int, Any]:
        raise NotImplementedError


def _match(queue: Any, tag: int) -> int | None:
    for i, (t, _) in enumerate(queue):
        if tag == ANY_TAG or t == tag:
            return i
    return None


def _first(sources: Sequence[int], queue_of: Any, tag: int) -> tuple | None:
    """(source, its queue, index) of the first message matching `tag`, trying the sources in
    order (the lowest source with a match: deterministic); None when there is none yet."""
    for s in sources:
        q = queue_of(s)
        if q:
            i = _match(q, tag)
            if i is not None:
                return s, q, i
    return None


class SoloTransport(Transport):
    solo = True

    def __init__(self, world_rank: int) -> None:
        self.world_rank = world_rank
        self.boxes: dict[tuple, deque] = {}

    def group(self, ctx: str, name: str, members: tuple[int, ...], index: int) -> Any:
        return SoloGroup(name, self.world_rank)

    def send(self, ctx: str, src: int, dst: int, tag: int, obj: Any) -> None:
        self.boxes.setdefault(ctx, deque()).append((tag, pickle.dumps(obj)))

    def recv(self, ctx: str, me: int, sources: Sequence[int], tag: int, what: str,
             members: tuple[int, ...]) -> tuple[int, int, Any]:
        q = self.boxes.get(ctx, deque())
        i = _match(q, tag)
        if i is None:
            # Nothing else can ever send to a lone process: waiting would be forever.
            raise HangDetected(f"hang: {what} in a one-process MPI job, and nothing was sent "
                               f"to it: it would wait forever")
        t, blob = q[i]
        del q[i]
        return 0, t, pickle.loads(blob)


_mailboxes: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


class InprocTransport(Transport):
    def __init__(self, local_world: Any) -> None:
        self.lw = local_world
        self.boxes = _mailboxes.setdefault(local_world, {})

    def group(self, ctx: str, name: str, members: tuple[int, ...], index: int) -> Any:
        return self.lw.shared_group(f"mpi:{ctx}", name, members, index)

    def send(self, ctx: str, src: int, dst: int, tag: int, obj: Any) -> None:
        # Eager (buffered) completion: mpi4py's pickled send of a small object returns
        # before the matching receive on Open MPI; a program must not rely on it blocking.
        self.boxes.setdefault((ctx, src, dst), deque()).append(
            (tag, pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)))

    def _find(self, ctx: str, me: int, sources: Sequence[int], tag: int) -> tuple | None:
        return _first(sources, lambda s: self.boxes.get((ctx, s, me)), tag)

    def recv(self, ctx: str, me: int, sources: Sequence[int], tag: int, what: str,
             members: tuple[int, ...]) -> tuple[int, int, Any]:
        if self._find(ctx, me, sources, tag) is None:
            wait_until(lambda: self._find(ctx, me, sources, tag) is not None, what)
        s, q, i = self._find(ctx, me, sources, tag)
        t, blob = q[i]
        del q[i]
        return s, t, pickle.loads(blob)


class ProcsTransport(Transport):
    def __init__(self, world: Any, deadline: float) -> None:
        self.pw = world            # commsim.group.torch_dist.ProcessWorld
        self.deadline = deadline   # time.time() by which every wait must have ended
        self.taken: dict[str, int] = {}
        self.pending: dict[str, list] = {}

    def limit(self) -> float | None:
        return max(self.deadline - time.time(), 0.5)

    def group(self, ctx: str, name: str, members: tuple[int, ...], index: int) -> Any:
        return TorchDistGroup(self.pw, name, f"mpi/{ctx}", members, index)

    @staticmethod
    def _key(ctx: str, src: int, dst: int) -> str:
        return f"mpi/{ctx}/p2p/{src}>{dst}"

    def send(self, ctx: str, src: int, dst: int, tag: int, obj: Any) -> None:
        self.pw.post(self._key(ctx, src, dst), (tag, obj))

    def _pull(self, key: str) -> None:
        """Move every message already posted on a channel into this rank's queue, in order."""
        pw = self.pw
        while True:
            n = self.taken.get(key, 0) + 1
            item = f"{key}/{n}"
            if not pw.store.check([item]):
                return
            blob = pw.store.get(item)
            pw.store.delete_key(item)
            self.taken[key] = n      # a forged item is refused once, not read again
            self.pending.setdefault(key, []).append(pw.seal.loads(item, blob))

    def _queue(self, ctx: str, src: int, me: int) -> list | None:
        key = self._key(ctx, src, me)
        self._pull(key)
        return self.pending.get(key)

    def _find(self, ctx: str, me: int, sources: Sequence[int], tag: int) -> tuple | None:
        return _first(sources, lambda s: self._queue(ctx, s, me), tag)

    def recv(self, ctx: str, me: int, sources: Sequence[int], tag: int, what: str,
             members: tuple[int, ...]) -> tuple[int, int, Any]:
        if self._find(ctx, me, sources, tag) is None:
            self.pw.peers = tuple(members[s] for s in sources)
            self.pw.spin(lambda: self._find(ctx, me, sources, tag) is not None, what,
                         self.limit())
        s, q, i = self._find(ctx, me, sources, tag)
        t, obj = q.pop(i)
        return s, t, obj


def procs_transport(rank: int, size: int, run_dir: str, timeout: float) -> ProcsTransport:
    """A procs-mode rank's connection to its run's store. The store's address comes in the
    environment; the secret never travels through the store: it is a 0600 file of the run's
    private directory (mkdtemp, 0700), read without following a link."""
    host, _, port = os.environ[STORE_ENV].rpartition(":")
    fd = os.open(os.path.join(run_dir, SECRET_FILE), os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        secret = f.read()
    t0 = float(os.environ.get(T0_ENV) or time.time())
    # Every wait ends before the launcher's --timeout kills the rank, so the rank itself
    # says whom it waited for.
    deadline = t0 + timeout - min(3.0, 0.25 * timeout)
    store = StoreClient(host, int(port), timeout=max(deadline - time.time(), 1.0), secret=secret)
    pw = ProcessWorld(store, rank, size, secret=secret, timeout=max(deadline - time.time(), 1.0))
    return ProcsTransport(pw, deadline)
