"""The rank number taken for the CUDA device ordinal (docs/lifecycle-rules.md RN4;
NVIDIA/TensorRT-LLM#1494: "Rank 1 is incorrectly assigned to GPU 1, based on the assumption
of 8 GPUs per node"; flashinfer-ai/flashinfer#2662: tp_rank as device_idx). On hosts with
fewer GPUs than the group has ranks, cudaSetDevice fails with 'invalid device ordinal'."""

from commsim.policy import Policy

POLICY = Policy(name="device-ordinal-from-rank", params={"max_size": 8 << 20, "device_ordinal": "group_rank"})
