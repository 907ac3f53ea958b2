"""A custom all-reduce workspace created on first use, where the first use is a captured op
(FlashInfer's fusion workspace as vLLM created it inside `call_trtllm_fused_allreduce_norm`,
vllm-project/vllm#37461; creations retried on a capturing stream, vllm-project/vllm#55973).
Its `cudaMalloc` runs inside the workload's CUDA-graph capture, which PyTorch and vLLM begin
in GLOBAL mode: the runtime refuses it with cudaErrorStreamCaptureUnsupported (rule CG1 of
docs/lifecycle-rules.md). The ranks vote and fall back to NCCL, but the refused call has
invalidated the capture: its end answers cudaErrorStreamCaptureInvalidated (CG2)."""

from commsim.policy import Policy

POLICY = Policy(name="setup-inside-capture", order=("ipc", "nccl"),
                params={"max_size": 8 << 20, "setup": "lazy", "setup_in_capture": True})
