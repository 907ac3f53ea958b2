"""Mode agreement: a program run in procs mode (one OS process per rank) and in inproc mode
(greenlets under the seeded scheduler) on the same machine and seed must get the same
verdict: the same root cause (rank, kind, failing API, code, rule) and the same outcome per
rank. The one harness for it: the hosting, NCCL and throughput tests hold their programs to
it through `modes_agree`, rather than comparing verdicts their own way.

Where the two modes cannot agree, the difference says why. The one known reason is exit
order: a rank whose failure followed a peer's exit (a knock-on, cause.py) in one mode may
have made the same call before that peer exited in the other: which comes first is a race
between real processes, and a fixed order under the scheduler.

The same comparison holds procs mode's two ways of starting ranks to one verdict
(`compare(..., STARTS)`): forked from the warm zygote, and fresh interpreters.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field, replace

from commsim.launch.cause import causes, root_cause
from commsim.launch.config import RunConfig
from commsim.launch.run import execute
from commsim.launch.verdict import ProcResult, Verdict

MODES = ("procs", "inproc")
STARTS = ("zygote", "fresh")        # procs mode: ranks forked from the zygote, or fresh ones


def rank_outcome(p: ProcResult, knock_on: bool) -> str:
    """What must agree about one rank: ok, hang, knock-on, or how it failed (the CUDA call,
    code and rule; else its exit status)."""
    if p.ok:
        return "ok"
    if knock_on:
        return "knock-on"
    if p.status == "hang":
        return "hang"
    e = p.first_cuda_error
    if e:
        return f"{e['api']} -> {e['code']}" + (f" (row {e['rule']})" if e.get("rule") else "")
    if p.status == "ok":
        return "leak"
    return f"exit {p.exit_code}"


@dataclass(frozen=True)
class Outcome:
    root: tuple | None                  # (rank, kind, api, code, rule) of the root cause
    ranks: tuple[tuple[int, str], ...]  # (rank, rank_outcome) for every rank

    @classmethod
    def of(cls, v: Verdict) -> "Outcome":
        knock = {id(p) for p, c in causes(v) if c.knock_on}
        rc = root_cause(v)
        root = None
        if rc is not None:
            e = rc.proc.first_cuda_error or {}
            root = (rc.proc.rank, rc.cause.kind, e.get("api"), e.get("code"), e.get("rule"))
        return cls(root, tuple((p.rank, rank_outcome(p, id(p) in knock)) for p in v.ranks))


@dataclass
class Agreement:
    verdicts: dict[str, Verdict]
    differences: list[str] = field(default_factory=list)
    why: str = ""                       # why the modes cannot agree, when they do not

    @property
    def agree(self) -> bool:
        return not self.differences

    def text(self) -> str:
        a, b = self.verdicts
        if self.agree:
            return f"{a} and {b} agree"
        return "\n".join([f"{a} and {b} disagree:"] + [f"  {d}" for d in self.differences]
                         + ([f"  why: {self.why}"] if self.why else []))


def compare(procs: Verdict, inproc: Verdict, names: tuple[str, str] = MODES) -> Agreement:
    """The two verdicts' agreement; `names`: what ran each (procs/inproc, zygote/fresh)."""
    a, b = Outcome.of(procs), Outcome.of(inproc)
    na, nb = names
    out = Agreement({na: procs, nb: inproc})
    if a.root != b.root:
        out.differences.append(f"root cause: {na} {a.root}, {nb} {b.root}")
    ra, rb = dict(a.ranks), dict(b.ranks)
    order = []
    for r in sorted(set(ra) | set(rb)):
        if ra.get(r) != rb.get(r):
            out.differences.append(f"rank {r}: {na} {ra.get(r)}, {nb} {rb.get(r)}")
            if "knock-on" in (ra.get(r), rb.get(r)):
                order.append(r)
    # A root cause that moved to another rank with the same failure is the same race when the
    # lower of the two (the root in one mode) is a knock-on in the other: which peer exited
    # first decided which rank met the failure first.
    moved = (a.root != b.root and a.root is not None and b.root is not None
             and a.root[1:] == b.root[1:] and min(a.root[0], b.root[0]) in order)
    rank_differences = len(out.differences) - (a.root != b.root)
    if order and len(order) == rank_differences and (a.root == b.root or moved):
        out.why = (f"exit order: rank(s) {', '.join(map(str, order))} failed after a peer "
                   f"exited in one mode and before it in the other")
        if moved:
            out.why += (f"; the first failure is rank {a.root[0]} in {na} and rank "
                        f"{b.root[0]} in {nb}, the same error")
    return out


def _run(cfg: RunConfig, **change: object) -> Verdict:
    sink = io.StringIO()
    return execute(replace(cfg, placement=[], run_dir="", shm_prefix="", **change),
                   out=sink, err=sink, echo=False)


def modes_agree(cfg: RunConfig) -> Agreement:
    """Run cfg's program in both modes (cfg.mode is ignored) and compare the verdicts."""
    return compare(*(_run(cfg, mode=m) for m in MODES))
