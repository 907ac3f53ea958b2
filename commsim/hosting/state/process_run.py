"""The run this process belongs to, as far as the surfaces need it: set by the start-up
bootstrap of a procs-mode process (commsim/launch/bootstrap.py), None elsewhere (an inproc
run's ranks share the launcher's interpreter and never read it)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ProcessRun", "process_run", "set_process_run"]


@dataclass(frozen=True)
class ProcessRun:
    run_dir: str          # the run's private directory (rendezvous files, reports, stacks)
    timeout: float        # --timeout: how long a rank waits for its peers before failing


_run: ProcessRun | None = None


def set_process_run(run: ProcessRun | None) -> None:
    global _run
    _run = run


def process_run() -> ProcessRun | None:
    return _run
