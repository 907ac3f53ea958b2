"""Custom all-reduce admitted on cuDeviceCanAccessPeer alone, without the functional probe
(rows P1-P4 of docs/fidelity-rules.md): what sglang's monkey-patched `gpu_p2p_access_check`
did (sgl-project/sglang#531) and what TRT-LLM's `can_access_peer` does
(NVIDIA/TensorRT-LLM#17034). The failure is not voted: TRT-LLM's IpcMemory raises on the
rank that hit it (NVIDIA/TensorRT-LLM#1498)."""

from commsim.policy import Policy

POLICY = Policy(name="p2p-flag-trusted", order=("ipc", "nccl"),
                params={"max_size": 8 << 20, "p2p_check": "flag", "agree": False})
