"""Who is in MPI.COMM_WORLD, and what the rank's launcher told it (RESULT json)."""
import json
import os
import stat

from mpi4py import MPI

c = MPI.COMM_WORLD
out = dict(rank=int(os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("RANK")),
           world=[c.Get_rank(), c.Get_size(), c.allgather(int(os.environ.get("OMPI_COMM_WORLD_RANK")
                                                              or os.environ.get("RANK")))],
           torchrun_env=os.environ.get("RANK") if "OMPI_COMM_WORLD_RANK" in os.environ else None,
           store_host=(os.environ.get("COMMSIM_HOSTING_MPI_STORE") or "").rpartition(":")[0],
           secret_mode=None)
secret = os.path.join(os.path.dirname(os.environ["COMMSIM_HOSTING"]), "mpi-secret")
if os.path.exists(secret):
    out["secret_mode"] = oct(stat.S_IMODE(os.stat(secret).st_mode))
print("RESULT " + json.dumps(out))
