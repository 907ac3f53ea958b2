"""One rank's MPI: its transport, its communicators' memberships (COMM_WORLD, COMM_SELF and
those derived from them), finalisation; started on the rank's first MPI call."""

from __future__ import annotations

import os
from typing import Any

from commsim.hosting.state.process_run import process_run
from commsim.hosting.state.session import HostedRank, current
from commsim.hosting.wire.ranks import InprocTransport, SoloGroup, SoloTransport, Transport, procs_transport

KEY = "mpi4py"


class Handle:
    """One rank's membership of one communicator."""

    __slots__ = ("st", "group", "ctx", "name", "members", "rank", "made")

    def __init__(self, st: Any, group: Any, ctx: str, name: str, members: tuple[int, ...],
                 rank: int) -> None:
        self.st = st                # the rank's MPI state (RankMPI)
        self.group = group
        self.ctx = ctx              # context id, the same on every member
        self.name = name
        self.members = members      # world rank of each communicator rank
        self.rank = rank
        self.made = 0               # communicators created from this one so far

    @property
    def size(self) -> int:
        return len(self.members)


class RankMPI:
    """One rank's MPI: its transport, COMM_WORLD and COMM_SELF, finalisation."""

    def __init__(self, r: HostedRank, transport: Transport) -> None:
        self.world_rank = r.rank
        self.transport = transport
        self.world: Handle = None       # type: ignore[assignment]
        self.self_: Handle = None       # type: ignore[assignment]
        self.finalized = False


def by_mpirun(r: HostedRank) -> bool:
    size, rank = os.environ.get("OMPI_COMM_WORLD_SIZE"), os.environ.get("OMPI_COMM_WORLD_RANK")
    return (size is not None and rank is not None and r.slot < r.world_size
            and size == str(r.world_size) and rank == str(r.rank))


def _start(r: HostedRank) -> RankMPI:
    if not by_mpirun(r):
        r.events.note("mpi4py: this process was not started by mpirun, so MPI.COMM_WORLD is "
                      "this process alone (singleton MPI_Init); use --launcher mpirun")
        t: Transport = SoloTransport(r.rank)
        members, me = (r.rank,), 0
    elif r.mode == "inproc":
        t = InprocTransport(r.world)
        members, me = tuple(range(r.world_size)), r.rank
    else:
        run = process_run()
        t = procs_transport(r.rank, r.world_size, run.run_dir, run.timeout)
        members, me = tuple(range(r.world_size)), r.rank
    st = RankMPI(r, t)
    st.world = Handle(st, t.group("w", "MPI_COMM_WORLD", members, me), "w", "MPI_COMM_WORLD",
                      members, me)
    st.self_ = Handle(st, SoloGroup("MPI_COMM_SELF", r.rank), f"self{r.rank}", "MPI_COMM_SELF",
                      (r.rank,), 0)
    return st


def rank_state() -> RankMPI:
    """The running rank's MPI, started on its first call (mpi4py initialises MPI at import)."""
    r = current()
    st = r.state.get(KEY)
    if st is None:
        st = r.state[KEY] = _start(r)
    return st
