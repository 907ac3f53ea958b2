"""A sweep's report: every scenario's record, the table and failure list `commsim sweep`
prints, its JSON (what `sweep merge` reads back and scripts/sweep_digest.py digests) and the
HTML backend map. Built by commsim.scenario.sweep from a run, or by
commsim.scenario.executors from the JSON reports of a sweep's shards."""

from __future__ import annotations

import html
import json
import re
from collections import Counter
from dataclasses import dataclass, field

from commsim.backends import backends
from commsim.scenario import generate as G
from commsim.scenario.oracle import KINDS


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

    def write_html(self, path: str) -> None:
        from commsim.util.fileio import write_atomic
        write_atomic(path, render_html(self), overwrite=True)


def _table(rows: list[tuple[str, ...]], head: tuple[str, ...]) -> str:
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*head), fmt.format(*("-" * w for w in widths))] +
                     [fmt.format(*r) for r in rows])


# -- HTML ----------------------------------------------------------------------------------------------
def render_html(rep: Report) -> str:
    """The backend map: machine shape (rows) x group shape (columns), each cell coloured by
    the majority backend over its ops, with scenario and failure counts."""
    colours = {n: c.colour for n, c in backends().items()}    # each backend declares its own
    cells = rep.cells()
    shapes = sorted({s for s, _ in cells}, key=_shape_key)
    layouts = sorted({l for _, l in cells}, key=_layout_key)
    esc = html.escape
    parts = ['<div class="h corner">machine \\ groups</div>']
    parts += [f'<div class="h col">{esc(l)}</div>' for l in layouts]
    for s in shapes:
        parts.append(f'<div class="h row">{esc(s)}</div>')
        for l in layouts:
            c = cells.get((s, l))
            if c is None:
                parts.append('<div class="cell empty"></div>')
                continue
            bk = c["backends"]
            top, n = (bk.most_common(1)[0] if bk else ("none", 0))
            share = n / max(sum(bk.values()), 1)
            colour = colours.get(top, "#dddddd")
            title = (f"{s} / {l}: {c['scenarios']} scenario(s); ops by backend: "
                     + ", ".join(f"{b} {k}" for b, k in bk.most_common())
                     + (f"; {c['failures']} failed" if c["failures"] else ""))
            fail = f'<span class="fail">&#x2716;{c["failures"]}</span>' if c["failures"] else ""
            parts.append(f'<div class="cell{" bad" if c["failures"] else ""}" title="{esc(title)}" '
                         f'style="background:{colour};opacity:{0.45 + 0.55 * share:.2f}">'
                         f'<b>{esc(top)}</b><br>{c["scenarios"]}{fail}</div>')
    legend = "".join(f'<span class="key" style="background:{c}">{b}</span>'
                     for b, c in colours.items())
    kc = rep.kind_counts()
    fl = "".join(f"<li><code>{esc(r['id'])}</code> {esc(', '.join(r['kinds']))}: "
                 f"{esc(r['description'])}<br><code>{esc(r['replay'])}</code></li>" for r in rep.failed[:200])
    n = len(rep.records)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>commsim sweep: backend map</title>
<style>
body {{ font: 13px/1.35 system-ui, sans-serif; margin: 1.5em; color: #222; }}
.grid {{ display: grid; grid-template-columns: 13em repeat({len(layouts)}, minmax(5.2em, 1fr)); gap: 2px; }}
.h {{ font-weight: 600; padding: 3px; background: #f3f3f3; }}
.col {{ text-align: center; }}
.cell {{ color: #fff; text-align: center; padding: 3px; border-radius: 3px; font-size: 12px; }}
.cell.empty {{ background: #fafafa; }}
.cell.bad {{ outline: 3px solid #d62728; outline-offset: -3px; }}
.fail {{ display: inline-block; margin-left: .4em; background: #d62728; color: #fff; padding: 0 .3em; border-radius: 2px; }}
.key {{ color: #fff; padding: 2px 8px; margin-right: 6px; border-radius: 3px; }}
</style></head><body>
<h1>commsim sweep: backend map</h1>
<p>{n} scenario(s), {n - len(rep.failed)} clean, {len(rep.failed)} failed, {rep.wall_s:.1f} s
with {rep.jobs} job(s). Each cell: the backend chosen for most ops of that machine shape and group
layout (opacity = its share), the scenario count, and failures marked in red.</p>
<p>{legend}</p>
<p>failures by kind: {esc(', '.join(f'{k} {v}' for k, v in kc.items()))}</p>
<div class="grid">
{chr(10).join(parts)}
</div>
<h2>Failures</h2>
<ul>{fl or '<li>none</li>'}</ul>
</body></html>
"""


def _shape_key(s: str) -> tuple:
    nums = [int(x) for x in re.findall(r"[:*](\d+)", s)]
    return (G.shape_family(s), "*" in s, nums)


def _layout_key(l: str) -> tuple:
    m = re.match(r"tp(\d+)(?:xdp(\d+))?(\+dp)?", l)
    return (int(m.group(1)), int(m.group(2) or 1), bool(m.group(3))) if m else (999, 0, False)
