"""Rate of the in-process group layer: barrier and all_gather_object rounds per second.

Usage: .venv/bin/python benchmarks/group_rate.py [--rounds N]
Prints figures only (no assertions): the machines are shared and noisy, so compare ratios
within one run.
"""

from __future__ import annotations

import argparse
import time

from commsim.group.local import LocalGroup, LocalWorld


def _rate(size: int, rounds: int, kind: str) -> float:
    """Rounds per second of `kind` among `size` ranks (best of 3 runs)."""

    def body(g: LocalGroup) -> None:
        if kind == "barrier":
            for _ in range(rounds):
                g.barrier(tag="bench")
        else:
            payload = {"rank": g.rank, "handle": b"x" * 64}
            for _ in range(rounds):
                g.all_gather_object(payload, tag="bench")

    best = float("inf")
    for seed in range(3):
        world = LocalWorld(size, seed=seed, max_steps=10**9)
        t0 = time.perf_counter()
        outcomes = world.run(body)
        best = min(best, time.perf_counter() - t0)
        for o in outcomes:
            o.unwrap()
    return rounds / best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2000)
    args = ap.parse_args()
    for size in (8, 72):
        rounds = max(50, args.rounds * 8 // size)
        for kind in ("barrier", "all_gather_object"):
            r = _rate(size, rounds, kind)
            print(f"{kind:18s} {size:3d} ranks: {r:10.0f} rounds/s  ({1e6 / r:8.1f} us/round)")


if __name__ == "__main__":
    main()
