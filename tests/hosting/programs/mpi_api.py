"""Every served mpi4py call once; prints what each rank got (RESULT json)."""
import json
import os

import numpy as np
from mpi4py import MPI
from mpi4py.util import pkl5

c = MPI.COMM_WORLD
r, n = c.Get_rank(), c.Get_size()
out = dict(rank=r, size=n, props=[c.rank, c.size], init=MPI.Is_initialized(),
           host=MPI.Get_processor_name(),
           env={k: os.environ.get(k) for k in ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                               "OMPI_COMM_WORLD_LOCAL_RANK",
                                               "OMPI_COMM_WORLD_LOCAL_SIZE",
                                               "OMPI_COMM_WORLD_NODE_RANK", "RANK")})
out["allgather"] = c.allgather((r, MPI.Get_processor_name()))
out["bcast"] = c.bcast({"from": r, "list": [r] * 3} if r == n - 1 else None, root=n - 1)
out["gather"] = c.gather(r * r, root=0)
out["scatter"] = c.scatter([f"part{i}" for i in range(n)] if r == 1 else None, root=1)
out["alltoall"] = c.alltoall([f"{r}->{j}" for j in range(n)])
out["ops"] = [c.allreduce(r + 1, op=op) for op in (MPI.SUM, MPI.PROD, MPI.MAX, MPI.MIN)]
out["bits"] = [c.allreduce(1 << r, op=MPI.BOR), c.allreduce(r == 0, op=MPI.LAND),
               c.allreduce(r == 0, op=MPI.LOR), c.allreduce(7, op=MPI.BAND)]
out["reduce"] = c.reduce([r], op=MPI.SUM, root=0)
c.barrier()
# point to point: a ring, tags kept apart
c.send(("late", r), dest=(r + 1) % n, tag=2)
c.send(("early", r), dest=(r + 1) % n, tag=1)
st = MPI.Status()
first = c.recv(source=(r - 1) % n, tag=1, status=st)
out["p2p"] = [first, c.recv(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG), st.Get_source(), st.Get_tag()]
# communicators
host = c.Split_type(MPI.COMM_TYPE_SHARED)
node = pkl5.Intracomm(c).Split_type(split_type=9)
odd = c.Split(r % 2, key=-r)
none = c.Split(MPI.UNDEFINED if r == 0 else 0, 0)
dup = odd.Dup()
out["split_type"] = [host.Get_rank(), host.Get_size(), host.allgather(r)]
out["host_split"] = [node.rank, node.size, type(node) is pkl5.Intracomm]
out["split"] = [odd.rank, odd.size, odd.allgather(r), dup.allgather(r)]
out["null"] = [none == MPI.COMM_NULL, bool(none)]
dup.Free()
out["freed"] = dup == MPI.COMM_NULL
# buffers
a = np.full(2, r, dtype=np.int64)
g = np.zeros(2 * n, dtype=np.int64)
c.Allgather(a, g)
s = np.zeros(2, dtype=np.float64)
c.Allreduce(np.array([r, 1.0]), s, op=MPI.SUM)
b = np.arange(3, dtype=np.int32) * (r + 1)
c.Bcast([b, MPI.INT], root=0)
peer = (r + 1) % n
req = c.Isend(np.array([r, r], dtype=np.int16), dest=peer, tag=3)
got = np.zeros(2, dtype=np.int16)
c.Irecv(got, source=(r - 1) % n, tag=3).wait()
req.wait()
out["buffers"] = [g.tolist(), s.tolist(), b.tolist(), got.tolist()]
try:
    c.Scatterv(None, None)
except NotImplementedError as e:
    out["not_simulated"] = str(e)
try:
    c.bcast(1, root=n)
except MPI.Exception as e:
    out["bad_root"] = [e.Get_error_class(), str(e).split(":")[0]]
MPI.Finalize()
out["finalized"] = MPI.Is_finalized()
print("RESULT " + json.dumps(out))
