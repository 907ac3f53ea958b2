"""The oracle: a verdict on a run, against which backends are legal from the topology alone
(commsim.scenario.legal).

Ground truth is the scenario's cluster after its faults. The oracle never calls a backend's
`eligibility` or `accepts` and never reads a discovery view: each backend restates its
documented rules over the topology in its `truth` classmethod (rows L5-L10,
V2-V8, M1-M7, F1-F4, B2-B6) and declares its per-call limits, over the pairwise facts of
commsim.topology.truth, so a wrong eligibility rule shows up as a disagreement instead of
being agreed with.

    legal = legal_backends(sc)           # {(group, op, size, dtype): ("fabric", "nccl")}
    v = judge(sc, run_scenario(sc))      # Verdict; v.ok, v.by_kind()
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from commsim.backends import nccl as nccl_backend
from commsim.policy import Policy, resolve
from commsim.scenario import memo
from commsim.scenario.failure_kinds import KINDS
from commsim.scenario.faults import OOM_ERRORS, get_fault, injected_errors
from commsim.scenario.knobs import judge_knob
from commsim.scenario.legal import group_truth, legal_backends
from commsim.scenario.model import Scenario
from commsim.scenario.nccl_truth import NcclOutcome, nccl_outcome


# -- the verdict ----------------------------------------------------------------------------------
@dataclass
class Failure:
    kind: str
    detail: str


@dataclass
class Verdict:
    id: str
    failures: list[Failure] = field(default_factory=list)
    backends: dict[tuple[str, str, int, str], str] = field(default_factory=dict)
    legal: dict[tuple[str, str, int, str], tuple[str, ...]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)       # not failures: worth a look
    checked_determinism: bool = False

    @property
    def ok(self) -> bool:
        return not self.failures

    def by_kind(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for f in self.failures:
            out[f.kind] = out.get(f.kind, 0) + 1
        return out

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(k for k in KINDS if any(f.kind == k for f in self.failures))

    def add(self, kind: str, detail: str) -> None:
        assert kind in KINDS, kind
        self.failures.append(Failure(kind, detail))

    def to_json(self) -> dict:
        return {"id": self.id, "ok": self.ok, "kinds": list(self.kinds),
                "failures": [{"kind": f.kind, "detail": f.detail} for f in self.failures],
                "notes": self.notes,
                "backends": {"|".join(map(str, k)): b for k, b in sorted(self.backends.items())}}

    def render(self) -> str:
        lines = [f"verdict {self.id}: {'clean' if self.ok else 'FAIL ' + ', '.join(self.kinds)}"]
        for k, b in sorted(self.backends.items()):
            legal = self.legal.get(k, ())
            lines.append(f"  {k[0]} {k[1]} {k[2]} B {k[3]}: chose {b}; legal {', '.join(legal) or '-'}"
                         f"{'; best ' + legal[0] if legal else ''}")
        for f in self.failures:
            lines.append(f"  FAIL {f.kind}: {f.detail}")
        for n in self.notes:
            lines.append(f"  note: {n}")
        return "\n".join(lines)


def fingerprint(res: Any) -> tuple:
    """What two runs with one seed must agree on."""
    return (res.trace_hash, tuple(sorted(res.backends.items())),
            tuple((e.rank, e.step, e.name) for e in res.errors), len(res.mismatches), len(res.leaks))


def judge(sc: Scenario, res: Any, again: Any = None, policy: Policy | None = None) -> Verdict:
    """Check one run (and, when given, a second run with the same seed) against the oracle."""
    v = Verdict(sc.extra.get("id", sc.name) if sc.extra else sc.name)
    pol = policy or resolve(sc.policy, sc.path.parent if sc.path is not None else None)
    truths = {g.name: group_truth(sc, g.ranks, g.name, tuple(pol.order)) for g in sc.groups}
    legal = legal_backends(sc, pol, truths)
    v.legal, v.backends = legal, dict(res.backends)
    # Injected driver failures (out of memory, a failing set-up call): the error they cause
    # on the faulted rank, voted to its group, is expected; a backend they knock out may be
    # skipped in favour of the next legal one.
    oom = [f for f in sc.faults if get_fault(f.kind).injects is not None]
    oom_ranks = {f.rank for f in oom if f.rank is not None}
    errored = bool(res.errors)
    must_fail = {name: set(gt.setup_fails) for name, gt in truths.items()}
    for key, ok_set in legal.items():
        chosen = res.backends.get(key)
        if chosen is None:
            if not errored:
                v.add("illegal-backend", f"{key[0]} {key[1]} {key[2]} B {key[3]}: no backend recorded "
                                         f"and no error")
            continue
        if chosen not in ok_set:
            v.add("illegal-backend", f"{key[0]} {key[1]} {key[2]} B {key[3]}: chose {chosen}, legal: "
                                     f"{', '.join(ok_set)}")
        elif chosen != ok_set[0]:
            # Under an oom fault a better backend may have lost its set-up to the injected
            # failure; only those (as the decision record says) may be skipped.
            skipped = ok_set[:ok_set.index(chosen)]
            failed = set(_setup_failed(res.explain.get(key[0], "")))
            demoted = failed if oom else failed & must_fail.get(key[0], set())
            if not set(skipped) <= demoted:
                v.add("not-best", f"{key[0]} {key[1]} {key[2]} B {key[3]}: chose {chosen}, best legal is "
                                  f"{ok_set[0]} (legal: {', '.join(ok_set)})")
    for f in res.failures:
        if f.startswith("ranks disagree"):
            v.add("illegal-backend", f)
    # Errors: with an oom fault, the out-of-memory of the faulted rank, reported on any rank
    # (a collective set-up reports the origin on all), is the injected failure. Anything
    # else is not: a peer left hanging or a collective mismatch means the ranks fell out of
    # step, and that is a bug even when an injected fault started it.
    # NCCL's outcomes where the backend runs NCCL on the machine; else NCCL is exact.
    auto, env = bool(pol.params.get("nccl_auto_env", True)), tuple(sc.workload.nccl_env)
    nccl = {g.name: memo.nccl_outcome(sc.cluster, truths[g.name].gpus, env, auto, partial(
                nccl_outcome, sc.cluster, truths[g.name].gpus, env, auto))
            if nccl_backend.on_machine(pol.params) else NcclOutcome() for g in sc.groups}
    for e in res.errors:
        if oom and (_caused_by_oom(sc, e, oom_ranks) or _nccl_knocked_out(res, e)):
            v.notes.append(f"expected under the oom fault: rank {e.rank} at {e.step}: {e.name}")
            continue
        why = _nccl_expected(sc, nccl, e)
        if why:
            v.notes.append(f"NCCL's outcome: rank {e.rank} at {e.step}: {e.name} ({why})")
            continue
        v.add("cuda-error", f"rank {e.rank} (GPU {sc.placement[e.rank]}) at {e.step}: {e.name}: "
                            f"{e.message[:300]}")
    for m in res.mismatches:
        why = next((o.wrong for g, o in nccl.items() if o.wrong and m.startswith(f"group {g} ")), "")
        if why:
            v.notes.append(f"NCCL's outcome: {m[:200]} ({why})")
            continue
        v.add("numerics", m)
    _judge_nccl(sc, res, nccl, v)
    for text in res.unmet:     # an outcome the generator expected (generate.draw_outcome)
        v.add("outcome", text)
    if res.leaks:
        shown = "; ".join(res.leaks[:4]) + (f"; ... {len(res.leaks) - 4} more" if len(res.leaks) > 4 else "")
        v.add("leak", f"{len(res.leaks)} ledger item(s) left after close: {shown}")
    for fl in res.flags:
        v.add("leak", f"undefined behaviour: {fl}")
    if again is not None:
        v.checked_determinism = True
        a, b = fingerprint(res), fingerprint(again)
        if a != b:
            what = [n for n, x, y in zip(("trace hash", "backends", "errors", "mismatches", "leaks"), a, b) if x != y]
            v.add("nondeterministic", f"two runs with seed {sc.seed} differ in {', '.join(what)}"
                                      f" (trace {a[0][:12]} vs {b[0][:12]})")
    # What the communicator admitted (its decision record), against what the topology allows:
    # admitting an illegal backend is a wrong eligibility rule even when its set-up then fails
    # and the communicator falls back to a legal one.
    for gname, text in res.explain.items():
        gt = truths.get(gname)
        if gt is None:
            continue
        for line in text.splitlines():
            m = _ADMITTED.match(line)
            if not m or m.group(1) in gt.legal:
                continue
            b, how = m.group(1), m.group(2)
            v.add("illegal-backend",
                  f"group {gname}: eligibility admitted {b}, which the topology does not allow "
                  f"({gt.why_not.get(b, '?')})"
                  + ("; its set-up failed and the communicator fell back" if how.startswith("declined") else ""))
    if sc.extra and sc.extra.get("knob"):
        # A shortcut-policy knob scenario: what the knob must do, from the truth (knobs.py).
        judge_knob(sc, v)
    return v


def _nccl_setup_failed(text: str) -> bool:
    """A peer's exit with NCCL's set-up failure, as RankFailed quotes its repr (either quote)."""
    return 'SetupFailed("nccl' in text or "SetupFailed('nccl" in text


def _nccl_expected(sc: Scenario, nccl: dict[str, NcclOutcome], e: Any) -> str:
    """Why error `e` is what NCCL must do on its group (nccl_truth.py), or ""."""
    text = f"{e.name} {e.message}"
    for g in sc.groups:
        o = nccl[g.name]
        if e.rank not in g.ranks or o.clean:
            continue
        if o.hangs and e.name == "hang" and "NCCL nccl." in e.message:
            return o.hangs
        if o.fails and (e.name.startswith("nccl") or "no backend accepts" in text):
            return o.fails
    if e.name == "RankFailed" and ("no backend accepts" in text or _nccl_setup_failed(text)):
        # a peer of another group stopped at its own group's expected NCCL failure
        return next((o.fails for o in nccl.values() if o.fails), "")
    if e.name == "hang" and ("NCCL nccl." in e.message or "(tag 'nccl." in e.message):
        # a rank of another group waits, in a collective of a group they share, on a peer
        # stuck in its own group's expected NCCL hang
        return next((o.hangs for o in nccl.values() if o.hangs), "")
    return ""


def _nccl_knocked_out(res: Any, e: Any) -> bool:
    """Under an injected driver failure: an op no backend was left to run. `nccl`, the
    fallback, accepts every op once set up, so none accepting means NCCL lost its set-up
    too (to the injected failure: the run's only fault that fails calls); or a peer's exit
    from that."""
    text = f"{e.name} {e.message}"
    return "no backend accepts" in text or (e.name == "RankFailed" and _nccl_setup_failed(text))


def _judge_nccl(sc: Scenario, res: Any, nccl: dict[str, NcclOutcome], v: Verdict) -> None:
    """What NCCL must do where it ran: a collective over a pair that drops or corrupts peer
    writes must hang or be wrong, and a set-up that must fail must not carry an op."""
    for g in sc.groups:
        o = nccl[g.name]
        ran = sorted(k for k, b in res.backends.items() if k[0] == g.name and b == "nccl")
        if o.clean or not ran:
            continue
        k = ran[0]
        where = f"group {g.name}: nccl ran {k[1]} {k[2]} B {k[3]}"
        if o.fails:
            v.add("nccl-outcome", f"{where}, but its set-up must fail ({o.fails})")
        elif o.hangs and not any(e.name == "hang" and e.rank in g.ranks for e in res.errors):
            v.add("nccl-outcome", f"{where} and completed, but it must hang ({o.hangs})")
        elif o.wrong and not res.errors and not any(m.startswith(f"group {g.name} ") for m in res.mismatches):
            v.add("nccl-outcome", f"{where} exactly, but its result must be wrong ({o.wrong})")


def _caused_by_oom(sc: Scenario, e: Any, oom_ranks: set[int]) -> bool:
    """An error that is the injected out-of-memory itself: the faulted rank's OOM, which a
    collective set-up reports on every rank of the group (`origin` is the failing world rank),
    or a peer that stopped because a rank died of that voted OOM. A hang or a
    collective mismatch is never excused: the ranks fell out of step."""
    text = f"{e.name} {e.message}"
    if "CollectiveMismatch" in text or "HangDetected" in text or e.name == "hang":
        return False
    # Any injected driver fault excuses its rank's out-of-memory too (an allocation retried
    # after the injected failure), as before the registry; plus what each kind injects.
    injected = set(OOM_ERRORS) | injected_errors(sc.faults)
    if e.name in injected:
        return e.origin in oom_ranks
    if e.name.startswith("nccl"):
        # NCCL's set-up failed on the faulted rank (its WARN names the injected code) or
        # learnt it from that rank (ncclRemoteError, its origin that rank).
        return e.origin in oom_ranks
    return e.name == "RankFailed" and "SetupFailed" in text and any(c in text for c in injected)


def _setup_failed(explain: str) -> list[str]:
    return [m.group(1) for m in map(_ADMITTED.match, explain.splitlines())
            if m and m.group(2).startswith("declined")]


_ADMITTED = re.compile(r"^  ([A-Za-z0-9_]+): (admitted|declined after set-up failure)")
