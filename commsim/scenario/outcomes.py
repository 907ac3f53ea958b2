"""Outcomes that are not CUDA errors, judged against a scenario's `[[expect]]`: wrong data
(with its largest error), NCCL's transport between two ranks, a fallback to a legal but
slower backend (with the cost model's predicted time of the chosen backend next to the best
legal one's), and undefined behaviour.

`judge_outcomes(res)` appends to `res.failures` what did not happen as expected and to
`res.outcomes` a line for each expectation met, and returns the mismatches and flags those
expectations account for (so the runner does not count them again as failures).
docs/scenario-format.md, `[[expect]]`, gives the keys.
"""

from __future__ import annotations

from typing import Any

from commsim.scenario.model import Expectation, Scenario
from commsim.scenario.reference import max_error_of

# `max_error` matches the run's largest absolute error to within this fraction: the inputs
# are a pure function of the seed, so the error is reproducible, but a printed figure is
# rounded.
MAX_ERROR_TOLERANCE = 0.01


def _unmet(res: Any, text: str) -> None:
    """An expectation of this module not met: a failure of the run, and kept apart
    (`res.unmet`) so the sweep's oracle can count it without the run's other failures."""
    res.failures.append(text)
    res.unmet.append(text)


def _about(e: Expectation, label: str) -> bool:
    """Whether a mismatch line ("group tp rank 0: all_reduce 4096 B bfloat16: ...") is about
    the expectation's group, op and size."""
    head = label.split(": ", 2)
    if len(head) < 3:
        return False
    where, what = head[0], head[1].split()
    if e.group is not None and not where.startswith(f"group {e.group} "):
        return False
    if e.op is not None and what[0] != e.op:
        return False
    return e.size is None or what[1] == str(e.size)


def _wrong_data(res: Any, e: Expectation) -> list[str]:
    hits = [m for m in res.mismatches if _about(e, m)]
    if not hits:
        _unmet(res, f"expected wrong data{_where(e)}; the results were "
                            f"{'not checked (the run failed first)' if res.errors else 'right'}")
        return []
    worst = max(max_error_of(m) for m in hits)
    if e.max_error is not None and not abs(worst - e.max_error) <= MAX_ERROR_TOLERANCE * e.max_error:
        _unmet(res, f"expected wrong data{_where(e)} with max error {e.max_error}; the "
                            f"largest error is {worst}")
        return hits
    res.outcomes.append(f"wrong data{_where(e)}: {len(hits)} result(s), max error {worst}")
    return hits


def _where(e: Expectation) -> str:
    parts = [f"group {e.group}" if e.group else "", e.op or "", f"{e.size} B" if e.size else ""]
    text = " ".join(p for p in parts if p)
    return f" in {text}" if text else ""


def _undefined(res: Any, e: Expectation) -> list[str]:
    hits = [f for f in res.flags if e.message is None or e.message in f]
    if not hits:
        _unmet(res, "expected undefined behaviour"
                            f"{f' saying {e.message!r}' if e.message else ''}; "
                            f"{'none happened' if not res.flags else 'flagged: ' + res.flags[0]}")
        return []
    res.outcomes.append(f"undefined behaviour: {hits[0]}")
    return hits


def _transport(res: Any, sc: Scenario, e: Expectation) -> None:
    """NCCL's transport between the pair, from what its set-up made on the machine where the
    run recorded it (`res.nccl_transports`), else from NCCL's rules over the scenario's
    topology (the nccl backend decided by the rules alone, or never set up)."""
    g = sc.group(e.group)
    a, b = (g.ranks.index(r) for r in e.pair)
    made = getattr(res, "nccl_transports", {}).get(g.name)
    if made is not None:
        got = next(((kind, via) for x, y, kind, via in made if {x, y} == {a, b}), None)
    else:
        from commsim.libmodels.nccl_rules import decide, machine_from_cluster, parse_env
        decision = decide(machine_from_cluster(sc.cluster, [sc.placement[r] for r in g.ranks]),
                          parse_env(dict(sc.workload.nccl_env)))
        if decision.init_error is not None:
            _unmet(res, f"expected NCCL transport {e.transport} between ranks {e.pair[0]} "
                        f"and {e.pair[1]}; NCCL's init fails: {decision.init_error[0]}")
            return
        got = next(((t.kind, t.via) for t in decision.transports if {t.a, t.b} == {a, b}), None)
    text = f"{got[0]} via {got[1]}" if got is not None else "none"
    if got is None or not (e.transport == got[0] or e.transport in text):
        _unmet(res, f"expected NCCL transport {e.transport} between ranks {e.pair[0]} and "
                    f"{e.pair[1]} (group {g.name}); NCCL uses {text}")
        return
    res.outcomes.append(f"NCCL transport between ranks {e.pair[0]} and {e.pair[1]}: {text}")


def _fallback(res: Any, sc: Scenario, e: Expectation, legal: dict, fabric_of: Any) -> None:
    from commsim import cost_model
    from commsim.scenario.legal import op_nbytes
    hits = [(k, b) for k, b in res.backends.items() if k[0] == e.group
            and (e.op is None or k[1] == e.op) and (e.size is None or k[2] == e.size)]
    if not hits:
        _unmet(res, f"expected a fallback to {e.fallback} in group {e.group}: no such op ran")
        return
    for k, b in hits:
        ok = legal.get(k, ())
        label = f"group {k[0]} {k[1]} {k[2]} B {k[3]}"
        if b != e.fallback:
            _unmet(res, f"{label}: chose {b}, expected a fallback to {e.fallback}")
            continue
        if b not in ok:
            _unmet(res, f"{label}: {b} is not legal here (legal: {', '.join(ok)})")
            continue
        nbytes = op_nbytes(k[1], k[2], k[3], len(sc.group(k[0]).ranks))
        times = {x: _predicted(cost_model, x, nbytes, fabric_of(k[0])) for x in ok}
        known = {x: t for x, t in times.items() if t is not None}
        best = min(known, key=known.get) if known else None
        if best is None or times.get(b) is None:
            _unmet(res, f"{label}: no cost model for {b} or its rivals; a fallback is "
                                f"judged by predicted time")
            continue
        if known[b] <= known[best]:
            _unmet(res, f"{label}: {b} (predicted {_us(known[b])}) is as fast as the "
                                f"best legal backend, {best} ({_us(known[best])}): not a "
                                f"fallback to a slower path")
            continue
        res.outcomes.append(f"{label}: fell back to {b} (predicted {_us(known[b])}); the best "
                            f"legal is {best} (predicted {_us(known[best])})")


def _predicted(cost_model: Any, backend: str, nbytes: int, fabric: Any) -> float | None:
    try:
        return cost_model.best(backend, nbytes, fabric)[1]
    except (KeyError, ValueError):
        return None          # a backend without a cost family (a plugin)


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us"


def judge_outcomes(res: Any) -> tuple[list[str], list[str]]:
    """Judge the non-error expectations of `res.scenario`; (mismatches, flags) they expected."""
    sc = res.scenario
    wanted_mismatch: list[str] = []
    wanted_flags: list[str] = []
    legal, fabrics = None, {}
    for e in sc.expectations:
        if e.failure and not res.expects_failure:
            continue          # under another policy than the file's, the file must pass
        if e.wrong_data:
            wanted_mismatch += _wrong_data(res, e)
        elif e.undefined:
            wanted_flags += _undefined(res, e)
        elif e.transport:
            _transport(res, sc, e)
        elif e.fallback:
            if legal is None:
                from commsim.cost_model import group_fabric
                from commsim.policy import resolve
                from commsim.scenario.legal import legal_backends
                try:
                    pol = resolve(res.policy, sc.path.parent if sc.path else None)
                except Exception:
                    pol = None        # a Policy object the caller passed: the file's own
                legal = legal_backends(sc, pol)

                def fabric_of(name: str, _gf=group_fabric) -> Any:
                    if name not in fabrics:
                        fabrics[name] = _gf(sc.cluster, [sc.placement[r] for r in sc.group(name).ranks])
                    return fabrics[name]
            _fallback(res, sc, e, legal, fabric_of)
    return wanted_mismatch, wanted_flags
