"""One rendezvous counter per process instead of per group (the class of bug behind
FlashInfer's patch in `flashinfer/comm/torch_symmetric_memory.py` that keeps torch's
`group_count` from being reset): ranks that took part in a subgroup's rendezvous have
advanced the counter, so their world rendezvous posts under a later key than the ranks that
did not, and neither side completes."""

from commsim.policy import Policy

POLICY = Policy(name="symm-process-counter", order=("symm", "nccl"),
                params={"max_size": 8 << 20, "symm_rendezvous_counter": "process"})
