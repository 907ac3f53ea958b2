"""Symmetric-memory set-up decided rank by rank (reference §7.4, sglang's comment in §6.4):
a rank whose allocation fails gives up on the workspace and moves on, while its peers wait
for it in the store rendezvous. sglang added the BAND preflight vote and the MAX-reduced
"unavailable" flag because of exactly this hang."""

from commsim.policy import Policy

POLICY = Policy(name="symm-unvoted-setup", order=("symm", "nccl"),
                params={"max_size": 8 << 20, "agree": False})
