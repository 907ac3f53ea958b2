"""Read once, at import, as many libraries do: the rank's LOCAL_RANK, CUDA_VISIBLE_DEVICES and
hostname, and whether a hosted rank imported it (not the procs-mode zygote, which imports a
program's module only when the run opts it in)."""

import os
import socket

LOCAL_RANK = os.environ.get("LOCAL_RANK")
CUDA_VISIBLE_DEVICES = os.environ.get("CUDA_VISIBLE_DEVICES")
HOSTNAME = socket.gethostname()
IN_RANK = bool(os.environ.get("COMMSIM_HOSTING"))
