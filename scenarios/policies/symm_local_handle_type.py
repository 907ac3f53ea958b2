"""Handle type chosen from each rank's own probe, with no AND-reduction over the group
(FlashInfer SymmDeviceMemory's handle exchanger, `flashinfer/comm/mnnvl.py`, row V16): ranks whose
host has a working IMEX channel take FABRIC, the others POSIX fd, and the two halves wait in
the store under different keys. Symmetric memory is assumed to work everywhere."""

from commsim.backends.base import Eligibility
from commsim.policy import Policy


class LocalHandleType(Policy):
    def admit(self, backend, view):
        if backend.name == "symm":
            return Eligibility(True, ("symmetric memory assumed available; handle type per rank",))
        return super().admit(backend, view)


POLICY = LocalHandleType(name="symm-local-handle-type", order=("symm", "nccl"),
                         params={"max_size": 8 << 20, "symm_handle_type": "local"})
