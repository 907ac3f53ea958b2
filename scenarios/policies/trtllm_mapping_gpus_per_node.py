"""TensorRT-LLM's `Mapping(gpus_per_node=8)` default on a machine with 4 GPUs per host
(NVIDIA/TensorRT-LLM#1494, THUDM/slime#95; docs/lifecycle-rules.md RN2): `is_multi_node` is
`world_size > gpus_per_node`, so TP 8 over two GB200 trays is "one node" and the single-node
legacy-IPC workspace is built across the trays. No fallback: the workspace is required."""

from commsim.policy import Policy

POLICY = Policy(name="trtllm-mapping-gpus-per-node", order=("ipc", "nccl"),
                params={"max_size": 8 << 20, "gpus_per_node": 8}, fallback_on_setup_error=False)
