"""Shortcut of sglang before sgl-project/sglang#12724 (flashinfer-ai/flashinfer#2006,
rows B15/B19): FlashInfer's all-reduce fusion is enabled whenever there is no data
parallelism, and its trtllm workspace is built from legacy IPC (`create_shared_buffer`:
cudaMalloc, cudaIpcGetMemHandle, all-gather, cudaIpcOpenMemHandle) — "no DP" taken to mean
"single node"."""

from commsim.backends.base import Eligibility
from commsim.policy import Policy


class NoDpMeansSingleNode(Policy):
    def admit(self, backend, view):
        if backend.name == "ipc":
            return Eligibility(True, ("no data parallelism, so the IPC fusion workspace is used",))
        return super().admit(backend, view)


POLICY = NoDpMeansSingleNode(name="sglang-no-dp-fusion", fallback_on_setup_error=False)
