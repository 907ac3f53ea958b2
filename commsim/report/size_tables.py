"""Predicted all-reduce time per legal backend over message sizes (`commsim explain --sizes`).

For one group: which backends are legal comes from a real discovery run on the simulator
(every rank probes through its SimDriver, the view is all-gathered, each backend's
`eligibility` judges it), exactly what the communicator would admit. Which one runs at a
size comes from the policy's candidate order and each backend's own `accepts` limits (its
workspace size), without moving data. The times come from `commsim.cost_model`, for the algorithm
each backend itself would run at that size (its `algorithm` rule).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Sequence

from commsim import cost_model
from commsim.libmodels import nccl_rules
from commsim.backends import backends
from commsim.backends.base import Backend
from commsim.discovery import GroupView, discover
from commsim.errors import UserError
from commsim.group import LocalWorld
from commsim.policy import Policy
from commsim.sim import SimFabric, spawn_driver
from commsim.topology.model import Cluster, GpuRef

_UNITS = {"B": 1, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30}
RANGE_HELP = "LO..HI with units B, KiB, MiB, GiB, e.g. 4KiB..256MiB (powers of two in between)"


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).upper() if m else ""
    if m is None or (unit and unit not in _UNITS):
        raise UserError(f"size {text!r}: expected a number with unit B, KiB, MiB or GiB "
                        f"(binary units; KB/MB are refused), e.g. 4KiB")
    return int(m.group(1)) * _UNITS.get(unit or "B", 1)


def parse_size_range(text: str) -> list[int]:
    """Every power of two in LO..HI (both given with units)."""
    lo_s, sep, hi_s = text.partition("..")
    if not sep:
        raise UserError(f"--sizes {text!r}: expected {RANGE_HELP}")
    lo, hi = parse_size(lo_s), parse_size(hi_s)
    if not 0 < lo <= hi:
        raise UserError(f"--sizes {text!r}: need 0 < LO <= HI")
    sizes = [1 << k for k in range(63) if lo <= 1 << k <= hi]
    if not sizes:
        raise UserError(f"--sizes {text!r}: no power of two between {lo} and {hi} bytes")
    if len(sizes) > 40:
        raise UserError(f"--sizes {text!r}: {len(sizes)} sizes; give at most 40 powers of two")
    return sizes


def human(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            v = n / size
            # Within 0.5% of a whole number reads as that number (bisection lands near 256).
            return f"{round(v)} {unit}" if abs(v - round(v)) <= 0.005 * v else f"{v:.2f} {unit}"
    return f"{n:.0f} B"


# -- discovery and choice ----------------------------------------------------------------


def discovered_view(cluster: Cluster, placement: Sequence[GpuRef], seed: int = 0) -> GroupView:
    """The group-agreed discovery view, from one rank process per GPU on the simulator."""
    fabric = SimFabric(cluster, seed)
    drivers = [spawn_driver(fabric, g) for g in placement]
    try:
        outcomes = LocalWorld(len(drivers), seed).run(lambda g: discover(drivers[g.rank], g))
    finally:
        for d in drivers:
            fabric.exit_process(d.proc.pid)
    bad = [o for o in outcomes if not o.ok]
    if bad:
        raise RuntimeError(f"discovery failed: {bad[0].error}")
    return outcomes[0].value


def _backends() -> dict[str, type[Backend]]:
    return backends()      # the registry the communicator runs from: the same classes


@dataclass(frozen=True)
class Legality:
    view: GroupView
    legal: tuple[str, ...]                 # in policy order
    declined: dict[str, str]               # backend -> reasons


def legal_backends(cluster: Cluster, placement: Sequence[GpuRef],
                   policy: Policy | None = None, seed: int = 0) -> Legality:
    """What the communicator would admit for a group on these GPUs (before set-up)."""
    pol = policy or Policy()
    view = discovered_view(cluster, placement, seed)
    registry = _backends()
    legal, declined = [], {}
    for name in pol.order:
        cls = registry.get(name)
        if cls is None:
            declined[name] = "not available in this build"
            continue
        verdict = pol.admit(cls, view)
        if verdict.ok:
            legal.append(name)
        else:
            declined[name] = "; ".join(verdict.reasons)
    return Legality(view, tuple(legal), declined)


def _instances(legality: Legality, policy: Policy) -> dict[str, Backend]:
    # Constructed, never set up: enough for `accepts` and `algorithm`, which read only the
    # group size, the view and the policy's parameters.
    stub = SimpleNamespace(rank=0, size=legality.view.size, name="model")
    return {n: _backends()[n](None, stub, legality.view, dict(policy.params))
            for n in legality.legal}


# -- the table ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    algorithm: str
    seconds: float


@dataclass(frozen=True)
class Row:
    nbytes: int
    cells: dict[str, Cell]                 # legal backend -> its algorithm and predicted time
    chosen: str | None                     # what the policy would dispatch to
    declined: tuple[str, ...] = ()         # candidates before `chosen` that refused the size

    @property
    def fastest(self) -> str:
        return min(self.cells, key=lambda b: self.cells[b].seconds)


@dataclass(frozen=True)
class SizeTable:
    group: str
    fabric: cost_model.GroupFabric
    legality: Legality
    rows: tuple[Row, ...]
    crossovers: tuple[cost_model.Crossover, ...] = field(default=())   # where the fastest changes


def _as_run(b: Backend, name: str, op: str, nbytes: int, f: cost_model.GroupFabric) -> Cell:
    if b.cost_family == "nccl":
        algo, t = cost_model.best(name, nbytes, f)
        label = "nvls" if algo == "multicast" else f"ring/{cost_model.nccl_protocol(nbytes, f)}"
        return Cell(label, t)
    algo = b.algorithm(op, nbytes)
    key = "multicast" if algo == "multimem" else algo
    return Cell(algo, cost_model.predict(name, key, nbytes, f))


def size_table(cluster: Cluster, placement: Sequence[GpuRef], group: str, sizes: Sequence[int],
               policy: Policy | None = None, op: str = "all_reduce", dtype: str = "bfloat16",
               seed: int = 0) -> SizeTable:
    pol = policy or Policy()
    legality = legal_backends(cluster, placement, pol, seed)
    fab = cost_model.with_nccl(cost_model.group_fabric(cluster, placement), nccl_rules.decide(
        nccl_rules.machine_from_cluster(cluster, placement),
        nccl_rules.parse_env(dict(pol.params.get("nccl_env", ())))).nvls)
    inst = _instances(legality, pol)
    bound = pol.for_group(legality.view)       # as the communicator binds it after discovery
    rows = []
    for n in sizes:
        cells = {name: _as_run(b, name, op, n, fab) for name, b in inst.items()}
        chosen, declined = None, []
        for name in bound.candidates(op, n):
            if name not in inst:
                continue
            ok, why = inst[name].accepts(op, n, dtype)
            if ok:
                chosen = name
                break
            declined.append(f"{name}: {why}")
        rows.append(Row(n, cells, chosen, tuple(declined)))
    return SizeTable(group, fab, legality, tuple(rows),
                     tuple(_envelope_changes(inst, op, fab, min(sizes), max(sizes))))


def _envelope_changes(inst: dict[str, Backend], op: str, f: cost_model.GroupFabric,
                      lo: int, hi: int) -> list[cost_model.Crossover]:
    """Sizes where the fastest legal backend (as it would run) changes."""
    if len(inst) < 2 or lo >= hi:
        return []

    def times(n: float) -> dict[str, float]:
        return {name: _as_run(b, name, op, int(n), f).seconds for name, b in inst.items()}

    def winner(n: float) -> str:
        t = times(n)
        return min(t, key=t.get)

    steps = max(1, int(math.log2(hi / lo) * 16))
    grid = [lo * (hi / lo) ** (i / steps) for i in range(steps + 1)]
    out = []
    for x0, x1 in zip(grid, grid[1:]):
        w0, w1 = winner(x0), winner(x1)
        if w0 == w1:
            continue
        while x1 / x0 > 1.001:
            mid = math.sqrt(x0 * x1)
            if winner(mid) == w0:
                x0 = mid
            else:
                x1 = mid
        out.append(cost_model.Crossover(math.sqrt(x0 * x1), w0, winner(x1)))
    return out


def _us(t: float) -> str:
    if math.isinf(t):
        return "-"
    return f"{t * 1e6:.1f} us" if t < 1e-3 else f"{t * 1e3:.2f} ms"


def render(table: SizeTable) -> str:
    legal = table.legality.legal
    lines = [f"group {table.group}: predicted all-reduce time ({table.fabric.describe()})",
             f"  legal: {', '.join(legal) or 'none'}"]
    for name, why in table.legality.declined.items():
        lines.append(f"  not legal: {name}: {why}")
    head = ("size",) + legal + ("chosen", "fastest (model)")
    body = []
    for r in table.rows:
        cells = []
        for b in legal:
            c = r.cells[b]
            mark = " *" if b == r.chosen else ""
            cells.append(f"{_us(c.seconds)} {c.algorithm}{mark}")
        body.append((human(r.nbytes),) + tuple(cells) + (r.chosen or "-", r.fastest))
    widths = [max(len(row[i]) for row in body + [head]) for i in range(len(head))]
    fmt = "  " + "  ".join(f"{{:<{w}}}" for w in widths)
    lines.append(fmt.format(*head))
    lines.append(fmt.format(*("-" * w for w in widths)))
    lines += [fmt.format(*row) for row in body]
    lines.append("  * = chosen: first backend in the policy's order whose accepts() takes the size")
    if table.crossovers:
        lines.append("  model crossovers (fastest legal backend changes): " + "; ".join(
            f"{c.below} -> {c.above} at {human(c.nbytes)}" for c in table.crossovers))
    else:
        lines.append("  model crossovers: none in this range")
    switches = [(b.nbytes, a.chosen, b.chosen, b.declined) for a, b in zip(table.rows, table.rows[1:])
                if a.chosen != b.chosen]
    for n, was, now, why in switches:
        reason = f" ({'; '.join(why)})" if why else ""
        lines.append(f"  chosen changes {was} -> {now} at {human(n)}{reason}")
    return "\n".join(lines)
