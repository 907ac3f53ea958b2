"""PNG rendering of `commsim explain --sizes` tables (matplotlib, Agg backend: no display).

One panel per group: predicted time of each legal backend over message size on log-log axes,
the chosen backend drawn over its line with markers, and the model's crossover points as
dotted verticals. matplotlib is imported here only, so the rest of commsim works without it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from commsim.backends import get_backend
from commsim.errors import UserError
from commsim.util.fileio import atomic_path, check_output
from commsim.report.size_tables import SizeTable, human



def _pyplot():
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise UserError("--plot needs matplotlib (pip install matplotlib); the text table "
                        "works without it") from None
    matplotlib.use("Agg")   # headless: CI and containers have no display
    import matplotlib.pyplot as plt
    return plt


def plot_size_tables(tables: Sequence[SizeTable], out: str | Path, title: str = "") -> Path:
    """Write one PNG with a panel per table; returns the path written."""
    path = check_output(out, "--plot", suffix=".png")
    plt = _pyplot()
    n = len(tables)
    fig, axes = plt.subplots(n, 1, figsize=(9, 4.6 * n), squeeze=False)
    for ax, t in zip(axes[:, 0], tables):
        _panel(ax, t)
    if title:
        fig.suptitle(title, fontsize=13)
    fig.tight_layout()
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=110, format="png")
    finally:
        plt.close(fig)
    return path


def _panel(ax, t: SizeTable) -> None:
    xs = [r.nbytes for r in t.rows]
    for b in t.legality.legal:
        ys = [r.cells[b].seconds * 1e6 for r in t.rows]
        ok = [(x, y) for x, y in zip(xs, ys) if not math.isinf(y)]
        if not ok:
            continue
        cls = get_backend(b)        # each backend declares its colour and line style
        color = cls.colour if cls else None
        ax.plot([x for x, _ in ok], [y for _, y in ok], color=color, lw=1.5, alpha=0.55, label=b,
                ls=cls.plot_style if cls else "-")
        chosen = [(x, y) for (x, y), r in zip(zip(xs, ys), t.rows) if r.chosen == b]
        if chosen:
            ax.plot([x for x, _ in chosen], [y for _, y in chosen], "o", color=color, ms=6,
                    label=f"{b} (chosen)")
    for c in t.crossovers:
        ax.axvline(c.nbytes, color="black", ls=":", lw=1)
        ax.annotate(f"{c.below}\u2192{c.above}\n{human(c.nbytes)}", (c.nbytes, 1.0),
                    xycoords=("data", "axes fraction"), xytext=(3, -4), textcoords="offset points",
                    va="top", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(xs[::2] if len(xs) > 10 else xs)
    ax.set_xticklabels([human(x).replace(" ", "") for x in (xs[::2] if len(xs) > 10 else xs)],
                       rotation=45, fontsize=8)
    ax.set_xlabel("message size")
    ax.set_ylabel("predicted time (us)")
    ax.set_title(f"group {t.group}: {t.fabric.describe()}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
