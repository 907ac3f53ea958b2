"""Process-level faults: what can happen to a rank process, as opposed to a driver call.

A step is named by a substring of a collective's tag (tags name the lifecycle step:
'ipc.init: exchange IPC handles', 'nccl.all_reduce: ring round 2', 'close'), so
`kill={3: "ipc.init"}` kills rank 3 with SIGKILL as it reaches the IPC handle exchange.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from typing import Callable

from commsim.errors import UserError


@dataclass(frozen=True)
class ProcFaults:
    kill: dict[int, str] = field(default_factory=dict)    # rank -> step: SIGKILL itself there
    stall: dict[int, str] = field(default_factory=dict)   # rank -> step: stop responding there
    absent: frozenset[int] = frozenset()                  # ranks never started

    def validate(self, world_size: int) -> None:
        for what, ranks in (("--kill", self.kill), ("--stall", self.stall), ("--absent", self.absent)):
            for r in ranks:
                if not 0 <= r < world_size:
                    raise UserError(f"{what} {r}: no such rank; the scenario has ranks 0..{world_size - 1}")

    def hook(self, rank: int) -> Callable[[str], None] | None:
        """The ProcessWorld.on_collective hook of `rank`, or None when it has no fault."""
        kill, stall = self.kill.get(rank), self.stall.get(rank)
        if kill is None and stall is None:
            return None

        def on_collective(tag: str) -> None:
            if kill is not None and kill in tag:
                os.kill(os.getpid(), signal.SIGKILL)
            if stall is not None and stall in tag:
                while True:            # alive but silent: only the launcher ends it
                    time.sleep(3600)
        return on_collective


def parse_rank_step(text: str, flag: str) -> tuple[int, str]:
    """'3@ipc.init' -> (3, 'ipc.init'); a clear error otherwise."""
    rank, sep, step = text.partition("@")
    if not sep or not rank.isdigit() or not step:
        raise UserError(f"{flag} {text!r}: give RANK@STEP, e.g. {flag} 3@ipc.init (STEP is a "
                        f"substring of a collective's tag)")
    return int(rank), step
