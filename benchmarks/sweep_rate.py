"""Sweep throughput (prints figures; no assertions).

    .venv/bin/python benchmarks/sweep_rate.py [--count N] [--cpu-count M] [--rounds R]
                                              [--profile-count K]

1. CPU per scenario in this process (time.process_time, so other work on a shared machine
   does not count), today's sweep against a baseline in the same process: the same ids with
   the per-machine caches off (P2P probe verdicts not shared between fabrics) and the
   collector walking the whole heap (no gc.freeze) at Python's default thresholds, as a
   sweep worker ran before those caches and the heap settling
   (changes that cannot be switched off, such as the driver's faster argument conversion,
   are in both: the ratio understates the gain over the old code).
   Rounds alternate baseline / today over the same ids (after a warm-up round) and the
   minimum of each is printed, with the ratio and the rate two quiet cores would give.
   The machine's speed is printed first (a fixed pure-Python loop), and the CPU per scenario
   also in units of that loop, so figures from different machines compare.
2. Scenarios/s wall for the default mix (sampler, seed 0) with 1 worker (in process) and with 2
   worker processes, and the projected time for 10,000 scenarios (the target: >= 500/s
   on 2 cores, 10,000 in 20 s; 1,000/s the aim).
3. Cost by tier: the mean per-scenario time for small / medium / large messages and by
   world size, from the in-process run.
4. A cProfile top-15 (by internal time, then cumulative) of K scenarios in process. Ranks run
   as greenlets, which cProfile follows poorly: read cumulative figures inside a rank with
   care (py-spy, sampling, attributes them better).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import time
from collections import OrderedDict, defaultdict
from contextlib import contextmanager, nullcontext

from commsim.scenario import generate as G
from commsim.scenario.sweep import run_one, run_sweep, select_ids, settle_heap
from commsim.sim import p2p_probe


class _NothingKept(OrderedDict):
    """A verdict memo that keeps nothing: every fabric runs each probe round trip itself."""

    def __setitem__(self, key, value) -> None:
        pass


@contextmanager
def baseline():
    """What a sweep worker did before the per-machine caches and heap settling: every fabric probes every pair
    itself, full collections walk every object (nothing frozen), and the young generation is
    collected at Python's default threshold."""
    shared = p2p_probe._verdicts
    p2p_probe._verdicts = _NothingKept()
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    try:
        yield
    finally:
        p2p_probe._verdicts = shared
        settle_heap()


def machine_speed() -> float:
    """CPU seconds of a fixed pure-Python loop (best of 5): the figures below scale with it,
    so two machines' runs compare as (CPU per scenario) / (this). Machines seen so far
    differ by up to 3x in it at the same commit."""
    best = float("inf")
    for _ in range(5):
        t = time.process_time()
        sum(i * i for i in range(1_000_000))
        best = min(best, time.process_time() - t)
    return best


def cpu_per_scenario(ids: list[str], rounds: int) -> float:
    for sid in ids:                    # warm-up: imports, presets, caches
        run_one(sid)
    settle_heap()
    got: dict[str, list[float]] = {"baseline": [], "today": []}
    for _ in range(rounds):
        for mode in got:
            with baseline() if mode == "baseline" else nullcontext():
                t = time.process_time()
                bad = [sid for sid in ids if not run_one(sid)["ok"]]
                # A timing of scenarios that broke measures nothing: say so and stop.
                if bad:
                    raise SystemExit(f"{mode}: {len(bad)} scenario(s) failed (first: {bad[0]}); "
                                     f"the figures would be meaningless")
                got[mode].append((time.process_time() - t) / len(ids))
    b, n = min(got["baseline"]), min(got["today"])
    for mode, v in got.items():
        print(f"  {mode:<9} {1e3 * min(v):6.2f} ms CPU per scenario (min of {len(v)}: "
              f"{', '.join(f'{1e3 * x:.2f}' for x in v)})")
    print(f"  today / baseline: {b / n:.2f}x faster; two quiet cores: {2 / b:5.0f}/s -> "
          f"{2 / n:5.0f}/s (target >= 500/s, i.e. <= 4 ms CPU per scenario)")
    return n


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
    ap.add_argument("--cpu-count", type=int, default=200,
                    help="scenarios per round of the CPU comparison (default 200)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the CPU comparison (default 3)")
    ap.add_argument("--profile-count", type=int, default=200)
    a = ap.parse_args()
    loop = machine_speed()
    print(f"CPUs: {os.cpu_count()}; default mix; machine: {1e3 * loop:.1f} ms CPU for the reference "
          f"loop (sum of 10^6 squares in Python)")
    print(f"CPU per scenario in process, {a.cpu_count} ids (sampler seed 1), baseline vs today:")
    n = cpu_per_scenario(select_ids(a.cpu_count, seed=1), a.rounds)
    print(f"  today in machine-independent units: {n / loop:.3f} reference loops per scenario "
          f"(the 500/s target on a machine where the loop takes {1e3 * loop:.1f} ms: "
          f"<= {0.004 / loop:.3f})")
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
