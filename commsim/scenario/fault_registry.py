"""The fault registry: each fault kind a scenario may name is declared once, by a
`register_fault(FaultKind(...))` call (the built-in kinds: commsim/scenario/faults.py and
fidelity_faults.py), with everything the rest of commsim reads about it:

* its keys (required and optional fields of `Fault`, each a key with its own parser:
  commsim/scenario/fault_keys.py), checked by the scenario loader;
* how it applies: a machine fault edits the ground truth (`commsim.topology.modify`) when
  the scenario loads; a driver fault arms the rank's `ProcessFaults` (`commsim.sim.faults`);
* the CUDA error names it injects, which the oracle then expects rather than blames;
* its weight in the sweep generator and how it picks a target among the scenario's GPUs;
* its line in the docs table (docs/scenario-format.md, checked by a test).

Read it through commsim.scenario.faults, which registers the built-in kinds first.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from commsim.errors import UserError
from commsim.topology.model import Cluster, GpuRef
from commsim.scenario.model import Fault

if TYPE_CHECKING:
    from commsim.sim.faults import ProcessFaults

MACHINE, DRIVER = "machine", "driver"

Draw = Callable[[Cluster, Sequence[GpuRef], random.Random, GpuRef], Fault]


@dataclass(frozen=True)
class FaultKind:
    name: str
    fields: tuple[str, ...]                 # required keys (fields of Fault)
    target: str                             # MACHINE or DRIVER
    models: str                             # docs: what it models
    row: str = "–"                          # docs: the rule row(s) it exercises
    optional: tuple[str, ...] = ()          # optional keys, default from Fault
    # MACHINE: (cluster, fault) -> the degraded cluster; DRIVER: (faults, fault) -> None
    apply: Callable = None                  # type: ignore[assignment]
    injects: Callable[[Fault], tuple[str, ...]] | None = None   # error names it causes
    weight: float = 0.0                     # sweep generator weight; 0: never drawn
    # How the generator aims it (the GPU drawn from the placement is given); default: at it.
    draw: Draw | None = None
    label: Callable[[Fault], str] | None = None
    causes: tuple[str, ...] = ()            # the accepted values of its `cause` key, if it has one

    def describe(self, f: Fault) -> str:
        return self.label(f) if self.label else f"{f.kind}({f.gpu})"

    def make(self, cluster: Cluster, placement: Sequence[GpuRef], rng: random.Random,
             gpu: GpuRef) -> Fault:
        return self.draw(cluster, placement, rng, gpu) if self.draw else Fault(self.name, gpu=gpu)

    def doc_line(self) -> str:
        defaults = {f.name: f.default for f in dataclasses.fields(Fault)}
        keys = ", ".join(f"`{k}`" for k in self.fields)
        keys += "".join(f", optional `{k}` (default {defaults[k]})" for k in self.optional)
        return f"| `{self.name}` | {keys} | {self.models} | {self.row} |"


_kinds: dict[str, FaultKind] = {}
_FIELDS = {f.name for f in dataclasses.fields(Fault)} - {"kind"}


def register_fault(kind: FaultKind) -> FaultKind:
    """Declare a fault kind; a second kind under a taken name is refused."""
    bad = [k for k in kind.fields + kind.optional if k not in _FIELDS]
    takes_cause = "cause" in kind.fields + kind.optional
    if bad or kind.target not in (MACHINE, DRIVER) or kind.apply is None or takes_cause != bool(kind.causes):
        raise UserError(f"fault kind {kind.name!r}: keys must be fields of Fault ({', '.join(sorted(_FIELDS))})"
                        f"{'; unknown: ' + ', '.join(bad) if bad else ''}; target one of "
                        f"{MACHINE}, {DRIVER}; an apply function; and causes = (...) exactly when "
                        f"it takes the key cause")
    old = _kinds.get(kind.name)
    if old is not None and old is not kind:
        raise UserError(f"fault kind {kind.name!r} is already registered")
    _kinds[kind.name] = kind
    return kind


def fault_kinds() -> dict[str, FaultKind]:
    return dict(_kinds)


def get_fault(name: str) -> FaultKind:
    return _kinds[name]


def kind_names() -> tuple[str, ...]:
    return tuple(_kinds)


def drawn_kinds() -> tuple[FaultKind, ...]:
    """The kinds the sweep generator draws, in registration order."""
    return tuple(k for k in _kinds.values() if k.weight > 0)


def is_driver_fault(f: Fault) -> bool:
    return _kinds[f.kind].target == DRIVER


def apply_machine_fault(cluster: Cluster, f: Fault) -> Cluster:
    k = _kinds[f.kind]
    if k.target != MACHINE:
        raise ValueError(f"not a machine fault: {f.kind}")
    return k.apply(cluster, f)


def arm_driver_faults(faults: Sequence[Fault], rank: int) -> "ProcessFaults":
    """The ProcessFaults of rank `rank`: every driver fault aimed at it, armed."""
    from commsim.sim.faults import ProcessFaults   # the simulator only when a run arms them
    pf = ProcessFaults()
    for f in faults:
        k = _kinds[f.kind]
        if k.target == DRIVER and f.rank == rank:
            k.apply(pf, f)
    return pf


def injected_errors(faults: Sequence[Fault]) -> set[str]:
    out: set[str] = set()
    for f in faults:
        k = _kinds[f.kind]
        if k.injects is not None:
            out.update(k.injects(f))
    return out


def docs_table() -> Iterator[str]:
    yield "| `kind` | Keys | Models | Row |"
    yield "|---|---|---|---|"
    for k in _kinds.values():
        yield k.doc_line()
