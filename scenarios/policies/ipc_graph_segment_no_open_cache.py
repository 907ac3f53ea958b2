"""Custom all-reduce whose CUDA-graph buffers share one block of the caching allocator's
graph pool (commsim/libmodels/caching_allocator.py, as PyTorch's does) and whose registration opens
every buffer's IPC handle, without the map of already-opened handles vLLM keeps (rows H1-H3
of docs/fidelity-rules.md). Every buffer's handle is the block's (H3), so one handle is opened
several times: the same pointer on current drivers, cudaErrorAlreadyMapped on older ones."""

from commsim.policy import Policy

POLICY = Policy(name="ipc-graph-segment-no-open-cache", order=("ipc", "nccl"),
                params={"max_size": 8 << 20, "ipc_open_cache": False})
