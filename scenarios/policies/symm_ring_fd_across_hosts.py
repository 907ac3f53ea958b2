"""PyTorch symmetric memory on a group that spans hosts without FABRIC handles: the POSIX
fds travel around PyTorch's IpcChannel ring (pytorch/pytorch#171495; docs/lifecycle-rules.md
FX1-FX3). The rank whose successor is on the other host fails at once with "Failed to send
fd: No such file or directory"; every other rank blocks in recvmsg, which has no timeout.
PyTorch decides per rank (no vote) and does not fall back."""

from commsim.backends.base import Eligibility
from commsim.policy import Policy


class RingFdAcrossHosts(Policy):
    def admit(self, backend, view):
        if backend.name == "symm":
            return Eligibility(True, ("POSIX fd handles whatever the placement (no FABRIC probe)",))
        return super().admit(backend, view)


POLICY = RingFdAcrossHosts(name="symm-ring-fd-across-hosts", order=("symm", "nccl"),
                           params={"max_size": 8 << 20, "symm_handle_type": "fd", "agree": False,
                                   "fd_transport": "pytorch_ring"},
                           fallback_on_setup_error=False)
