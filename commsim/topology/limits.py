"""How large a machine commsim builds: checked before a topology is parsed or built, so a
mistyped count is refused at once instead of filling memory for minutes.

Each limit is above every real machine a bug report comes from, and small enough that the
whole cluster (a Host with its link matrix per host, a Gpu per GPU) is built in seconds and
well under a GB of this process's memory.
"""

from __future__ import annotations

from commsim.topology.model import TopologyError

# GPUs one host's `nvidia-smi topo -m` (or one NCCL XML host) may list. The largest boards
# ship 16 GPUs on one NVSwitch baseboard (DGX-2 / HGX-2) and PCIe chassis about 20; a host's
# matrix is GPUs^2 links, so 64 keeps it at 4,096 cells. A 3,000-GPU matrix is a paste error.
MAX_GPUS_PER_HOST = 64

# Hosts of one cluster. The largest jobs reported run on tens of thousands of GPUs (a few
# thousand 8-GPU hosts); 4,096 hosts of 8 GPUs build in about 2.5 s and 260 MB here.
MAX_HOSTS = 4096

# GPUs of the whole cluster: MAX_HOSTS hosts of 8 GPUs.
MAX_GPUS = 32768


def check_size(hosts: int, gpus_per_host: int, source: str) -> None:
    """TopologyError naming `source` when a cluster of `hosts` hosts of `gpus_per_host`
    GPUs is beyond the limits above."""
    if hosts > MAX_HOSTS:
        raise TopologyError(f"{source}: {hosts:,} hosts, more than the {MAX_HOSTS:,} commsim "
                            f"builds; give a host count of at most {MAX_HOSTS:,}")
    if gpus_per_host > MAX_GPUS_PER_HOST:
        raise TopologyError(f"{source}: {gpus_per_host:,} GPUs on one host, more than the "
                            f"{MAX_GPUS_PER_HOST} commsim builds (no real board has more than "
                            f"about 20)")
    if hosts * gpus_per_host > MAX_GPUS:
        raise TopologyError(f"{source}: {hosts:,} hosts of {gpus_per_host} GPUs are "
                            f"{hosts * gpus_per_host:,} GPUs, more than the {MAX_GPUS:,} "
                            f"commsim builds; give fewer hosts")
