"""Shortcut-policy knob scenarios for sweeps (issue 18, items 4-6; docs/lifecycle-rules.md RN,
AW; docs/scenario-format.md "Policy knobs").

The default policy never sets these knobs, so a sweep under it never exercises their code
paths. A knob scenario is a sampler draw run under a shortcut policy with one knob set:

    k<seed>-<index>    the index-th sampler draw of `seed` (machine, layout, placement, ops,
                       sizes as `s<seed>-<index>`, without its faults and workload knobs, so
                       the knob acts alone), under policy order ("ipc", "nccl") plus one knob

The knob and its value come from a stream seeded by the id alone. A default sampler sweep
replaces about one id in KNOB_EVERY by its knob twin (`select_ids`); every `s` id that stays
is exactly the scenario it was.

The oracle side: each knob states, from the ground truth (the placement and the topology,
never a backend's own answer), whether on this machine and group it must make the run fail,
and how (the verdict kind and the error the run must show), or must be harmless. `judge_knob`
turns the expected failures into notes and flags a mismatch either way as `knob-outcome`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable

from ..policy import Policy
from .model import Scenario

Mi = 1 << 20
KNOB_EVERY = 20
ORDER = ("ipc", "nccl")       # vLLM / TRT-LLM custom all-reduce with NCCL behind it
IPC_WORLD_SIZES = (2, 4, 6, 8)  # the compiled kernels (commsim/backends/ipc.py, row B2)


@dataclass(frozen=True)
class Expectation:
    """What the knob must do to one run: `kind` "" = harmless; else the verdict kind the run
    must show, with `detail` a substring of one such failure, and `why` from the truth."""

    kind: str = ""
    detail: str = ""
    why: str = ""


@dataclass(frozen=True)
class Knob:
    name: str                                   # the policy parameter
    values: tuple[Any, ...]
    expect: Callable[[Scenario, Any], list[Expectation]]   # [] = harmless
    rules: str


def _ipc_best(sc: Scenario, params: dict[str, Any]) -> dict[tuple[str, str, int, str], int]:
    """(group, op, size, dtype) -> the bytes of the op, where ipc is the best legal backend,
    per the oracle's own ground truth (legal_backends over the topology, knob unset)."""
    from .oracle import legal_backends, op_nbytes
    plain = {k: v for k, v in params.items() if k in ("max_size",)}
    legal = legal_backends(sc, Policy(name="knob-truth", order=ORDER, params=plain))
    sizes = {g.name: len(g.ranks) for g in sc.groups}
    return {k: op_nbytes(k[1], k[2], k[3], sizes[k[0]]) for k, ok in legal.items() if ok and ok[0] == "ipc"}


def _group(sc: Scenario, name: str):
    return next(g for g in sc.groups if g.name == name)


def _expect_workspace_index(sc: Scenario, value: Any) -> list[Expectation]:
    """RN1: LOCAL_RANK (the GPU's index on its host) as the slot. Harmless where every rank's
    GPU index equals its group rank; a slot past the list stages through a garbage pointer
    (cudaMemcpy: cudaErrorInvalidValue at op)."""
    out = []
    best = _ipc_best(sc, params_of("workspace_index", value))
    for gname in dict.fromkeys(k[0] for k in best):
        g = _group(sc, gname)
        slots = [sc.placement[r].index for r in g.ranks]
        past = [(r, s) for r, s in zip(g.ranks, slots) if s >= len(g.ranks)]
        if past:
            r, s = past[0]
            out.append(Expectation("cuda-error", "cudaErrorInvalidValue",
                                   f"group {g.name}: rank {r} is GPU {s} of its host, past the "
                                   f"{len(g.ranks)}-entry workspace list"))
        elif slots != list(range(len(g.ranks))):
            # A permutation relabels the ranks consistently: a sum is the same, but gathered
            # or scattered pieces land at the wrong rank's place.
            ordered = [k for k in best if k[0] == gname and k[1] in ("all_gather", "reduce_scatter")]
            if ordered:
                out.append(Expectation("numerics", "", f"group {g.name}: slots {slots} permute the "
                                                       f"list; {ordered[0][1]} puts pieces in slot order"))
    return out


def _expect_gpus_per_node(sc: Scenario, value: Any) -> list[Expectation]:
    """RN2/RN3: "one node" is `world <= gpus_per_node` (a number, or the GPUs rank 0's host
    has). Harmless where that agrees with the hosts the group really spans. A group on one
    host counted as several loses ipc (not-best); one spanning hosts counted as one node gets
    ipc admitted across hosts (an illegal backend, whose legacy IPC set-up then fails)."""
    from .oracle import group_truth
    best = {k[0] for k in _ipc_best(sc, params_of("gpus_per_node", value))}
    out = []
    for g in sc.groups:
        ws, hosts = len(g.ranks), {sc.placement[r].host for r in g.ranks}
        host0 = sc.cluster.host(sc.placement[g.ranks[0]].host)
        per_node = len(host0.gpus) if value == "device_count" else int(value)
        counted_one, really_one = ws <= per_node, len(hosts) == 1
        if counted_one == really_one:
            continue
        if really_one and g.name in best:
            out.append(Expectation("not-best", "best legal is ipc",
                                   f"group {g.name}: {ws} ranks on one host counted as more than "
                                   f"one node of {per_node}"))
        elif not really_one and ws in IPC_WORLD_SIZES:
            out.append(Expectation("illegal-backend", "admitted ipc",
                                   f"group {g.name}: {ws} ranks on {len(hosts)} hosts counted as "
                                   f"one node of {per_node}"))
    return out


def _expect_force_algorithm(sc: Scenario, value: Any) -> list[Expectation]:
    """AW1/AW2: a forced one-shot all-reduce needs ws x bytes of Lamport workspace; the
    workspace holds 2 x max_size. Beyond it the library refuses (WorkspaceTooSmall) or,
    unchecked, the stores leave the allocation (cudaErrorIllegalAddress)."""
    params = params_of("force_algorithm", value)
    cap = params["max_size"]
    out = []
    for (gname, op, size, dt), nb in _ipc_best(sc, params).items():
        ws = len(_group(sc, gname).ranks)
        if op in ("all_reduce", "all_reduce_rmsnorm") and ws * nb > 2 * cap:
            out.append(Expectation("cuda-error", "WorkspaceTooSmall" if value == "one-shot/refuse"
                                   else "cudaErrorIllegalAddress",
                                   f"group {gname}: one-shot of {nb} B on {ws} ranks needs {ws * nb} B, "
                                   f"the workspace holds {2 * cap} B"))
    return out


def params_of(name: str, value: Any) -> dict[str, Any]:
    """The shortcut policy's parameters for one knob value."""
    if name == "force_algorithm":
        # A workspace sized for small messages, so the forced one-shot outgrows it at the
        # sampler's sizes (rule AW1).
        alg, check = value.split("/")
        return _params(force_algorithm=alg, workspace_check=check, max_size=1536)
    return _params(**{name: value})


def _params(**kw: Any) -> dict[str, Any]:
    return {"max_size": 8 * Mi, **kw}


KNOBS: tuple[Knob, ...] = (
    Knob("workspace_index", ("local_rank",), _expect_workspace_index, "RN1"),
    Knob("gpus_per_node", (8, 4, "device_count"), _expect_gpus_per_node, "RN2-RN3"),
    Knob("force_algorithm", ("one-shot/refuse", "one-shot/none"), _expect_force_algorithm, "AW1-AW2"),
)


def get_knob(name: str) -> Knob:
    return next(k for k in KNOBS if k.name == name)


def draw(pid: str) -> tuple[str, Any]:
    from .generate import _seed_of
    rng = random.Random(_seed_of("knob", pid))
    k = rng.choice(KNOBS)
    return k.name, rng.choice(k.values)


def policy_of(knob: tuple[str, Any]) -> Policy:
    name, value = knob
    return Policy(name=f"knob-{name}-{value}", order=ORDER, params=params_of(name, value))


def is_knob_id(seed: int, index: int) -> bool:
    from .generate import _seed_of
    return _seed_of("knob-pick", seed, index) % KNOB_EVERY == 0


def judge_knob(sc: Scenario, v: Any) -> None:
    """Fold the knob's expectations into the verdict `v` (in place): each expected failure
    must be there (then it, and the teardown residue of the failed run, become notes);
    a harmless knob must leave the run clean."""
    name, value = sc.extra["knob"]
    exps = get_knob(name).expect(sc, value)
    label = f"knob {name}={value!r}"
    if not exps:
        if not v.ok:
            v.add("knob-outcome", f"{label} must be harmless on this machine and group, but the run "
                                  f"failed: {', '.join(v.kinds)}")
        return
    missing = [e for e in exps if not any(f.kind == e.kind and e.detail in f.detail for f in v.failures)]
    if missing:
        e = missing[0]
        v.add("knob-outcome", f"{label} must fail the run with {e.kind} ({e.detail}): {e.why}; "
                              f"it showed {', '.join(v.kinds) or 'no failure'}")
        return
    # Collateral of the expected failure: peers left waiting (cuda-error), a teardown without
    # agreement (leak flags, row L15).
    absorbed = {e.kind for e in exps} | ({"cuda-error", "leak"} if any(e.kind == "cuda-error" for e in exps) else set())
    v.notes += [f"expected under {label} ({exps[0].why}): {f.kind}: {f.detail[:200]}"
                for f in v.failures if f.kind in absorbed]
    v.failures[:] = [f for f in v.failures if f.kind not in absorbed]
