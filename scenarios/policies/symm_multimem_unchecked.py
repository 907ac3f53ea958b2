"""Symmetric memory whose all-reduce runs the multimem kernel without checking that the
multicast address is non-zero (rows S2, MC6 of docs/fidelity-rules.md; the check vLLM and
sglang make: vllm-project/vllm#50182, sgl-project/sglang#30364)."""

from commsim.policy import Policy

POLICY = Policy(name="symm-multimem-unchecked", order=("symm", "nccl"),
                params={"symm_multimem_unchecked": True})
