"""POSIX-fd handles forced for symmetric memory on every machine (sglang on aarch64 + SM10x
monkey-patches FlashInfer's fabric probe to False, row B20): across GB200 trays
the fd cannot reach the peer's socket (row V9), and FlashInfer raises instead of falling
back."""

from commsim.backends.base import Eligibility
from commsim.policy import Policy


class PosixFdEverywhere(Policy):
    def admit(self, backend, view):
        if backend.name == "symm":
            return Eligibility(True, ("POSIX fd forced (SGLANG_FLASHINFER_FORCE_POSIX_FD_TRANSPORT)",))
        return super().admit(backend, view)


POLICY = PosixFdEverywhere(name="symm-posix-fd-everywhere", order=("symm", "nccl"),
                           params={"max_size": 8 << 20, "symm_handle_type": "fd", "agree": False,
                                   "fd_transport": "flashinfer_mesh"},
                           fallback_on_setup_error=False)
