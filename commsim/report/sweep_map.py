"""The sweep's HTML backend map: machine shape (rows) x group layout (columns), each cell
the backend chosen for most of its ops, rendered from `templates/sweep_map.html.j2` with
Jinja2 (autoescaped: scenario descriptions and replay commands come from shard files a user
may merge). Every cell's text meets WCAG AA contrast on its background (`contrast.py`) and
the page fits a 1366 px window: columns shrink and labels wrap instead of being cut."""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

from commsim.backends import backends
from commsim.report.contrast import readable_on
from commsim.scenario import generate as G
from commsim.scenario.sweep_report import Report
from commsim.util.fileio import write_atomic

__all__ = ["render", "write_html"]

_NO_BACKEND = "#dddddd"


def _environment() -> Any:
    import jinja2
    source = resources.files("commsim.report").joinpath("templates")
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(source)),
                              autoescape=True, undefined=jinja2.StrictUndefined)


def _shape_key(s: str) -> tuple:
    nums = [int(x) for x in re.findall(r"[:*](\d+)", s)]
    return (G.shape_family(s), "*" in s, nums)


def _layout_key(l: str) -> tuple:
    m = re.match(r"tp(\d+)(?:xdp(\d+))?(\+dp)?", l)
    return (int(m.group(1)), int(m.group(2) or 1), bool(m.group(3))) if m else (999, 0, False)


def context(rep: Report) -> dict[str, Any]:
    """What the template shows, every colour already paired with a readable text colour."""
    colours = {n: c.colour for n, c in backends().items()}    # each backend declares its own
    cells = rep.cells()
    shapes = sorted({s for s, _ in cells}, key=_shape_key)
    layouts = sorted({l for _, l in cells}, key=_layout_key)
    rows = []
    for s in shapes:
        row = []
        for l in layouts:
            c = cells.get((s, l))
            if c is None:
                row.append(None)
                continue
            bk = c["backends"]
            top, n = bk.most_common(1)[0] if bk else ("none", 0)
            bg, fg = readable_on(colours.get(top) or _NO_BACKEND)
            title = (f"{s} / {l}: {c['scenarios']} scenario(s); ops by backend: "
                     + ", ".join(f"{b} {k}" for b, k in bk.most_common())
                     + (f"; {c['failures']} failed" if c["failures"] else ""))
            row.append({"backend": top, "share": round(100 * n / max(sum(bk.values()), 1)),
                        "scenarios": c["scenarios"], "failures": c["failures"], "title": title,
                        "bg": bg, "fg": fg})
        rows.append({"shape": s, "cells": row})
    legend = []
    for name, colour in colours.items():
        bg, fg = readable_on(colour or _NO_BACKEND)
        legend.append({"name": name, "bg": bg, "fg": fg})
    n = len(rep.records)
    return {"n": n, "clean": n - len(rep.failed), "failed": rep.failed, "wall_s": rep.wall_s,
            "jobs": rep.jobs, "legend": legend, "layouts": layouts, "rows": rows,
            "kinds": ", ".join(f"{k} {v}" for k, v in rep.kind_counts().items())}


def render(rep: Report) -> str:
    return _environment().get_template("sweep_map.html.j2").render(**context(rep))


def write_html(rep: Report, path: str) -> None:
    write_atomic(path, render(rep), overwrite=True)
