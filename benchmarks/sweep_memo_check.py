"""The sweep's per-worker memo (commsim/scenario/memo.py) on against off, over one sweep: the
digest of the JSON report (scripts/sweep_digest.py: every scenario's verdict, backends, notes
and failures, timing stripped) must be the same, and the CPU of the sweep's process tree is
printed for each (figures; the digest is the check: exit 1 when the digests differ).

    .venv/bin/python benchmarks/sweep_memo_check.py [--count 2000] [--seed 7] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from sweep_digest import digest  # noqa: E402


def _sweep(count: int, seed: int, jobs: int, memo: bool) -> tuple[str, float, float]:
    """(digest, wall s, CPU s of the tree) of one `commsim sweep --json`."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "sweep.json")
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "commsim.cli", "sweep", "--count", str(count),
                        "--seed", str(seed), "--jobs", str(jobs), "--json", out, "--quiet"],
                       cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
                       env=dict(os.environ, COMMSIM_SWEEP_MEMO="1" if memo else "0"))
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        with open(out) as f:
            rep = json.load(f)
    return digest(rep), wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    got = {}
    for memo in (False, True):
        d, wall, cpu = got[memo] = _sweep(args.count, args.seed, args.jobs, memo)
        print(f"memo {'on ' if memo else 'off'}: digest {d[:16]}, {args.count / wall:6.1f} "
              f"scenarios/s wall, {cpu / args.count * 1e3:5.2f} ms CPU per scenario (tree)")
    same = got[False][0] == got[True][0]
    print("digests agree" if same else "DIGESTS DIFFER: the memo changed a result")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
