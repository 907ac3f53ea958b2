"""Custom all-reduce set-up decided rank by rank, before sglang MAX-reduced its
"unavailable" flag (sglang `flashinfer_comm_fusion.py`, row G3): one rank whose IPC open fails disables the
backend locally; the others keep it, capture CUDA graphs with it and enter the collective
graph-buffer registration without that rank. sglang creates its NCCL communicator before the
custom path, so the ranks diverge first at registration; commsim sets the fallback up after
the custom path, where a simulated NCCL's init bootstrap would meet the diverged ranks
first: this policy keeps NCCL to its rules (`nccl_on_machine`, docs/lifecycle-rules.md NC13)."""

from commsim.policy import Policy

POLICY = Policy(name="ipc-unvoted-setup", order=("ipc", "nccl"),
                params={"max_size": 8 << 20, "agree": False, "nccl_on_machine": False})
