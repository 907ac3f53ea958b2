"""Run a scenario: simulated processes on its placement, a communicator per group, the
workload checked against a float64 reference, expectations compared, the ledger audited.

A run is a function of (scenario, seed): the fabric, the scheduler and the inputs all derive
from `scenario.seed`, and `RunResult.trace_hash` fingerprints the interleaving.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..backends.base import SetupFailed
from ..communicator import Communicator
from ..driver import CudaError
from ..group import LocalWorld
from ..group.errors import GroupError, HangDetected
from ..policy import Policy, resolve
from ..sim import SimFabric, spawn_driver
from ..sim.faults import CallFault, ProcessFaults, code_by_name
from .model import Scenario

TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Tolerances against the float64 reference: inputs are exact in every dtype, so the error is
# the final rounding of a float32 sum back into the dtype (one ulp of the result).
RTOL = {"float32": 1e-6, "float16": 1e-3, "bfloat16": 8e-3}


@dataclass
class RankError:
    rank: int
    step: str
    name: str
    message: str


@dataclass
class RunResult:
    scenario: Scenario
    backends: dict[tuple[str, str, int, str], str] = field(default_factory=dict)
    mismatches: list[str] = field(default_factory=list)       # numerics
    errors: list[RankError] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    explain: dict[str, str] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)         # unmet expectations
    trace_hash: str = ""

    @property
    def ok(self) -> bool:
        return not self.failures

    def replay_command(self) -> str:
        p = self.scenario.path
        return f"commsim run {p if p else self.scenario.name} --seed {self.scenario.seed}"


def _faults_for(sc: Scenario, rank: int) -> ProcessFaults:
    pf = ProcessFaults()
    for f in sc.driver_faults:
        if f.rank != rank:
            continue
        if f.kind == "oom":
            pf.oom_at = f.at_allocation
        else:
            pf.calls.append(CallFault(f.api, code_by_name(f.code), f.nth))
    return pf


def make_input(seed: int, group: str, rank: int, op: str, numel: int, dtype: str) -> torch.Tensor:
    """Small integers: exact in float16/bfloat16, so the float64 reference is exact too."""
    g = torch.Generator().manual_seed(hash((seed, group, rank, op, numel, dtype)) & 0x7FFFFFFF)
    return torch.randint(-8, 9, (numel,), generator=g).to(TORCH[dtype])


def _error_name(e: BaseException) -> tuple[str, str]:
    if isinstance(e, SetupFailed):
        inner = e.error
        return (inner.name if isinstance(inner, CudaError) else "setup_failed"), str(e)
    if isinstance(e, CudaError):
        return e.name, str(e)
    if isinstance(e, HangDetected):
        return "hang", str(e)
    if isinstance(e, GroupError):
        return type(e).__name__, str(e)
    return type(e).__name__, str(e)


def run_scenario(sc: Scenario, policy: Policy | str | None = None, seed: int | None = None) -> RunResult:
    seed = sc.seed if seed is None else seed
    pol = resolve(policy if policy is not None else sc.policy,
                  sc.path.parent if sc.path is not None else None)
    res = RunResult(sc)
    fabric = SimFabric(sc.cluster, seed)
    drivers = [spawn_driver(fabric, g, _faults_for(sc, r)) for r, g in enumerate(sc.placement)]
    world = LocalWorld(sc.world_size, seed)
    wl = sc.workload
    # Inputs and the float64 reference are a pure function of (seed, group, op, size, dtype);
    # made once per run and shared read-only by the ranks (they stand for each rank's own data,
    # never cross the group layer, so sharing them does not bypass the process boundary).
    memo: dict[tuple, tuple[list[torch.Tensor], torch.Tensor]] = {}

    def inputs_and_sum(gname: str, size_: int, op: str, numel: int, dt: str):
        key = (gname, op, numel, dt, size_)
        if key not in memo:
            xs = [make_input(seed, gname, k, op, numel, dt) for k in range(size_)]
            total = torch.stack([x.double() for x in xs]).sum(0) if op != "all_gather" else torch.cat([x.double() for x in xs])
            memo[key] = (xs, total)
        return memo[key]

    def rank_main(wg: Any) -> dict:
        r = wg.rank
        mine: dict = {"backends": {}, "mismatch": [], "explain": {}}
        subs = []
        for g in sc.groups:
            sub = wg.new_subgroup(list(g.ranks), g.name, tag=f"create group {g.name}")
            if sub is not None:
                subs.append((g, sub))
        for g, sub in subs:
            state = {"step": "discover"}
            comm = None
            try:
                comm = Communicator(sub, drivers[r], pol)
                mine["explain"][g.name] = comm.explain()
                for rep in range(2 if wl.graph_capture else 1):
                    ctx = comm.capture(discard=wl.discard_capture) if rep == 1 else None
                    if ctx is not None:
                        ctx.__enter__()
                        state["step"] = "capture"
                    for op in wl.ops:
                        for size in wl.sizes:
                            for dt in wl.dtypes:
                                esz = torch.empty(0, dtype=TORCH[dt]).element_size()
                                numel = max(size // esz, 1)
                                if op == "reduce_scatter":
                                    numel = max(numel // sub.size, 1) * sub.size
                                state["step"] = "capture" if ctx else "op"
                                inputs, total = inputs_and_sum(g.name, sub.size, op, numel, dt)
                                x = inputs[sub.rank]
                                if op == "all_reduce_rmsnorm":
                                    resid = torch.ones(numel, dtype=TORCH[dt])
                                    w = torch.ones(numel, dtype=TORCH[dt])
                                    out, y = comm.all_reduce_rmsnorm(x, resid, w)
                                    ref = total + 1.0
                                else:
                                    y = getattr(comm, op)(x)
                                    ref = total.chunk(sub.size)[sub.rank] if op == "reduce_scatter" else total
                                tol = RTOL[dt] * ref.abs().max().item() + 1e-6
                                err = (y.double() - ref).abs().max().item() if y.shape == ref.shape else float("inf")
                                if err > tol:
                                    mine["mismatch"].append(
                                        f"group {g.name} rank {sub.rank}: {op} {size} B {dt}: max error {err} > {tol}")
                                mine["backends"][(g.name, op, size, dt)] = comm.chosen(op, numel * esz, dt)
                    if ctx is not None:
                        state["step"] = "register"
                        ctx.__exit__(None, None, None)
                mine["explain"][g.name] = comm.explain()
            except BaseException as e:
                if not hasattr(e, "commsim_step"):   # Communicator.__init__ tags its own
                    e.commsim_step = state["step"] if state["step"] in ("capture", "register") \
                        else (comm.step if comm is not None else "init")
                raise
            finally:
                if comm is not None:
                    comm.close()
        return mine

    outcomes = world.run(rank_main)
    res.trace_hash = world.trace_hash()
    for r, o in enumerate(outcomes):
        if o.ok:
            for k, b in o.value["backends"].items():
                prev = res.backends.setdefault(k, b)
                if prev != b:
                    res.failures.append(f"ranks disagree on the backend for {k}: {prev} vs {b}")
            res.mismatches += o.value["mismatch"]
            for gname, text in o.value["explain"].items():
                res.explain.setdefault(gname, text)
        else:
            name, msg = _error_name(o.error)
            res.errors.append(RankError(r, getattr(o.error, "commsim_step", "?"), name, msg))
    for r, d in enumerate(drivers):
        res.leaks += [f"rank {r}: {line}" for line in fabric.exit_process(d.proc.pid)]
    res.flags = list(fabric.flags)
    _judge(res)
    return res


def _judge(res: RunResult) -> None:
    sc = res.scenario
    expected_errors = [e for e in sc.expectations if e.error]
    leak_ok = any(e.leak for e in sc.expectations)
    for e in sc.expectations:
        if e.backend:
            hits = [(k, b) for k, b in res.backends.items()
                    if (e.group is None or k[0] == e.group) and (e.op is None or k[1] == e.op)
                    and (e.size is None or k[2] == e.size)]
            if not hits and not res.errors:
                res.failures.append(f"expected backend {e.backend} for group {e.group}: no such op ran")
            for k, b in hits:
                if b != e.backend:
                    res.failures.append(f"group {k[0]} {k[1]} {k[2]} B {k[3]}: chose {b}, expected {e.backend}")
        if e.error:
            if not any(x.name == e.error and (e.step is None or x.step == e.step)
                       and (e.rank is None or x.rank == e.rank) for x in res.errors):
                got = "; ".join(f"rank {x.rank} at {x.step}: {x.name}" for x in res.errors) or "no error"
                res.failures.append(f"expected {e.error} at step {e.step}"
                                    f"{f' on rank {e.rank}' if e.rank is not None else ''}; got {got}")
    if not expected_errors:
        for x in res.errors:
            res.failures.append(f"rank {x.rank} failed at {x.step}: {x.name}: {x.message}")
    res.failures += res.mismatches
    if res.leaks and not leak_ok:
        res.failures.append(f"{len(res.leaks)} ledger item(s) leaked: " + "; ".join(res.leaks[:3]))
