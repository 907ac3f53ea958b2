"""What the topology allows, and nothing else: each group's legal backends (every registered
backend's own `truth` rule over the group's pairwise facts, commsim.topology.truth) and the
per-call limits each backend declares. The oracle (commsim.scenario.oracle) judges a run
against these; the shortcut-policy knobs (commsim.scenario.knobs) derive what a knob must do
from them. Nothing here calls a backend's `eligibility` or reads a discovery view."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from commsim.backends import backends, default_order, fallbacks, get_backend
from commsim.policy import Policy, resolve
from commsim.topology.model import GpuRef
from commsim.topology.truth import GroupFacts
from commsim.scenario import memo
from commsim.scenario.model import Scenario
from commsim.scenario.message import ESIZE, message_numel


# -- groups -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GroupTruth:
    """What the topology allows one group: the legal backends and why the others are not."""

    name: str
    ranks: tuple[int, ...]
    gpus: tuple[GpuRef, ...]
    legal: tuple[str, ...]                     # group-level, in policy order
    why_not: dict[str, str] = field(default_factory=dict)
    # Legal by every query a process can make, but their set-up must fail on this machine
    # (`Backend.setup_fails`: a container without /dev/nvidia-caps, hosts in different IMEX
    # domains): admitting them is right, and so is falling back from them.
    setup_fails: dict[str, str] = field(default_factory=dict)


def group_truth(sc: Scenario, ranks: tuple[int, ...], name: str = "",
                order: tuple[str, ...] | None = None) -> GroupTruth:
    """Each registered backend's own oracle rule (`Backend.truth`) over the group's facts;
    the legal ones in `order` (default: the registry's), the fallbacks appended."""
    gpus = tuple(sc.placement[r] for r in ranks)
    legal, why, fails = memo.group_truth(sc.cluster, gpus, order,
                                         lambda: _truth(sc.cluster, gpus, order))
    return GroupTruth(name, ranks, gpus, legal, dict(why), dict(fails))


def _truth(cluster: Any, gpus: tuple[GpuRef, ...],
           order: tuple[str, ...] | None) -> tuple[tuple[str, ...], dict[str, str], dict[str, str]]:
    """(legal, why not, set-up fails) of a group's GPUs on a machine: a pure function of
    them and of the policy order (the backend registry and rules are code)."""
    facts = GroupFacts.of(cluster, gpus)
    registry = backends()
    why: dict[str, str] = {}
    for b, cls in registry.items():
        reason = cls.truth(facts)
        if reason is not None:
            why[b] = reason
    legal = tuple(b for b in (default_order() if order is None else order) if b not in why)
    legal += tuple(b for b in fallbacks() if b not in legal)
    fails = {b: r for b in legal if (r := registry[b].setup_fails(facts))}
    return legal, why, fails


def op_nbytes(op: str, size: int, dtype: str, ws: int) -> int:
    """The bytes an op hands the communicator for a workload size (the runner's rounding:
    whole elements, at least one, reduce_scatter a multiple of the group size)."""
    return message_numel(op, size, dtype, ws) * ESIZE[dtype]


def op_legal(backend: str, op: str, nbytes: int, ws: int, params: dict[str, Any]) -> bool:
    """Per-call limits as each backend declares them: the peer backends need 16-byte
    multiples and fit the workspace (row B5); multicast does all-reduce only, within its own
    workspace; an unregistered name is never legal."""
    cls = get_backend(backend)
    return cls is not None and cls.within_limits(op, nbytes, ws, params)


def legal_backends(sc: Scenario, policy: Policy | None = None,
                   truths: dict[str, GroupTruth] | None = None) -> dict[tuple[str, str, int, str], tuple[str, ...]]:
    """(group, op, size, dtype) -> the legal backends, in the policy's order. `truths`: each
    group's `group_truth` in that order, where the caller has it already."""
    pol = policy or resolve(sc.policy, sc.path.parent if sc.path is not None else None)
    out = {}
    wl = sc.workload
    for g in sc.groups:
        gt = truths[g.name] if truths is not None else group_truth(sc, g.ranks, g.name, tuple(pol.order))
        ws = len(g.ranks)
        # A policy whose order depends on the group (the "model" preset) binds to the
        # ground-truth fabric and the legal set is listed in its order at each size. A
        # fixed-order policy binds to itself; its order is `order`, and its `candidates` is
        # not consulted here (it belongs to the run under test, which may plant a defect there).
        bound = pol.for_truth(sc.cluster, gt.gpus)
        for op in wl.ops:
            for size in wl.sizes:
                for dt in wl.dtypes:
                    nb = op_nbytes(op, size, dt, ws)
                    ok = [b for b in gt.legal if op_legal(b, op, nb, ws, pol.params)]
                    if bound is not pol:
                        rank = {b: i for i, b in enumerate(bound.candidates(op, nb))}
                        ok.sort(key=lambda b: rank.get(b, len(rank)))
                    out[(g.name, op, size, dt)] = tuple(ok)
    return out
