"""The verdict of a hosted run: per process what happened, and what to do to see it again.

Per rank: its exit status, the exception that ended it, the first CUDA error (API, code, name
and the call site in the user's code), a hang and its diagnosis, the ledger residue at exit
(mappings never closed, memory freed while peers map it). Processes a rank spawned are listed
as workers. The run fails (exit status 1) when any rank or worker failed or hung; residue at
exit is listed with where each item was created, and fails the run only under
`--residue fail`: on real hardware a process's exit destroys its contexts, and destroying a
context "destroys and cleans up all resources associated with the context" (cuCtxDestroy,
CUDA driver API), so a correct program that exits holding memory is not a failing one. A
leak matters where a program re-creates its communicators in one process; `--residue fail`
is for checking that.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from commsim.hosting.surfaces.sockets import BLOCKING_SOCKETS
from commsim.launch.cause import root_cause_lines
from commsim.launch.config import RunConfig
from commsim.launch.torch_build import torch_build


@dataclass
class ProcResult:
    slot: int
    rank: int
    host: str
    pid: int
    exit_code: int | None = None          # None: a worker (its status comes from its report)
    status: str = "ok"                    # ok | failed | hang | killed
    exception: str | None = None          # "RuntimeError: CUDART error: invalid resource handle"
    first_cuda_error: dict | None = None  # api, code, name, text, site
    cuda_errors: int = 0
    residue: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    hang: str | None = None               # diagnosis (inproc) or the stacks at the timeout (procs)
    worker: bool = False
    residue_fails: bool = False           # set from the run's --residue by its Verdict

    @property
    def ok(self) -> bool:
        return self.status == "ok" and not (self.residue_fails and self.residue)

    def headline(self) -> str:
        if self.status == "ok":
            if not self.residue:
                return "ok"
            held = f"exited holding {len(self.residue)} item(s)"
            return held if self.residue_fails else f"ok ({held}, released by the process's exit)"
        if self.status == "hang":
            return "HANG" + (f": {self.exception}" if self.exception else "")
        code = "" if self.exit_code is None else f"exit {self.exit_code}"
        return ": ".join(x for x in (code or self.status, self.exception) if x)

    def signature(self) -> tuple:
        """What must agree between modes (no pids, no timings)."""
        err = self.first_cuda_error or {}
        return (self.rank, self.host, self.status, self.exit_code, self.exception,
                err.get("api"), err.get("name"), bool(self.residue))


# Why an inproc run went to procs mode (or ended): each cause's words, said once.
SOCKETS = BLOCKING_SOCKETS
STALE_MODULES = ("modules imported before hosting was installed hold real hosted modules "
                 "(a module-level import at test collection); fresh processes import them hosted")
SWITCHED = "run in procs mode, not inproc: {}"
ENDED = "ended in inproc mode: {} (--mode procs)"


@dataclass
class Verdict:
    cfg: RunConfig
    procs: list[ProcResult]
    wall_s: float = 0.0
    trace_hash: str | None = None
    flags: list[str] = field(default_factory=list)
    # inproc: the call that needs real processes (its run was ended there); a procs run
    # started for that reason carries it too, and says so
    needs_procs: str | None = None
    procs_reason: str = SOCKETS       # what about `needs_procs` needs processes
    # procs: why its ranks are fresh interpreters, not forked from the warm zygote (when the
    # run did not ask for fresh ones itself)
    fresh: str | None = None

    def __post_init__(self) -> None:
        for p in self.procs:
            p.residue_fails = self.cfg.residue == "fail"

    @property
    def ranks(self) -> list[ProcResult]:
        return [p for p in self.procs if not p.worker]

    @property
    def workers(self) -> list[ProcResult]:
        return [p for p in self.procs if p.worker]

    @property
    def ok(self) -> bool:
        return (all(p.ok for p in self.procs) and len(self.ranks) == self.cfg.world_size
                and not self.undefined)

    @property
    def undefined(self) -> list[str]:
        """The undefined behaviour that fails this run (none with --allow-undefined)."""
        from commsim.sim.fabric import is_undefined
        return [] if self.cfg.allow_undefined else [f for f in self.flags if is_undefined(f)]

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    @property
    def residue(self) -> int:
        return sum(len(p.residue) for p in self.procs)

    def first_error(self) -> ProcResult | None:
        return next((p for p in self.procs if not p.ok), None)

    def format(self, verbose: bool = False) -> str:
        """The verdict: a failing run leads with its root cause (cause.root_cause_lines) and
        lists every process only when `verbose`; a passing run lists them (one line each)."""
        c = self.cfg
        machine = f"scenario {c.scenario}" if c.scenario else c.machine
        hosts = c.num_hosts
        head = (f"commsim exec: {'ok' if self.ok else 'FAIL'}: {c.world_size} rank(s) on {machine} "
                f"({hosts} host(s) x {c.nproc_per_host}), mode {c.mode}, seed {c.seed}, "
                f"visible {c.visible}, {torch_build()}, {self.wall_s:.1f} s")
        lines = [head]
        if self.needs_procs:
            said = (SWITCHED if c.mode == "procs" else ENDED).format(self.procs_reason)
            lines.append(f"  {said}: {self.needs_procs}")
        if self.fresh:
            lines.append(f"  fresh interpreters, not forked from the warm zygote: {self.fresh}")
        if not self.ok:
            lines += root_cause_lines(self)
        if self.undefined:
            lines.append(f"Undefined behaviour ({len(self.undefined)} event(s); the run fails "
                         f"on it unless --allow-undefined):")
            lines += [f"  {f}" for f in self.undefined]
        if self.ok or verbose:
            lines += self._listing()
        elif self.residue:
            lines.append(f"  residue at exit: {self.residue} item(s) on "
                         f"{sum(1 for p in self.procs if p.residue)} process(es)")
        if not self.ok and not verbose:
            lines.append("  (-v: every process, its notes and residue)")
        missing = c.world_size - len(self.ranks)
        if missing:
            lines.append(f"  {missing} rank(s) left no result")
        from commsim.sim.fabric import is_undefined
        for f in self.flags:
            if f not in self.undefined:
                allowed = self.cfg.allow_undefined and is_undefined(f)
                lines.append(f"  flagged{' (allowed)' if allowed else ''}: {f}")
        if self.trace_hash:
            lines.append(f"  schedule trace {self.trace_hash}")
        lines.append(f"replay: {c.replay_command()}")
        return "\n".join(lines)

    def _listing(self) -> list[str]:
        c = self.cfg
        lines = []
        for p in self.procs:
            who = (f"worker (slot {p.slot}) of rank {p.rank}" if p.worker else f"rank {p.rank}")
            gpu = "" if p.worker else f", GPU {c.placement[p.rank][1]}"
            lines.append(f"  {who} ({p.host}{gpu}, pid {p.pid}): {p.headline()}")
            if p.first_cuda_error:
                e = p.first_cuda_error
                lines.append(f"      first CUDA error: {e['api']} -> {e['name']} ({e['code']}): "
                             f"{e['text']}, called at {e['site']}")
            for n in p.notes:
                lines.append(f"      note: {n}")
            if p.hang:
                lines.append("      hang diagnosis:")
                lines += [f"        {x}" for x in p.hang.strip().splitlines()[:40]]
            if p.residue:
                lines.append(f"      residue at exit: {len(p.residue)} item(s)")
                lines += [f"        {x}" for x in p.residue[:12]]
                if len(p.residue) > 12:
                    lines.append(f"        ... and {len(p.residue) - 12} more")
        return lines

    def summary(self) -> dict[str, Any]:
        return {"ok": self.ok, "ranks": [p.signature() for p in self.ranks],
                "workers": len(self.workers), "residue": self.residue}
