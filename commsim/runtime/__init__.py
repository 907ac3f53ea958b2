"""The runtime every simulated thing runs on: the seeded cooperative
scheduler (`scheduler`), its blocking primitive `wait_until`, and hang diagnosis
(`diagnosis`). It imports nothing else of commsim, so the simulator, the groups and the
backends' kernels all stand on it without standing on each other.
"""

from commsim.runtime.diagnosis import Diagnosis, GroupError, GroupTimeout, HangDetected, RankState
from commsim.runtime.scheduler import Scheduler, current_scheduler, wait_until

__all__ = ["Diagnosis", "GroupError", "GroupTimeout", "HangDetected", "RankState", "Scheduler",
           "current_scheduler", "wait_until"]
