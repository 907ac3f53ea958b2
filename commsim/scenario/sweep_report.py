"""A sweep's report: every scenario's record, the table and failure list `commsim sweep`
prints, its JSON (what `sweep merge` reads back and scripts/sweep_digest.py digests) (the HTML
backend map is commsim.report.sweep_map's). Built by commsim.scenario.sweep from a run, or by
commsim.scenario.executors from the JSON reports of a sweep's shards."""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field

from commsim.scenario.failure_kinds import KINDS


@dataclass
class Report:
    records: list[dict]
    wall_s: float = 0.0
    jobs: int = 1
    seed: int | None = None
    filters: list[str] = field(default_factory=list)
    shard: str | None = None        # "K/N" when this is one shard of a sweep
    executor: str = "local"

    @property
    def failed(self) -> list[dict]:
        return [r for r in self.records if not r["ok"]]

    @property
    def ok(self) -> bool:
        return not self.failed

    def kind_counts(self) -> dict[str, int]:
        c = Counter(k for r in self.records for k in r["kinds"])
        return {k: c.get(k, 0) for k in KINDS}

    def cells(self) -> dict[tuple[str, str], dict]:
        """(machine shape, group shape) -> backend counts over every op, scenarios, failures."""
        out: dict[tuple[str, str], dict] = {}
        for r in self.records:
            c = out.setdefault((r["shape"], r["layout"]), {"backends": Counter(), "scenarios": 0, "failures": 0})
            c["backends"].update(r["backends"])
            c["scenarios"] += 1
            c["failures"] += not r["ok"]
        return out

    def notes(self) -> Counter:
        """Notes by kind, with rank and group numbers folded together."""
        return Counter(re.sub(r"\b(rank|ranks|group|alloc) [\w,-]+", r"\1 N", n)[:200]
                       for r in self.records for n in r.get("notes", []))

    def summary(self, max_failures: int = 20) -> str:
        n = len(self.records)
        rows = []
        for (shape, layout), c in sorted(self.cells().items()):
            bk = " ".join(f"{b}:{k}" for b, k in c["backends"].most_common())
            rows.append((shape, layout, str(c["scenarios"]), bk or "-", str(c["failures"]) if c["failures"] else ""))
        out = [_table(rows, ("machine", "groups", "scenarios", "backends (ops)", "failed"))]
        kc = self.kind_counts()
        out.append("\nfailures by kind: " + ", ".join(f"{k} {v}" for k, v in kc.items()))
        det = sum(r.get("checked_determinism", False) for r in self.records)
        rate = n / self.wall_s if self.wall_s else 0.0
        out.append(f"{n} scenario(s), {n - len(self.failed)} clean, {len(self.failed)} failed, "
                   f"{det} re-run for determinism, in {self.wall_s:.1f} s ({rate:.0f}/s, {self.jobs} job(s))")
        if self.failed:
            out.append("\nfailed scenarios (replay each with the command shown):")
            for r in self.failed[:max_failures]:
                first = r["failures"][0]["detail"].splitlines()[0][:200] if r["failures"] else ""
                out.append(f"  {r['id']}: {', '.join(r['kinds'])}: {first}\n    {r['description']}\n"
                           f"    replay: {r['replay']}")
            if len(self.failed) > max_failures:
                out.append(f"  ... and {len(self.failed) - max_failures} more (see the JSON report)")
        return "\n".join(out)

    def to_json(self) -> dict:
        return {
            "seed": self.seed, "filters": self.filters, "shard": self.shard,
            "count": len(self.records), "executor": self.executor,
            "jobs": self.jobs, "wall_s": round(self.wall_s, 3),
            "rate_per_s": round(len(self.records) / self.wall_s, 1) if self.wall_s else None,
            "clean": len(self.records) - len(self.failed), "failed": len(self.failed),
            "failures_by_kind": self.kind_counts(),
            "cells": [{"machine": s, "groups": l, "scenarios": c["scenarios"], "failed": c["failures"],
                       "backends": dict(c["backends"])} for (s, l), c in sorted(self.cells().items())],
            "failures": [{"id": r["id"], "kinds": r["kinds"], "description": r["description"],
                          "failures": r["failures"], "replay": r["replay"]} for r in self.failed],
            "notes": dict(self.notes()),
            "scenarios": [{k: (round(v, 4) if k == "seconds" else v) for k, v in r.items()
                           if k not in ("failures",)} for r in self.records],
        }

    def canonical(self) -> dict:
        """The report without what depends on how it ran (timing, executor, jobs, shard): equal
        for one sweep whatever the executor, job count or sharding (then merged)."""
        d = self.to_json()
        for k in ("wall_s", "rate_per_s", "jobs", "executor", "shard"):
            d.pop(k)
        d["scenarios"] = [{k: v for k, v in s.items() if k != "seconds"} for s in d["scenarios"]]
        return d

    def write_json(self, path: str) -> None:
        from commsim.util.fileio import write_atomic
        write_atomic(path, json.dumps(self.to_json(), indent=1, sort_keys=False) + "\n", overwrite=True)


def _table(rows: list[tuple[str, ...]], head: tuple[str, ...]) -> str:
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*head), fmt.format(*("-" * w for w in widths))] +
                     [fmt.format(*r) for r in rows])
