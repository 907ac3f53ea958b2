"""Ranks that disagree: `calls` (rank 0 in bcast, rank 1 in allgather), `hang` (rank 0 in a
barrier, rank 1 waiting for a message rank 0 never sends), `exit` (rank 1 leaves while
rank 0 waits in a barrier)."""
import sys

from mpi4py import MPI

c = MPI.COMM_WORLD
what = sys.argv[1]
if what == "calls":
    if c.rank == 0:
        c.bcast("x", root=0)
    else:
        c.allgather("y")
elif what == "hang":
    if c.rank == 0:
        c.Barrier()
    else:
        c.recv(source=0, tag=5)
elif what == "exit":
    if c.rank == 1:
        sys.exit(3)
    c.Barrier()
