"""Ctrl-C at ten points of a small `commsim exec --mode procs` run, repeated: each run must
exit 130 with `commsim: interrupted`, print no traceback and leave no process or file behind.

tests/security/test_procs_sigint.py checks three of these points in the suite; this is the
full set, too slow for CI's budget (about 3 s of CPU a run). Run it on a loaded machine, where
the races were seen:

    .venv/bin/python benchmarks/procs_sigint.py [--rounds N]

Exit status 0 when every run behaved, 1 otherwise (each failure is printed).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.security.helpers import interrupted_exec  # noqa: E402

PROGRAMS = ROOT / "tests" / "security" / "programs"
BLOCK = [str(PROGRAMS / "block_forever.py")]
ENDS = [str(PROGRAMS / "ready_then_sleep.py"), "0.2"]
# (program, seconds after both ranks are ready or None, seconds after the launch)
POINTS = [(BLOCK, None, 0.15), (BLOCK, None, 0.3), (BLOCK, None, 0.6), (BLOCK, 0.0, 0.0),
          (BLOCK, 0.05, 0.0), (BLOCK, 0.2, 0.0), (BLOCK, 0.5, 0.0), (BLOCK, 1.0, 0.0),
          (ENDS, 0.15, 0.0), (ENDS, 0.3, 0.0)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=1, help="times through the ten points")
    args = ap.parse_args()
    bad = 0
    for n in range(args.rounds):
        for program, after_ready, after_start in POINTS:
            t0 = time.monotonic()
            rc, err, alive, files = interrupted_exec(program, after_ready=after_ready,
                                                     after_start=after_start)
            ok = (rc == 130 and err.rstrip().endswith("commsim: interrupted")
                  and "Traceback" not in err and not alive and not files)
            where = (f"{after_ready:g} s after ready" if after_ready is not None
                     else f"{after_start:g} s after launch")
            print(f"round {n}: {Path(program[0]).name:22} SIGINT {where:20} exit {rc} in "
                  f"{time.monotonic() - t0:.1f} s: {'ok' if ok else 'FAILED'}", flush=True)
            if not ok:
                bad += 1
                print(f"  alive: {alive}; files: {files}; stderr tail:\n{err[-2000:]}")
    print(f"{bad} of {args.rounds * len(POINTS)} runs misbehaved")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
