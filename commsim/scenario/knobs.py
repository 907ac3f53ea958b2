"""Shortcut-policy knob scenarios for sweeps (docs/lifecycle-rules.md RN,
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

The failure-hygiene knobs (rules FH1-FH3: `rollback`, `agree`, `report_fallback`)
act only when a backend's set-up fails, and on the sampled machines without faults it never
does under the default admission: ipc is admitted only where the topology allows it, and the
set-up failures the topology alone can cause (a legacy IPC handle refused across hosts, or
between GPUs without P2P) are pairwise and symmetric, so they would fail every rank of a group
alike and never split one (measured over s1-0..s1-399: 363 groups whose IPC opens fail, every
one on all of its ranks). So a hygiene knob scenario provokes the commonest real set-up
failure, on one rank: its first allocation, the ipc workspace `cudaMalloc`, runs out of memory
(an `oom` fault at allocation 1, the fault kind the sampler already draws; the failure sglang
guards against by probing the workspace allocation and BAND-voting it). The provocation is chosen
from the truth: only in a group where ipc is legal (`group_truth`), hence admitted and set up
first at init, and only on a rank whose first communicator that group is; where no group
qualifies there is no fault, set-up never fails, and the knob must be harmless. From the
truth and that fault, the expectation: `rollback=False` leaves the workspaces of the group's
other ranks allocated (a leak); `agree=False` lets the faulted rank drop ipc alone while its
peers exchange IPC handles without it (a collective mismatch, or a hang); `report_fallback=
False` makes every rank of the group fall back to nccl unreported (`SilentFallback`, and the
oracle, finding no set-up failure in the decision record, calls the skipped ipc not-best).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable

from commsim.policy import Policy
from commsim.scenario.legal import group_truth, legal_backends, op_nbytes
from commsim.scenario.model import Fault, Scenario
from commsim.scenario.seeds import seed_of

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
    alt: tuple[str, ...] = ()           # other substrings that show the same failure
    collateral: tuple[str, ...] = ()    # verdict kinds the expected failure brings with it

    def shown_by(self, f: Any) -> bool:
        return f.kind == self.kind and any(d in f.detail for d in (self.detail, *self.alt))


@dataclass(frozen=True)
class Knob:
    name: str                                   # the policy parameter
    values: tuple[Any, ...]
    expect: Callable[[Scenario, Any], list[Expectation]]   # [] = harmless
    rules: str
    # The faults a knob scenario adds so that the knob has something to act on, chosen from
    # the truth of the base draw (rng: the id's own stream); None: the knob acts alone.
    provoke: Callable[[Scenario, random.Random], tuple[Fault, ...]] | None = None


def _ipc_best(sc: Scenario, params: dict[str, Any]) -> dict[tuple[str, str, int, str], int]:
    """(group, op, size, dtype) -> the bytes of the op, where ipc is the best legal backend,
    per the oracle's own ground truth (legal_backends over the topology, knob unset)."""
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


# -- failure hygiene (FH1-FH3) --------------------------------------------------------------------
def _provoke_setup_failure(sc: Scenario, rng: random.Random) -> tuple[Fault, ...]:
    """An out-of-memory on the ipc workspace allocation of one rank of the first group where
    ipc is legal and that is each of its ranks' first communicator (so the rank's allocation
    1 is that workspace: ipc is first in ORDER and set up at init); () where none is."""
    for g in sc.groups:
        firsts = [r for r in g.ranks if next(h for h in sc.groups if r in h.ranks) is g]
        if firsts == list(g.ranks) and "ipc" in group_truth(sc, g.ranks, g.name, ORDER).legal:
            return (Fault("oom", rank=rng.choice(g.ranks), at_allocation=1),)
    return ()


def _setup_failure(sc: Scenario) -> tuple[Any, int] | None:
    """(group, failing world rank) where, by the truth and the provocation, ipc set-up must
    fail: ipc legal for the group (so admitted, and set up first at init), and the rank's
    allocation 1 (that workspace) out of memory; None where set-up never fails."""
    for f in sc.faults:
        if f.kind != "oom" or f.at_allocation != 1 or f.rank is None:
            continue
        g = next((h for h in sc.groups if f.rank in h.ranks), None)
        if g is not None and "ipc" in group_truth(sc, g.ranks, g.name, ORDER).legal:
            return g, f.rank
    return None


def _on_setup_failure(make: Callable[[Any, int], Expectation]) -> Callable[[Scenario, Any], list[Expectation]]:
    """A hygiene knob's `expect`: harmless where set-up never fails, else `make(group, rank)`."""
    def expect(sc: Scenario, value: Any) -> list[Expectation]:
        hit = _setup_failure(sc)
        return [] if hit is None else [make(*hit)]
    return expect


def _leaks(g: Any, r: int) -> Expectation:
    """FH1: the voted failure stops every rank's ipc set-up after the workspace allocation;
    without rollback, every rank but the one whose allocation failed keeps its workspace."""
    return Expectation("leak", "allocation: cudaMalloc",
                       f"group {g.name}: rank {r}'s ipc workspace allocation fails; the other "
                       f"{len(g.ranks) - 1} rank(s) keep theirs")


def _falls_out_of_step(g: Any, r: int) -> Expectation:
    """FH2: rank-local, the faulted rank drops ipc alone and moves on (closing it, then nccl),
    while its peers enter the IPC handle exchange without it: the group falls out of step. A
    failure on every rank of the group would be harmless (all drop it); one rank never is."""
    return Expectation("cuda-error", "CollectiveMismatch",
                       f"group {g.name}: only rank {r}'s ipc set-up fails; it drops ipc alone "
                       f"while {len(g.ranks) - 1} peer(s) exchange IPC handles", alt=(": hang:",))


def _falls_back_silently(g: Any, r: int) -> Expectation:
    """FH3: the voted failure makes every rank of the group fall back to nccl, unreported. The
    decision record then shows no set-up failure, so the skipped ipc reads as not-best."""
    return Expectation("cuda-error", "SilentFallback: silently fell back to nccl",
                       f"group {g.name}: rank {r}'s ipc workspace allocation fails on a vote, "
                       f"every rank falls back to nccl", collateral=("not-best",))


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
    Knob("rollback", (False,), _on_setup_failure(_leaks), "FH1", _provoke_setup_failure),
    Knob("agree", (False,), _on_setup_failure(_falls_out_of_step), "FH2", _provoke_setup_failure),
    Knob("report_fallback", (False,), _on_setup_failure(_falls_back_silently), "FH3", _provoke_setup_failure),
)


def get_knob(name: str) -> Knob:
    return next(k for k in KNOBS if k.name == name)


def draw(pid: str) -> tuple[str, Any]:
    rng = random.Random(seed_of("knob", pid))
    k = rng.choice(KNOBS)
    return k.name, rng.choice(k.values)


def provocation(sc: Scenario, pid: str) -> tuple[Fault, ...]:
    """The faults knob scenario `pid` adds to its base draw `sc` (see Knob.provoke)."""
    k = get_knob(sc.extra["knob"][0])
    return () if k.provoke is None else k.provoke(sc, random.Random(seed_of("knob-provoke", pid)))


def policy_of(knob: tuple[str, Any]) -> Policy:
    name, value = knob
    return Policy(name=f"knob-{name}-{value}", order=ORDER, params=params_of(name, value))


def is_knob_id(seed: int, index: int) -> bool:
    return seed_of("knob-pick", seed, index) % KNOB_EVERY == 0


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
    missing = [e for e in exps if not any(e.shown_by(f) for f in v.failures)]
    if any(e.kind == "cuda-error" for e in exps if e not in missing):
        # An expected error ends its ranks' run, and the peers it leaves waiting in later
        # groups end theirs: a rank that fails keeps no result, so the wrong pieces another
        # group's ranks got before may never be checked (sweep k14-5109: tp3's error hid
        # tp1's permuted reduce-scatter). Numerics expected elsewhere are then not owed.
        missing = [e for e in missing if e.kind != "numerics"]
    if missing:
        e = missing[0]
        v.add("knob-outcome", f"{label} must fail the run with {e.kind} ({e.detail}): {e.why}; "
                              f"it showed {', '.join(v.kinds) or 'no failure'}")
        return
    # Collateral of the expected failure: peers left waiting (cuda-error), a teardown without
    # agreement (leak flags, row L15).
    absorbed = ({e.kind for e in exps} | {c for e in exps for c in e.collateral}
                | ({"cuda-error", "leak"} if any(e.kind == "cuda-error" for e in exps) else set()))
    v.notes += [f"expected under {label} ({exps[0].why}): {f.kind}: {f.detail[:200]}"
                for f in v.failures if f.kind in absorbed]
    v.failures[:] = [f for f in v.failures if f.kind not in absorbed]
