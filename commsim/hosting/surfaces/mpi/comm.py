"""mpi4py.MPI.Comm as a hosted rank sees it: communicators, their collectives and messages.

Semantics follow mpi4py's documentation (mpi4py.readthedocs.io, "Tutorial" and the
mpi4py.MPI.Comm reference): the all-lowercase methods move picklable Python objects by value
and return them; "collective calls like scatter(), gather(), allgather(), alltoall() expect
a single value or a sequence of Comm.size elements at the root or all process. They return
a single value, a list of Comm.size elements, or None". Split / Split_type follow Open MPI's
MPI_Comm_split(3) / MPI_Comm_split_type(3) man pages. Errors are `MPI.Exception` with Open
MPI's error classes (mpi.h), as mpi4py raises them (it installs MPI_ERRORS_RETURN-like
handling on COMM_WORLD/COMM_SELF so errors surface as exceptions, mpi4py docs "mpi4py.rc:
errors").

Every collective crosses the communicator as one all-gather of (call, parameters, payload),
so each member checks that all members made the same call: a mismatch (rank 0 in bcast, rank
1 in allgather) is an error naming who called what, where real MPI would hang or garble
data. A rank that never arrives is the transport's diagnosis (wire/ranks.py).
"""

from __future__ import annotations

from typing import Any

from commsim.runtime.diagnosis import CollectiveMismatch, rank_word
from commsim.hosting.install.dispatch import not_simulated
from commsim.hosting.state.session import current, user_site
from commsim.hosting.surfaces.mpi import buffers
from commsim.hosting.surfaces.mpi.ops import SUM, as_op
from commsim.hosting.surfaces.mpi.results import (ANY_SOURCE, ANY_TAG, COMM_TYPE_SHARED, ERR_ARG, ERR_COMM,
                                                  ERR_OTHER, ERR_RANK, ERR_ROOT, ERR_TAG, OMPI_COMM_TYPE_HOST,
                                                  PROC_NULL, UNDEFINED, Exception, Request, Status)
from commsim.hosting.surfaces.mpi.world import Handle, RankMPI, rank_state

def _site() -> str:
    return user_site(2, 1)


# mpi4py.MPI.Comm methods the hosted surface knows but does not simulate: calling them
# says so.
COMM_NAMES = frozenset("""
    Abort Ack_failed Agree Allgatherv Alltoall Alltoallv Alltoallw Bsend Call_errhandler
    Compare Create Create_cart Create_graph Create_group Create_intercomm Disconnect
    Dup_with_info Gather Gatherv Get_attr Get_errhandler Get_group Get_info Get_parent
    Get_topology Iallgather Iallreduce Ibarrier Ibcast Igather Improbe Iprobe Ireduce
    Iscatter Mprobe Probe Reduce Reduce_scatter Reduce_scatter_block Rsend Scatter
    Scatterv Sendrecv Set_attr Set_errhandler Set_info Set_name Ssend Split_type_with_info
    exscan iprobe mprobe probe scan ibsend issend ssend bsend""".split())

class Comm:
    """mpi4py.MPI.Comm. `_h` is COMM_NULL (None), "world"/"self" (COMM_WORLD / COMM_SELF:
    module-level objects every inproc rank shares, resolved for the calling rank), or the
    Handle of the rank that created it."""

    def __init__(self, comm: "Comm | None" = None) -> None:
        self._h: Any = None if comm is None else comm._h

    # ---- identity -----------------------------------------------------------------------
    def _handle(self, what: str) -> Handle:
        h = self._h
        if h is None:
            raise Exception(ERR_COMM, f"{what} on MPI.COMM_NULL")
        st = rank_state()
        if st.finalized:
            # UNCONFIRMED: Open MPI reports a call after MPI_Finalize and aborts; here the
            # call raises, naming it.
            raise Exception(ERR_OTHER, f"{what} called after MPI.Finalize()")
        if h == "world":
            return st.world
        if h == "self":
            return st.self_
        if h.st is not st:
            raise RuntimeError(f"commsim hosting: {what}: this communicator was created by rank "
                               f"{h.st.world_rank} and is used by rank {st.world_rank} (inproc "
                               f"ranks share imported modules: keep communicators per rank)")
        return h

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Comm):
            return NotImplemented
        return self._h is other._h or self._h == other._h

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        # UNCONFIRMED whether every mpi4py version hashes communicators; hashable by handle
        # here, so a program that keys a cache by communicator runs either way.
        h = self._h
        return hash(h if h is None or isinstance(h, str) else id(h))

    def __bool__(self) -> bool:
        return self._h is not None

    def __repr__(self) -> str:
        name = {None: "COMM_NULL", "world": "COMM_WORLD", "self": "COMM_SELF"}.get(
            self._h if isinstance(self._h, (str, type(None))) else "", None)
        return f"<commsim hosted mpi4py.MPI.{type(self).__name__} {name or self._h.name}>"

    def Get_rank(self) -> int:
        return self._handle("Comm.Get_rank").rank

    def Get_size(self) -> int:
        return self._handle("Comm.Get_size").size

    rank = property(Get_rank, doc="rank of this process in the communicator")
    size = property(Get_size, doc="number of processes in the communicator")

    def Get_name(self) -> str:
        return self._handle("Comm.Get_name").name

    name = property(Get_name)

    def Is_inter(self) -> bool:
        return False

    def Is_intra(self) -> bool:
        return True

    # ---- collectives -------------------------------------------------------------------
    def _all(self, call: str, param: Any, payload: Any) -> tuple[Handle, list[Any]]:
        h = self._handle(f"Comm.{call}")
        tag = f"mpi4py.MPI.Comm.{call} on {h.name} at {_site()}"
        got = h.group.all_gather_object((call, param, payload), timeout=h.st.transport.limit(),
                                        tag=tag)
        calls = [(c, p) for c, p, _ in got]
        if any(c != calls[0] for c in calls):
            by: dict[str, list[int]] = {}
            for i, (c, p) in enumerate(calls):
                by.setdefault(c if p is None else f"{c}({p})", []).append(h.members[i])
            text = "; ".join(f"{rank_word(rs)} called {c}" for c, rs in by.items())
            raise CollectiveMismatch(f"mpi4py collective mismatch on {h.name}: {text}",
                                     tuple((h.members[i], f"{c}", tag)
                                           for i, (c, _) in enumerate(calls)))
        return h, [x for _, _, x in got]

    def _root(self, root: int, call: str) -> int:
        h = self._handle(f"Comm.{call}")
        if not isinstance(root, int) or not 0 <= root < h.size:
            raise Exception(ERR_ROOT, f"Comm.{call}(root={root!r}) on a communicator of size {h.size}")
        return root

    def barrier(self) -> None:
        self._all("barrier", None, None)

    def Barrier(self) -> None:
        self._all("Barrier", None, None)

    def allgather(self, sendobj: Any) -> list[Any]:
        return self._all("allgather", None, sendobj)[1]

    def gather(self, sendobj: Any, root: int = 0) -> list[Any] | None:
        self._root(root, "gather")
        h, got = self._all("gather", f"root={root}", sendobj)
        return got if h.rank == root else None

    def bcast(self, obj: Any = None, root: int = 0) -> Any:
        self._root(root, "bcast")
        h = self._handle("Comm.bcast")
        return self._all("bcast", f"root={root}", obj if h.rank == root else None)[1][root]

    def scatter(self, sendobj: Any = None, root: int = 0) -> Any:
        self._root(root, "scatter")
        h = self._handle("Comm.scatter")
        if h.rank == root:
            sendobj = _sequence(sendobj, h.size, "scatter")
        return self._all("scatter", f"root={root}", sendobj if h.rank == root else None)[1][root][h.rank]

    def alltoall(self, sendobj: Any) -> list[Any]:
        h = self._handle("Comm.alltoall")
        seq = _sequence(sendobj, h.size, "alltoall")
        _, got = self._all("alltoall", None, seq)
        return [got[s][h.rank] for s in range(h.size)]

    def allreduce(self, sendobj: Any, op: Any = None) -> Any:
        o = as_op(SUM if op is None else op)
        return o.fold(self._all("allreduce", f"op={o.name}", sendobj)[1])

    def reduce(self, sendobj: Any, op: Any = None, root: int = 0) -> Any:
        o = as_op(SUM if op is None else op)
        self._root(root, "reduce")
        h, got = self._all("reduce", f"op={o.name}, root={root}", sendobj)
        return o.fold(got) if h.rank == root else None

    # ---- point to point -----------------------------------------------------------------
    def _peer(self, h: Handle, peer: int, what: str, any_ok: bool) -> None:
        ok = 0 <= peer < h.size or peer == PROC_NULL or (any_ok and peer == ANY_SOURCE)
        if not isinstance(peer, int) or not ok:
            raise Exception(ERR_RANK, f"Comm.{what}: rank {peer!r} on a communicator of size {h.size}")

    def send(self, obj: Any, dest: int, tag: int = 0) -> None:
        h = self._handle("Comm.send")
        self._peer(h, dest, "send", False)
        if not isinstance(tag, int) or tag < 0:
            raise Exception(ERR_TAG, f"Comm.send(tag={tag!r}): tags are >= 0")
        if dest != PROC_NULL:
            h.st.transport.send(h.ctx, h.rank, dest, tag, obj)

    def recv(self, buf: Any = None, source: int = ANY_SOURCE, tag: int = ANY_TAG,
             status: Status | None = None) -> Any:
        h = self._handle("Comm.recv")
        self._peer(h, source, "recv", True)
        if not isinstance(tag, int) or tag < ANY_TAG:
            raise Exception(ERR_TAG, f"Comm.recv(tag={tag!r})")
        if source == PROC_NULL:          # MPI: a receive from MPI_PROC_NULL completes at once
            if status is not None:
                status.source, status.tag = PROC_NULL, ANY_TAG
            return None
        sources = list(range(h.size)) if source == ANY_SOURCE else [source]
        what = (f"mpi4py.MPI.Comm.recv(source={source}, tag={tag}) on {h.name} at {_site()}")
        src, got_tag, obj = h.st.transport.recv(h.ctx, h.rank, sources, tag, what, h.members)
        if status is not None:
            status.source, status.tag = src, got_tag
        return obj

    def isend(self, obj: Any, dest: int, tag: int = 0) -> Request:
        self.send(obj, dest, tag)
        return Request(done=True)

    def irecv(self, buf: Any = None, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        self._handle("Comm.irecv")
        return Request(lambda status: self.recv(None, source, tag, status))

    def sendrecv(self, sendobj: Any, dest: int, sendtag: int = 0, recvbuf: Any = None,
                 source: int = ANY_SOURCE, recvtag: int = ANY_TAG,
                 status: Status | None = None) -> Any:
        self.send(sendobj, dest, sendtag)
        return self.recv(None, source, recvtag, status)

    # ---- communicators ---------------------------------------------------------------------
    def _derive(self, h: Handle, color_key: list[tuple[Any, int]], my_color: Any,
                what: str) -> "Comm":
        """The communicator of `my_color` after a creating call: members ordered by key, ties
        by their rank in this communicator (MPI_Comm_split(3)); UNDEFINED gives COMM_NULL."""
        n = h.made
        h.made += 1
        out = type(self)()
        if my_color == UNDEFINED:
            return out
        mine = sorted((k, r) for r, (c, k) in enumerate(color_key) if c == my_color)
        local = tuple(r for _, r in mine)
        members = tuple(h.members[r] for r in local)
        ctx = f"{h.ctx}.{n}:{my_color}"
        name = f"{h.name}.{what}{n}[{my_color}]"
        index = local.index(h.rank)
        st: RankMPI = h.st
        out._h = Handle(st, st.transport.group(ctx, name, members, index), ctx, name, members,
                        index)
        return out

    def Split(self, color: int = 0, key: int = 0) -> "Comm":
        if not isinstance(color, int) or (color < 0 and color != UNDEFINED):
            raise Exception(ERR_ARG, f"Comm.Split(color={color!r}): colors are >= 0 or MPI.UNDEFINED")
        h, got = self._all("Split", None, (int(color), int(key)))
        return self._derive(h, got, int(color), "split")

    def Split_type(self, split_type: int, key: int = 0, info: Any = None) -> "Comm":
        r = current()
        if split_type == COMM_TYPE_SHARED:
            domain = r.shm_dir      # one shared-memory domain: the processes sharing /dev/shm
        elif split_type == OMPI_COMM_TYPE_HOST:
            domain = r.host
        elif split_type == UNDEFINED:
            domain = None
        else:
            raise NotImplementedError(f"commsim hosting: mpi4py.MPI.Comm.Split_type(split_type="
                                      f"{split_type}) is not simulated (COMM_TYPE_SHARED and "
                                      f"Open MPI's OMPI_COMM_TYPE_HOST = 9 are)")
        h, got = self._all("Split_type", None, (int(split_type), domain, int(key)))
        types = {t for t, _, _ in got if t != UNDEFINED}
        if len(types) > 1:
            # MPI_Comm_split_type(3): "all processes must provide the same split_type" (or
            # MPI_UNDEFINED).
            raise Exception(ERR_ARG, f"Comm.Split_type: members gave split types {sorted(types)}")
        domains = sorted({d for t, d, _ in got if t != UNDEFINED})
        color_key = [(UNDEFINED if t == UNDEFINED else domains.index(d), k) for t, d, k in got]
        return self._derive(h, color_key, color_key[h.rank][0], "type")

    def Dup(self, info: Any = None) -> "Comm":
        h, got = self._all("Dup", None, None)
        return self._derive(h, [(0, 0)] * h.size, 0, "dup")

    Clone = Dup

    def Free(self) -> None:
        if self._h in ("world", "self"):
            raise Exception(ERR_COMM, "Comm.Free of a predefined communicator")
        self._handle("Comm.Free")
        self._h = None       # mpi4py: the object becomes MPI.COMM_NULL

    # uppercase (buffer) methods: buffers.py
    Allgather, Allreduce, Bcast = buffers.Allgather, buffers.Allreduce, buffers.Bcast
    Send, Recv, Isend, Irecv = buffers.Send, buffers.Recv, buffers.Isend, buffers.Irecv

    def __getattr__(self, name: str) -> Any:
        if name in COMM_NAMES:
            return not_simulated(f"mpi4py.MPI.Comm.{name}")
        raise AttributeError(f"'mpi4py.MPI.{type(self).__name__}' object has no attribute {name!r}")


class Intracomm(Comm):
    """mpi4py.MPI.Intracomm: COMM_WORLD and every communicator Split/Dup make from one."""


def _sequence(obj: Any, size: int, call: str) -> list[Any]:
    try:
        seq = list(obj)
    except TypeError:
        raise TypeError(f"Comm.{call}: expecting a sequence of {size} items, got "
                        f"{type(obj).__name__}") from None
    if len(seq) != size:
        # UNCONFIRMED: mpi4py's exact wording; the condition is its documented contract.
        raise ValueError(f"Comm.{call}: expecting {size} items, got {len(seq)}")
    return seq
