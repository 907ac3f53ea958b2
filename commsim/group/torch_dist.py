"""The Group interface for real processes, over torch.distributed's c10d store.

One OS process per rank. Objects cross the group by value (pickled) through the run's store:
the TCPStore the launcher (`commsim run --procs`) hosts, or, under torchrun, the store of the
gloo default process group (`ProcessWorld.from_env`). Collectives go through the store rather
than gloo's object collectives because a diagnosis needs what gloo does not give: a per-call
timeout, and, when a round cannot complete, which ranks arrived and where the others are.

Round protocol (collective #seq of a group): every member sets `<ns>/<seq>/<rank>` to
(kind, param, tag, object), then waits for all members' keys. A member that has set key seq
has finished round seq-1, so after round seq completes a rank deletes its key of seq-1: the
store holds at most two rounds per group.

Failure reports, bounded in time:
* a rank that dies: the launcher (or the rank itself, on an exception it cannot report)
  writes `dead/<rank>`; every wait polls for it each POLL seconds and raises RankFailed naming
  the rank and its last collective;
* a rank that never joins or stalls: the wait ends at its timeout (the world's default when
  the call gives none) with GroupTimeout naming the ranks that did not arrive;
* the simulator's spin waits (kernel flags, wait_until) poll shared memory in real time under
  the same rules (`ProcessWorld.install_waiter`).
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any, Callable, Sequence, TypeVar

from commsim.sim.shm import CREATE as SHM_CREATE, SHM_DIR
from commsim.group.base import REDUCE_OPS, readonly
from commsim.runtime.diagnosis import (BLOCKED, FAILED, FINISHED, NOT_STARTED, RUNNING, WAITING,
                     CollectiveMismatch, Diagnosis, GroupError, GroupTimeout, RankFailed,
                     RankState, rank_word)
from commsim.group.seal import ForgedValue, Seal, new_secret
from commsim.group.calls import (ALL_GATHER, ALL_REDUCE, BARRIER, BROADCAST, NEW_SUBGROUP,
                                 called as _called, label as _label,
                                 reduce_values as _reduce)
from commsim.runtime import scheduler

T = TypeVar("T")

POLL = 0.05            # seconds between checks for dead ranks while waiting
DEFAULT_TIMEOUT = 60.0
JOIN_MIN = 15.0        # seconds the rendezvous waits at least (see ProcessWorld.join)


class RankDied(Exception):
    """A peer process ended without reporting (killed, crashed, exited early)."""


# The store's libuv server refuses a value over 8 MiB; larger objects (the nccl backend's
# tensors) travel in chunks under `<key>#<i>`, set before the key itself so that a reader who
# sees the key finds every chunk. A chunked key's value is CHUNKED + the chunk count.
CHUNK = 4 << 20
CHUNKED = b"\x00commsim-chunked:"
MAX_CHUNKS = 1 << 12      # a forged chunk count must not make a reader ask for millions of keys


# Larger objects still (tensors of the nccl backend) cost a store round trip per reader per
# byte; with a shared-memory prefix they go through a /dev/shm file instead (one copy in, one
# read per reader) and the key holds only the file's name. The run's sweep removes leftovers.
SHM_MIN = 256 << 10
VIA_SHM = b"\x00commsim-shm:"


def _obj_path(shm_prefix: str, key: str) -> str:
    # Inside the run's private directory (commsim.sim.shm): nobody else can plant a name there.
    return f"{SHM_DIR}/{shm_prefix}/obj-{key.replace('/', '_')}"


def _put(store: Any, key: str, blob: bytes, shm_prefix: str | None = None) -> None:
    if shm_prefix is not None and len(blob) >= SHM_MIN:
        path = _obj_path(shm_prefix, key)
        try:
            fd = os.open(path, SHM_CREATE, 0o600)
        except FileExistsError:      # the same key written again: the old file is ours
            os.unlink(path)
            fd = os.open(path, SHM_CREATE, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        store.set(key, VIA_SHM + os.path.basename(path).encode())
        return
    if len(blob) <= CHUNK:
        store.set(key, blob)
        return
    n = (len(blob) + CHUNK - 1) // CHUNK
    for i in range(n):
        store.set(f"{key}#{i}", blob[i * CHUNK:(i + 1) * CHUNK])
    store.set(key, CHUNKED + str(n).encode())


def _get_all(store: Any, keys: list[str], shm_prefix: str | None = None) -> list[bytes]:
    """The raw (sealed) values of `keys`, whichever way each travelled. What the store says
    about where a value lies is only followed inside the run's directory, never through a
    symlink; what is read there is still checked by the seal."""
    out = list(store.multi_get(keys))
    for i, v in enumerate(out):
        if v.startswith(VIA_SHM):
            name = v[len(VIA_SHM):].decode(errors="replace")
            if shm_prefix is None or "/" in name or not name.startswith("obj-"):
                out[i] = b""           # refused by the seal
                continue
            try:
                fd = os.open(f"{SHM_DIR}/{shm_prefix}/{name}", os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                out[i] = b""
                continue
            with os.fdopen(fd, "rb") as f:
                out[i] = f.read()
        elif v.startswith(CHUNKED):
            try:
                n = min(int(v[len(CHUNKED):]), MAX_CHUNKS)
            except ValueError:
                n = 0
            out[i] = b"".join(store.multi_get([f"{keys[i]}#{j}" for j in range(n)]))
    return out


def _delete(store: Any, key: str, shm_prefix: str | None = None) -> None:
    if shm_prefix is not None:
        try:
            os.unlink(_obj_path(shm_prefix, key))
        except FileNotFoundError:
            pass
    if store.check([f"{key}#0"]):
        j = 0
        while store.delete_key(f"{key}#{j}"):
            j += 1
    store.delete_key(key)


def host_store(timeout: float) -> Any:
    """The run's TCPStore server, listening on 127.0.0.1 only. torch's
    server binds every interface when it makes its own socket, whatever host it is given, so
    it gets a socket already bound to loopback (master_listen_fd)."""
    import socket

    import torch.distributed as dist
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(512)
        store = dist.TCPStore("127.0.0.1", sock.getsockname()[1], is_master=True,
                              wait_for_workers=False, timeout=timedelta(seconds=timeout),
                              master_listen_fd=sock.fileno())
    except BaseException:
        sock.close()
        raise
    sock.detach()          # the server owns the fd now (it closes it with the store)
    return store


def connect_store(host: str, port: int, timeout: float,
                  join_timeout: float | None = None) -> Any:
    """A rank's client of the run's TCPStore. Connecting is part of start-up, so it gets the
    rendezvous's bound (JOIN_MIN at least, as ProcessWorld.join), not the collective timeout:
    on a loaded 2-core machine a rank can take seconds just to be scheduled, and a 3 s connect
    limit then kills a healthy rank. Once connected, store calls wait `timeout`."""
    import torch.distributed as dist
    limit = max(timeout, JOIN_MIN) if join_timeout is None else max(timeout, join_timeout)
    store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=limit))
    store.set_timeout(timedelta(seconds=timeout))
    return store


def mark_dead(store: Any, rank: int, why: str, seal: Seal) -> None:
    """Declare `rank` dead: every wait of its peers sees it within POLL seconds. The launcher
    does this when a child exits without a report; a rank does it for itself on an error.
    The mark is sealed like every other value: a death another local user writes into the
    store would otherwise end a healthy run with a false failure."""
    key = f"dead/{rank}"
    store.set(key, seal.dumps(key, str(why)))
    store.add("ndead", 1)


def last_status(store: Any, rank: int, seal: Seal) -> str:
    """Where `rank` last was, from the status board, in words."""
    key = f"status/{rank}"
    if not store.check([key]):
        return "before joining the run"
    try:
        status, group, seq, coll, tag = seal.loads(key, store.get(key))
    except ForgedValue:
        return "(its status on the store was forged)"
    if status == BLOCKED:
        return f"in group {group!r} collective #{seq} {coll} (tag {tag!r})"
    if status == WAITING:
        return f"waiting until {tag!r}"
    if status == FINISHED:
        return "after finishing"
    return f"running ({tag})" if tag else "running"


def _share_secret_on_host(store: Any, rank: int) -> tuple[bytes, str]:
    """(secret, run directory) for ranks of one host (ProcessWorld.from_env)."""
    import atexit

    from commsim.sim import shm
    if rank == 0:
        prefix = shm.new_prefix()
        atexit.register(shm.sweep, prefix)
        secret = new_secret()
        fd = shm.create(shm.segment_path(prefix, "secret"), 0)
        with os.fdopen(fd, "wb") as f:
            f.write(secret)
        store.set("prefix", prefix)
        return secret, prefix
    prefix = store.get("prefix").decode(errors="replace")   # waits for rank 0
    try:
        shm.check_run_dir(prefix)
        fd = os.open(shm.segment_path(prefix, "secret"), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise GroupError(f"rank {rank} cannot read the run's secret from {shm.SHM_DIR}/{prefix} "
                         f"({e}); ranks on several hosts need COMMSIM_RUN_SECRET set to the same "
                         f"value on every node (e.g. `export COMMSIM_RUN_SECRET=$(openssl rand "
                         f"-hex 32)`)") from None
    with os.fdopen(fd, "rb") as f:
        return f.read(), prefix


class ProcessWorld:
    """One rank's connection to its run: the store, the status board, the world group."""

    def __init__(self, store: Any, rank: int, size: int, *, secret: bytes,
                 timeout: float = DEFAULT_TIMEOUT,
                 on_collective: Callable[[str], None] | None = None,
                 shm_prefix: str | None = None) -> None:
        if not 0 <= rank < size:
            raise ValueError(f"rank {rank} is not in a world of {size}")
        self.store = store
        self.seal = Seal(secret)     # every pickle on the store is authenticated (seal.py)
        self.rank = rank
        self.size = size
        self.timeout = float(timeout)
        self.t0 = time.monotonic()
        # Called with each collective's tag before the rank arrives (fault injection: a rank
        # killed at a given step, commsim.procs.faults).
        self.on_collective = on_collective
        self._fd_taken: dict[str, int] = {}
        self.shm_prefix = shm_prefix   # large objects travel through /dev/shm files when set
        self.run_dir: str | None = None   # from_env: the private directory holding the secret
        # World ranks of the group this rank last met in: a kernel spinning on flags right
        # after waits for those peers, so only their death ends the spin early (a rank of
        # another group failing must not abort this one, as it would not in thread mode).
        self.peers: tuple[int, ...] | None = None
        self.set_status((RUNNING, None, None, None, "start"))

    @classmethod
    def from_env(cls, timeout: float = DEFAULT_TIMEOUT) -> "ProcessWorld":
        """Under torchrun: RANK, WORLD_SIZE, MASTER_ADDR/PORT from the environment; the gloo
        default process group is initialised if the program has not done so already.

        The store's secret (commsim.group.seal) never travels through the store. With
        COMMSIM_RUN_SECRET set (the same hex string on every node: a job over several hosts),
        that is the secret. Otherwise the ranks share one host: rank 0 makes a private run
        directory in /dev/shm with the secret in a 0600 file, publishes only the directory's
        name, and every rank reads the secret after checking the directory is this user's
        alone (a name forged on the store leads nowhere). `run_dir` is that directory (None
        with COMMSIM_RUN_SECRET); rank 0 removes it at exit."""
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
        store = dist.PrefixStore("commsim/", dist.distributed_c10d._get_default_store())
        rank = dist.get_rank()
        given = os.environ.get("COMMSIM_RUN_SECRET")
        if given is not None:
            try:
                secret, run_dir = bytes.fromhex(given), None
                Seal(secret)
            except ValueError:
                raise GroupError("COMMSIM_RUN_SECRET must be at least 32 hex digits, the same on "
                                 "every node, e.g. from `openssl rand -hex 32`") from None
        else:
            secret, run_dir = _share_secret_on_host(store, rank)
        world = cls(store, rank, dist.get_world_size(), secret=secret, timeout=timeout)
        world.run_dir = run_dir
        return world

    # ---- status board ------------------------------------------------------------------
    def set_status(self, st: tuple) -> None:
        self.store.set(f"status/{self.rank}", self.seal.dumps(f"status/{self.rank}", st))

    def elapsed(self) -> float:
        return round(time.monotonic() - self.t0, 3)

    def dead(self) -> dict[int, str]:
        """rank -> why, for every rank reported dead so far (one round trip when none)."""
        if self.store.add("ndead", 0) == 0:
            return {}
        out = {}
        for r in range(self.size):
            key = f"dead/{r}"
            if self.store.check([key]):
                try:
                    out[r] = str(self.seal.loads(key, self.store.get(key)))
                except ForgedValue:
                    continue          # not written by this run: no death to believe
        return out

    def mark_dead(self, rank: int, why: str) -> None:
        mark_dead(self.store, rank, why, self.seal)

    def states(self) -> tuple[RankState, ...]:
        """Where every rank is, from the board: dead, finished, in a collective, or absent."""
        dead = self.dead()
        out = []
        for r in range(self.size):
            if r in dead:
                out.append(RankState(r, FAILED, error=RankDied(dead[r])))
                continue
            if not self.store.check([f"status/{r}"]):
                out.append(RankState(r, NOT_STARTED))
                continue
            try:
                status, group, seq, coll, tag = self.seal.loads(f"status/{r}",
                                                                self.store.get(f"status/{r}"))
            except ForgedValue:
                out.append(RankState(r, RUNNING, what="(its status on the store was forged)"))
                continue
            if status == BLOCKED:
                out.append(RankState(r, BLOCKED, group=group, seq=seq, collective=coll, tag=tag))
            elif status == FINISHED:
                out.append(RankState(r, FINISHED))
            else:
                out.append(RankState(r, status, what=tag))
        return tuple(out)

    # ---- waiting ---------------------------------------------------------------------------
    def await_keys(self, keys: list[str], deadline: float,
                   on_poll: Callable[[], None]) -> bool:
        """True once every key is set; False at the deadline. on_poll runs every POLL seconds
        (it raises when a rank this wait needs has died)."""
        while True:
            left = deadline - time.monotonic()
            try:
                self.store.wait(keys, timedelta(seconds=max(min(POLL, left), 0.001)))
                return True
            except Exception:   # the store's timeout error; the type differs across versions
                pass
            on_poll()
            if time.monotonic() >= deadline:
                return self.store.check(keys)

    def _failed_ranks(self, among: Sequence[int]) -> tuple[tuple[int, BaseException], ...]:
        dead = self.dead()
        return tuple((r, RankDied(dead[r])) for r in among if r in dead)

    def spin(self, predicate: Callable[[], bool], what: str, timeout: float | None) -> None:
        """wait_until in process mode: poll shared memory in real time (with back-off, so
        peers sharing the cores can run), fail on a dead rank or at the timeout."""
        limit = self.timeout if timeout is None else timeout
        start = time.monotonic()
        deadline, next_poll, delay = start + limit, start + POLL, 0.0
        self.set_status((WAITING, None, None, None, what))
        while not predicate():
            now = time.monotonic()
            if now >= next_poll:
                next_poll = now + POLL
                among = self.peers if self.peers is not None else range(self.size)
                failed = self._failed_ranks([r for r in among if r != self.rank])
                if failed:
                    d = Diagnosis("rank failed", self.states(), self.elapsed(), rank=self.rank,
                                  what=what, failed=failed, clock="real")
                    raise RankFailed(d.message(), d, failed[0][0], failed[0][1])
            if now >= deadline:
                d = Diagnosis("timeout", self.states(), self.elapsed(), rank=self.rank, what=what,
                              timeout=limit, clock="real")
                raise GroupTimeout(d.message(), d)
            time.sleep(delay)
            delay = min(max(delay * 2, 2e-5), 2e-3)
        self.set_status((RUNNING, None, None, None, what))

    def install_waiter(self) -> None:
        scheduler.set_process_wait(self.spin)

    # ---- rendezvous, world group, fd mailbox ------------------------------------------------
    def join(self, timeout: float | None = None) -> "TorchDistGroup":
        """Rendezvous of all ranks; the world group. A rank that never joins is named. The
        default bound is the world's timeout but at least JOIN_MIN: starting processes on a
        loaded machine is not what a short collective timeout is about."""
        limit = max(self.timeout, JOIN_MIN) if timeout is None else timeout
        self.store.set(f"join/{self.rank}", str(os.getpid()))
        keys = [f"join/{r}" for r in range(self.size)]

        def poll() -> None:
            # Only a rank that has not joined holds the rendezvous up; one that joined and
            # failed afterwards (a peer giving up at its own timeout) is not the cause.
            if not self.dead():
                return
            failed = self._failed_ranks([r for r in range(self.size)
                                         if not self.store.check([f"join/{r}"])])
            if failed:
                d = Diagnosis("rank failed", self.states(), self.elapsed(), failed=failed,
                              note="during rendezvous", clock="real")
                raise RankFailed(d.message(), d, failed[0][0], failed[0][1])

        if not self.await_keys(keys, time.monotonic() + limit, poll):
            missing = [r for r in range(self.size) if not self.store.check([f"join/{r}"])]
            d = Diagnosis("timeout", self.states(), self.elapsed(), timeout=limit, clock="real",
                          note=f"{rank_word(missing)} never joined the rendezvous")
            raise GroupTimeout(d.message(), d)
        return TorchDistGroup(self, "world", "g/world", tuple(range(self.size)), self.rank)

    def post(self, key: str, value: bytes) -> None:
        n = self.store.add(f"{key}/n", 1)
        self.store.set(f"{key}/{n}", self.seal.dumps(f"{key}/{n}", value))

    def ready(self, key: str) -> bool:
        """Whether the next item under `key` has been posted."""
        return self.store.check([f"{key}/{self._fd_taken.get(key, 0) + 1}"])

    def take(self, key: str, what: str) -> bytes:
        """The next item posted under `key` (waits like wait_until)."""
        n = self._fd_taken.get(key, 0) + 1
        item = f"{key}/{n}"
        self.spin(lambda: self.store.check([item]), what, None)
        self._fd_taken[key] = n
        return self.seal.loads(item, self.store.get(item))

    def finish(self) -> None:
        self.set_status((FINISHED, None, None, None, None))
        scheduler.set_process_wait(None)


class TorchDistGroup:
    """One rank's handle on a group of real processes (commsim.group.base.Group)."""

    processes_of_their_own = True     # each rank is an OS process (backends/nccl.py asks)

    def __init__(self, world: ProcessWorld, name: str, ns: str, global_ranks: tuple[int, ...],
                 rank: int) -> None:
        self._world = world
        self._name = name
        self._ns = ns
        self._global = global_ranks
        self._rank = rank
        self._seq = 0

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return len(self._global)

    @property
    def name(self) -> str:
        return self._name

    @property
    def global_ranks(self) -> tuple[int, ...]:
        return self._global

    @property
    def world_rank(self) -> int:
        return self._global[self._rank]

    def __repr__(self) -> str:
        return f"TorchDistGroup({self._name!r}, rank={self._rank}, size={self.size})"

    def barrier(self, *, timeout: float | None = None, tag: str = "") -> None:
        self._collective(BARRIER, None, None, timeout, tag)

    def all_gather_object(self, obj: Any, *, timeout: float | None = None,
                          tag: str = "") -> list[Any]:
        return self._collective(ALL_GATHER, obj, None, timeout, tag)

    def broadcast_object(self, obj: Any, src: int, *, timeout: float | None = None,
                         tag: str = "") -> Any:
        if not 0 <= src < self.size:
            raise ValueError(f"broadcast_object: src {src} is not a rank of group "
                             f"{self._name!r} (size {self.size})")
        return self._collective(BROADCAST, obj if self._rank == src else None, src, timeout,
                                tag)[src]

    def all_reduce_object(self, value: T, op: str, *, timeout: float | None = None,
                          tag: str = "") -> T:
        if op not in REDUCE_OPS:
            raise ValueError(f"all_reduce_object: op {op!r} is not one of {REDUCE_OPS}")
        return _reduce(op, self._collective(ALL_REDUCE, value, op, timeout, tag))

    def combine_arrays(self, arr: Any, fn: Callable[..., Any], args: tuple = (), *,
                       timeout: float | None = None, tag: str = "") -> Any:
        """fn([every rank's arr], *args): each process computes it over the all-gathered
        copies (by value, as anything crossing processes is)."""
        return readonly(fn(self.all_gather_object(arr, timeout=timeout, tag=tag), *args))

    def exchange(self, key: str, obj: Any, *, timeout: float | None = None,
                 tag: str = "") -> list[Any]:
        """A store-keyed all-gather: ranks meet by `key`, not by call order (PyTorch's
        symmetric-memory rendezvous). Ranks that compute different keys never meet: the wait
        ends at the timeout naming the members whose post under this key is missing."""
        w = self._world
        base = f"{self._ns}/x/{key}/"
        # '#0', as LocalGroup shows it: a store key has no collective sequence number.
        w.set_status((BLOCKED, self._name, 0, f"exchange(key={key!r})", tag))
        w.peers = self._global
        mine = base + str(self._rank)
        _put(w.store, mine, w.seal.dumps(mine, obj), w.shm_prefix)
        keys = [base + str(r) for r in range(self.size)]
        limit = w.timeout if timeout is None else timeout
        if not w.await_keys(keys, time.monotonic() + limit,
                            lambda: self._check_dead(keys, 0, f"exchange(key={key!r})", tag)):
            arrived, missing = self._arrivals(keys)
            d = Diagnosis("timeout", w.states(), w.elapsed(), group=self._name, seq=0,
                          collective=f"exchange(key={key!r})", tag=tag, arrived=arrived,
                          missing=missing, timeout=limit, clock="real")
            raise GroupTimeout(d.message(), d)
        w.set_status((RUNNING, None, None, None, f"after exchange({key!r}) of {self._name!r}"))
        return [w.seal.loads(k, b) for k, b in zip(keys, _get_all(w.store, keys, w.shm_prefix))]

    def new_subgroup(self, ranks: Sequence[int], name: str, *, timeout: float | None = None,
                     tag: str = "") -> "TorchDistGroup | None":
        spec = tuple(int(r) for r in ranks)
        if not spec or len(set(spec)) != len(spec) or not all(0 <= r < self.size for r in spec):
            raise ValueError(f"new_subgroup {name!r}: ranks {list(spec)} must be distinct ranks "
                             f"of group {self._name!r} (size {self.size})")
        seq = self._seq
        self._collective(NEW_SUBGROUP, None, (spec, name), timeout, tag or f"new_subgroup {name!r}")
        if self._rank not in spec:
            return None
        # The namespace is unique per creation, so two subgroups of one name never share keys.
        return TorchDistGroup(self._world, name, f"{self._ns}/{seq}/{name}",
                              tuple(self._global[r] for r in spec), spec.index(self._rank))

    # ---- the round ---------------------------------------------------------------------------
    def _collective(self, kind: str, obj: Any, param: Any, timeout: float | None,
                    tag: str) -> Any:
        if timeout is not None and timeout < 0:
            raise ValueError(f"negative timeout {timeout}")
        w, store = self._world, self._world.store
        seq = self._seq
        self._seq += 1
        w.set_status((BLOCKED, self._name, seq, kind, tag))
        w.peers = self._global
        if w.on_collective is not None:      # after the status: a killed rank is found there
            w.on_collective(tag)
        base = f"{self._ns}/{seq}/"
        try:
            blob = w.seal.dumps(base + str(self._rank), (kind, param, tag, obj))
        except Exception as exc:
            raise GroupError(f"group {self._name!r} collective #{seq} {_label(kind, param)} "
                             f"(tag {tag!r}): the object of rank {self.world_rank} does not "
                             f"pickle: {exc}") from exc
        _put(store, base + str(self._rank), blob, w.shm_prefix)
        keys = [base + str(r) for r in range(self.size)]
        limit = w.timeout if timeout is None else timeout
        if not w.await_keys(keys, time.monotonic() + limit,
                            lambda: self._check_dead(keys, seq, kind, tag)):
            arrived, missing = self._arrivals(keys)
            d = Diagnosis("timeout", w.states(), w.elapsed(), group=self._name, seq=seq,
                          collective=kind, tag=tag, arrived=arrived, missing=missing,
                          timeout=limit, clock="real")
            raise GroupTimeout(d.message(), d)
        vals = [w.seal.loads(k, b) for k, b in zip(keys, _get_all(store, keys, w.shm_prefix))]
        if seq > 0:
            _delete(store, f"{self._ns}/{seq - 1}/{self._rank}", w.shm_prefix)
        calls = {(k, repr(p)) for k, p, _, _ in vals}
        if len(calls) > 1:
            merged: dict[str, list[int]] = {}
            for r, (k, p, t, _) in enumerate(vals):
                merged.setdefault(_called(k, p, t), []).append(self._global[r])
            parts = [f"{rank_word(rs)} called {c}" for c, rs in merged.items()]
            raise CollectiveMismatch(f"collective mismatch in group {self._name!r} #{seq}: "
                                     + "; ".join(parts),
                                     [(self._global[r], _label(k, p), t)
                                      for r, (k, p, t, _) in enumerate(vals)])
        w.set_status((RUNNING, None, None, None, f"after {kind} #{seq} of {self._name!r} ({tag})"))
        return [v[3] for v in vals]

    def _arrivals(self, keys: list[str]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        store = self._world.store
        got = [store.check([k]) for k in keys]
        return (tuple(self._global[i] for i, g in enumerate(got) if g),
                tuple(self._global[i] for i, g in enumerate(got) if not g))

    def _check_dead(self, keys: list[str], seq: int, kind: str, tag: str) -> None:
        w = self._world
        if not w.dead():
            return
        arrived, missing = self._arrivals(keys)
        failed = w._failed_ranks(missing)
        if failed:
            d = Diagnosis("rank failed", w.states(), w.elapsed(), group=self._name, seq=seq,
                          collective=kind, tag=tag, arrived=arrived, missing=missing,
                          failed=failed, clock="real")
            raise RankFailed(d.message(), d, failed[0][0], failed[0][1])
