"""A custom all-reduce that takes its own slot of the workspace list by LOCAL_RANK where the
group rank was meant (docs/lifecycle-rules.md RN1; ByteDance-Seed/Triton-distributed#130,
NVIDIA/TensorRT-LLM#2099). Right for a group that starts at local rank 0; for the second TP
group of a host its slots run past the list: the kernel reads a garbage pointer."""

from commsim.policy import Policy

POLICY = Policy(name="local-rank-workspace-index", order=("ipc", "nccl"),
                params={"max_size": 8 << 20, "workspace_index": "local_rank"})
