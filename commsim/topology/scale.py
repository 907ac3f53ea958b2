"""The scale ladder: machines of 8, 72, 144 and 576 ranks, for measuring how a run grows with
the machine (benchmarks/scale_ladder.py, the README table).

8 and 72 are the shipped presets (HGX H100, GB200 NVL72). 144 and 576 are generated from
the GB200 tray and kept out of the preset list on purpose: the sweep's generator draws its
machine families from the presets, and a 576-rank machine in the default mix would turn a
sweep of thousands into hours.

- 144: two NVL72 racks joined into one NVLink domain, one NVML clique per rack, modelled as
  GB200 NVL36x2 is (same cluster UUID, different clique: row F3). How two NVL72 racks join
  is UNCONFIRMED (NVIDIA's Multi-Node Tuning Guide covers NVL36x2, not two NVL72s).
- 576: eight NVL72 racks in one NVLink domain through a second tier of NVLink switches, as
  NVL576-class systems are announced; one clique for the whole domain is UNCONFIRMED.
"""

from __future__ import annotations

from commsim.topology.model import Cluster, TopologyError
from commsim.topology.preset_parts import tray_rack
from commsim.topology.presets import build

LADDER = (8, 72, 144, 576)

# The generated rungs: GB200 trays (tray_rack's defaults) in one NVLink domain.
_GENERATED: dict[int, dict] = {
    144: dict(name="gb200-nvl72x2", trays=36, trays_per_clique=18,
              source="two GB200 NVL72 racks, 36 trays x 4 GPUs, one 144-GPU NVLink domain, one "
                     "clique per rack (generated; the joining of two NVL72 racks is UNCONFIRMED)"),
    576: dict(name="gb200-nvl576", trays=144,
              source="eight GB200 NVL72 racks, 144 trays x 4 GPUs, one 576-GPU NVLink domain "
                     "(generated, NVL576-class; one clique for the domain is UNCONFIRMED)"),
}


def ladder_cluster(ranks: int) -> Cluster:
    """The machine of the ladder with `ranks` GPUs."""
    if ranks == 8:
        return build("hgx-h100-8")
    if ranks == 72:
        return build("gb200-nvl72")
    if ranks in _GENERATED:
        return tray_rack(**_GENERATED[ranks])
    raise TopologyError(f"no scale-ladder machine of {ranks} ranks; the ladder is "
                        f"{', '.join(map(str, LADDER))}")
