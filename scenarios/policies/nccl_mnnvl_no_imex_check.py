"""NCCL left to its defaults on a GB200 slice whose IMEX channel is missing on one tray
(docs/lifecycle-rules.md NC8, row F5): MNNVL looks available (fabric attribute,
state COMPLETED, one cluster UUID), so NCCL runs its FABRIC self-test, which fails, and
init fails with ncclSystemError instead of falling back. NCCL's own message says to set
NCCL_MNNVL_ENABLE=0; this policy does not."""

from commsim.policy import Policy

POLICY = Policy(name="nccl-mnnvl-no-imex-check", order=("nccl",), params={"nccl_auto_env": False},
                fallback_on_setup_error=False)
