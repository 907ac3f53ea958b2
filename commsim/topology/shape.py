"""Whether a host's NVLink matrix is an NVSwitch board or a direct mesh (rows T1-T3 of
docs/fidelity-rules.md). Shared by the `topo -m` and NVML fabric importers.

Behind a switch every peer is reached over all of a GPU's links, so `topo -m` prints the same
NV<k> to every peer and (peers x k) exceeds the links one GPU has (HGX H100: NV18 x 7; DGX-2:
NV6 x 15). A direct mesh splits its links over the peers, so the sum fits in one GPU (HGX H100
4-GPU: NV6 x 3 = 18; H200 NVL 4-way bridge). Mixed counts or PCIe pairs: bridges or a hybrid
cube mesh. None of the meshes has multicast or NVLS, whatever the link count.
"""

from __future__ import annotations

from typing import Sequence

from commsim.topology.gpu_models import MAX_NVLINKS, GpuSpec
from commsim.topology.model import Host, Link


def nvswitch_shape(n: int, pairs: Sequence[tuple[int, int, Link]],
                   spec: GpuSpec | None = None) -> tuple[bool, str]:
    """(switched?, why) for `n` GPUs whose distinct pairs (i, j, link) are given."""
    if n < 2:
        return False, "one GPU, no peers"
    pcie = [(i, j, lk) for i, j, lk in pairs if not lk.is_nvlink]
    if pcie:
        i, j, lk = pcie[0]
        return False, f"not every pair is NVLink (GPU{i}-GPU{j} is {lk.label})"
    counts = {lk.nvlinks for _, _, lk in pairs}
    if len(counts) > 1:
        listed = ", ".join(f"NV{c}" for c in sorted(counts))
        return False, (f"NVLink counts differ between pairs ({listed}): a hybrid mesh or "
                       f"bridges, no NVSwitch")
    k = counts.pop()
    links = spec.nvlinks if spec is not None and spec.nvlinks else MAX_NVLINKS
    part = spec.model if spec is not None else "any known part"
    total = (n - 1) * k
    if total > links:
        return True, (f"NV{k} to each of {n - 1} peers = {total} links, more than the {links} "
                      f"links of {part}: every peer is reached over all links, an NVSwitch board")
    return False, (f"NV{k} to each of {n - 1} peer(s) = {total} links, within the {links} links "
                   f"of {part}: a direct NVLink mesh (bridges), no NVSwitch, so no multicast "
                   f"and no NVLS")


def host_shape(host: Host, spec: GpuSpec | None = None) -> tuple[bool, str]:
    n = len(host.gpus)
    return nvswitch_shape(n, [(i, j, host.link(i, j)) for i in range(n) for j in range(i + 1, n)],
                          spec)
