#!/usr/bin/env python3
"""Digest of a `commsim sweep --json` report with its timing fields stripped, so two runs of
one (count, seed) compare by result only: the same digest means the same scenarios, verdicts,
backends, notes and failures.

    python scripts/sweep_digest.py before.json after.json     # one digest per report
    python scripts/sweep_digest.py --diff before.json after.json

Timing fields: the report's wall_s and rate_per_s, each scenario's seconds. Exit status 1
with --diff when the normalised reports differ (the first differing scenarios are printed).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

TIMING_TOP = ("wall_s", "rate_per_s")
TIMING_SCENARIO = ("seconds",)


def normalise(report: dict) -> dict:
    out = {k: v for k, v in report.items() if k not in TIMING_TOP}
    out["scenarios"] = [{k: v for k, v in s.items() if k not in TIMING_SCENARIO}
                        for s in report.get("scenarios", [])]
    return out


def digest(report: dict) -> str:
    blob = json.dumps(normalise(report), sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def _load(path: str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"sweep_digest: {path}: not a readable JSON sweep report ({e})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="+", metavar="REPORT.json")
    ap.add_argument("--diff", action="store_true", help="compare two reports scenario by scenario")
    args = ap.parse_args(argv)
    reps = [_load(p) for p in args.reports]
    for p, r in zip(args.reports, reps):
        print(f"{digest(r)}  {p}")
    if not args.diff:
        return 0
    if len(reps) != 2:
        ap.error("--diff takes exactly two reports")
    a, b = (normalise(r) for r in reps)
    sa = {s["id"]: s for s in a["scenarios"]}
    sb = {s["id"]: s for s in b["scenarios"]}
    differ = [i for i in sorted(set(sa) | set(sb)) if sa.get(i) != sb.get(i)]
    other = [k for k in sorted(set(a) | set(b)) if k != "scenarios" and a.get(k) != b.get(k)]
    for i in differ[:10]:
        print(f"scenario {i}:\n  before {sa.get(i)}\n  after  {sb.get(i)}")
    for k in other:
        print(f"field {k}: before {a.get(k)!r} after {b.get(k)!r}")
    print(f"{len(differ)} scenario(s) differ; {len(other)} other field(s) differ")
    return 1 if differ or other else 0


if __name__ == "__main__":
    sys.exit(main())
