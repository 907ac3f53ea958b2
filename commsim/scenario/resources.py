"""Host memory a scenario run needs, and the refusal of one that would not fit.

Every simulated GPU's memory is real host memory (numpy arrays in thread mode, /dev/shm
segments in process mode), and a collective holds several buffers of the message size per
rank (input, output, the backends' workspaces and staging copies, the float64 reference).
Measured on hgx-h100-8, TP 8, one all-reduce (thread mode, peak RSS over the interpreter's
own): 76 MB at 1 MiB and 581 MB at 8 MiB, i.e. about 9 host bytes per rank per message byte;
the 72-rank rack measured about 9.4. The estimate uses 10, plus the interpreter, plus in
process mode one rank process each (a forked interpreter with torch loaded).
"""

from __future__ import annotations

import os

from commsim.errors import UserError

BYTES_PER_SIMULATED_BYTE = 10
BASE_BYTES = 300 << 20           # the interpreter with torch and numpy loaded
PER_PROCESS_BYTES = 150 << 20    # one rank process in process mode (mostly shared pages)


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def estimate_bytes(sc: object, procs: bool = False) -> int:
    """Peak host memory of one run of scenario `sc` (a commsim.scenario.model.Scenario)."""
    largest = max(sc.workload.sizes, default=0)
    n = sc.world_size
    return (BASE_BYTES + BYTES_PER_SIMULATED_BYTE * n * largest
            + (PER_PROCESS_BYTES * n if procs else 0))


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None where there is no such file)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_fits(sc: object, procs: bool = False, available: int | None = None) -> None:
    """UserError naming the scenario, the estimate and the override when a run of `sc`
    would need more host memory than this machine has available now."""
    need = estimate_bytes(sc, procs)
    have = available_bytes() if available is None else available
    if have is not None and need > have:
        where = getattr(sc, "path", None) or getattr(sc, "name", "scenario")
        raise UserError(
            f"{where}: a run needs about {format_bytes(need)} of host memory "
            f"({sc.world_size} ranks x {format_bytes(max(sc.workload.sizes))} largest message "
            f"x {BYTES_PER_SIMULATED_BYTE}, plus the interpreter) but only "
            f"{format_bytes(have)} is available; use smaller sizes or fewer ranks, or pass "
            f"--no-memory-check to run it anyway")
