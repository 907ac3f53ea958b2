"""vLLM custom all-reduce before vllm-project/vllm#51903 / #56193: CUDA-graph buffers are
registered whatever allocated them. With PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
they are cuMem memory, which has no legacy IPC handle: `get_graph_buffer_ipc_meta` fails
`cudaIpcGetMemHandle` with 'invalid argument' right after capture (vllm-project/vllm#42609;
docs/lifecycle-rules.md AL4). CUDACHECK exits: no fallback."""

from commsim.policy import Policy

POLICY = Policy(name="vllm-expandable-graph-registration", order=("ipc", "nccl"),
                params={"max_size": 8 << 20, "graph_buffers": "register"},
                fallback_on_setup_error=False)
