"""Sweep throughput (prints figures; no assertions).

    .venv/bin/python benchmarks/sweep_rate.py [--count N] [--profile-count M]

1. Scenarios/s for the default mix (sampler, seed 0) with 1 worker (in process) and with 2
   worker processes, and the projected time for 10,000 scenarios (the issue's target: under
   60 s with two workers).
2. Cost by tier: the mean per-scenario time for small / medium / large messages and by
   world size, from the in-process run.
3. A cProfile top-15 (by internal time, then cumulative) of 200 scenarios in process.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import time
from collections import defaultdict

from commsim.scenario import generate as G
from commsim.scenario.sweep import run_one, run_sweep, select_ids


def rate(ids: list[str], jobs: int) -> float:
    t = time.perf_counter()
    rep = run_sweep(ids, jobs=jobs)
    dt = time.perf_counter() - t
    r = len(ids) / dt
    print(f"jobs={jobs}: {len(ids)} scenarios in {dt:6.2f} s = {r:6.1f} scenarios/s; "
          f"10,000 would take {10_000 / r:5.0f} s; failed {len(rep.failed)} "
          f"({', '.join(f'{k} {v}' for k, v in rep.kind_counts().items() if v) or 'none'})")
    return r


def tiers(ids: list[str]) -> None:
    by_tier, by_world = defaultdict(list), defaultdict(list)
    for sid in ids:
        rec = run_one(sid, "none")
        p = G.plan_from_id(sid)
        big = max(p.sizes)
        tier = "large (>= 2 MiB)" if big >= 2 * G.Mi else "medium (>= 128 KiB)" if big >= 128 * 1024 else "small"
        by_tier[tier].append(rec["seconds"])
        if tier == "small":
            by_world[p.world].append(rec["seconds"])
    total = sum(sum(v) for v in by_tier.values())
    for k, v in sorted(by_tier.items()):
        print(f"  {k:<20} {len(v):5d} scenarios, mean {1e3 * sum(v) / len(v):7.1f} ms, "
              f"{100 * sum(v) / total:5.1f}% of the time")
    for w, v in sorted(by_world.items()):
        print(f"  small, world {w:<7} {len(v):5d} scenarios, mean {1e3 * sum(v) / len(v):7.1f} ms")


def profile(ids: list[str]) -> None:
    pr = cProfile.Profile()
    pr.enable()
    for sid in ids:
        run_one(sid, "sample")
    pr.disable()
    for key in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats(key).print_stats(15)
        text = s.getvalue()
        start = text.find("   ncalls")
        print(f"-- top 15 by {key} --")
        print(text[start:].rstrip())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=2000, help="scenarios per rate run (default 2000)")
    ap.add_argument("--profile-count", type=int, default=200)
    a = ap.parse_args()
    print(f"CPUs: {os.cpu_count()}; default mix, sampler seed 0")
    ids = select_ids(a.count, seed=0)
    run_sweep(ids[:20], jobs=1)        # warm-up: imports, preset caches
    r1 = rate(ids, 1)
    r2 = rate(ids, 2)
    print(f"speed-up with 2 workers: {r2 / r1:.2f}x")
    print("cost by tier (in process):")
    tiers(ids[: min(len(ids), 1000)])
    print(f"cProfile of {a.profile_count} scenarios in process:")
    profile(select_ids(a.profile_count, seed=1))


if __name__ == "__main__":
    main()
