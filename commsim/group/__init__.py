"""Group layer: rank-to-rank exchange of small objects.

`base.Group` is the interface; `local` implements it for in-process ranks under the runtime's
seeded cooperative scheduler (`commsim.runtime`); `torch_dist` implements it for real
processes over torch.distributed's store. The runtime's names are re-exported here for the
callers of a group.
"""

from commsim.group.base import REDUCE_OPS, Group
from commsim.runtime.diagnosis import (CollectiveMismatch, Diagnosis, GroupError, GroupTimeout, HangDetected,
                     RankFailed, RankState)
from commsim.group.local import LocalGroup, LocalWorld
from commsim.runtime.scheduler import (Event, Outcome, Scheduler, current_rank, current_scheduler, in_rank,
                        now, sleep, wait_until, yield_now)

__all__ = [
    "Group", "REDUCE_OPS", "GroupError", "CollectiveMismatch", "HangDetected", "GroupTimeout",
    "RankFailed", "Diagnosis", "RankState", "LocalWorld", "LocalGroup", "Scheduler", "Outcome",
    "Event", "current_scheduler", "in_rank", "current_rank", "now", "sleep", "wait_until",
    "yield_now",
]
