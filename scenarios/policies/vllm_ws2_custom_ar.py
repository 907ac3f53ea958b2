"""Shortcut of vLLM's MNNVL-era CustomAllreduce before vllm-project/vllm#55835 (issue #52778,
rows B9/B10): `should_custom_ar` admits world size 2 without checking
`mnnvl_only`; for a cross-node group the IPC buffers are local (no exchange), so init passes,
and CUDA-graph registration then exchanges legacy IPC handles across hosts."""

from commsim.backends.base import Eligibility
from commsim.policy import Policy


class Ws2CustomAllReduce(Policy):
    def admit(self, backend, view):
        if backend.name == "ipc" and view.size == 2:
            return Eligibility(True, ("world size 2 is always eligible (pre-#55835 shortcut)",))
        return super().admit(backend, view)


POLICY = Ws2CustomAllReduce(
    name="vllm-ws2-custom-ar",
    params={"max_size": 8 << 20, "cross_host_local_buffers": True},
    fallback_on_setup_error=False)   # vLLM's CUDACHECK aborts: no fallback (row L16)
