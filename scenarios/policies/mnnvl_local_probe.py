"""MNNVL admitted on a rank-local probe instead of a group-agreed one (FlashInfer
SymmDeviceMemory without the AND-reduction, rows V16, FH2): rank 0 sees a
working fabric and every rank takes the FABRIC path, including ranks whose host has no IMEX
channel."""

from commsim.backends.base import Eligibility
from commsim.policy import Policy


class LocalProbeMnnvl(Policy):
    def admit(self, backend, view):
        if backend.name == "fabric":
            r0 = view.ranks[0]
            return Eligibility(r0.mnnvl_capable, () if r0.mnnvl_capable else ("rank 0 not MNNVL-capable",))
        return super().admit(backend, view)


POLICY = LocalProbeMnnvl(name="mnnvl-local-probe", order=("fabric", "nccl"),
                         fallback_on_setup_error=False)
