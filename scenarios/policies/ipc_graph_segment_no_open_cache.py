"""Custom all-reduce whose CUDA-graph buffers are carved from one graph-pool segment (as
PyTorch's caching allocator does) and whose registration opens every buffer's IPC handle,
without the map of already-opened handles vLLM keeps (rows H1-H3 of
docs/fidelity-rules.md). Every buffer's handle is the segment's (H3), so one handle is opened
several times: the same pointer on current drivers, cudaErrorAlreadyMapped on older ones."""

from commsim.policy import Policy

POLICY = Policy(name="ipc-graph-segment-no-open-cache", order=("ipc", "nccl"),
                params={"max_size": 8 << 20, "graph_pool_segment": True, "ipc_open_cache": False})
