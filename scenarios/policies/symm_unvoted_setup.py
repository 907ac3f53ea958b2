"""Symmetric-memory set-up decided rank by rank (row FH2):
a rank whose allocation fails gives up on the workspace and moves on, while its peers wait
for it in the store rendezvous. sglang added the BAND preflight vote
(`_preflight_check_workspace_memory` in `flashinfer_comm_fusion.py`) and the MAX-reduced
"unavailable" flag because of exactly this hang."""

from commsim.policy import Policy

POLICY = Policy(name="symm-unvoted-setup", order=("symm", "nccl"),
                params={"max_size": 8 << 20, "agree": False})
