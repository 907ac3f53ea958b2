"""The pattern of vllm-project/vllm#46515 (row G5): CUDA-graph memory
profiling captures temporary graphs, registration opens peer IPC mappings for their buffers,
then the graphs are cleared and the buffers freed without closing those mappings."""

from commsim.policy import Policy

POLICY = Policy(name="vllm-profiling-leak",
                params={"max_size": 8 << 20, "release_capture_closes_ipc": False})
