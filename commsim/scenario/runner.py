"""Run a scenario: simulated processes on its placement, a communicator per group, the
workload checked against a float64 reference, expectations compared, the ledger audited.

A run is a function of (scenario, seed): the fabric, the scheduler and the inputs all derive
from `scenario.seed`, and `RunResult.trace_hash` fingerprints the interleaving.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from ..backends.base import SetupFailed
from ..communicator import Communicator
from ..driver import CudaError
from ..group import LocalWorld
from ..runtime.diagnosis import GroupError, HangDetected
from ..policy import Policy, resolve
from ..sim import SimFabric, set_torch_threads, spawn_driver
from ..sim.faults import ProcessFaults
from .faults import arm_driver_faults
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
    origin: int | None = None     # world rank whose call failed (a collective set-up reports it on all)
    trace: str = ""               # the communicator's decision trace up to the failure


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
    policy: str = ""
    expects_failure: bool = False     # judged against the file's error/leak expectations
    pids: list[int] = field(default_factory=list)   # process mode: the rank processes' OS pids

    @property
    def ok(self) -> bool:
        return not self.failures

    def outcome(self) -> dict[str, Any]:
        """What must be identical between thread and process mode for one (scenario, seed):
        the verdict, the backend per group/op/size/dtype, each rank's error (name, step, the
        rank whose call failed), numerics, ledger residue, undefined-behaviour flags and the
        communicators' decision traces. Not the interleaving hash: process mode has none.
        Undefined-behaviour flags compare by the rows they cite: which peers still had memory
        open at a racy free depends on the interleaving, which is the OS's in process mode."""
        rows = sorted({row for f in self.flags for row in re.findall(r"row (\w+)", f)})
        return {"ok": self.ok, "backends": dict(sorted(self.backends.items())),
                "errors": [(e.rank, e.step, e.name, e.origin) for e in self.errors],
                "mismatches": list(self.mismatches), "leaks": list(self.leaks),
                "flag_rows": rows, "explain": dict(sorted(self.explain.items()))}

    def replay_command(self) -> str:
        p = self.scenario.path
        cmd = f"commsim run {p if p else self.scenario.name} --seed {self.scenario.seed}"
        if self.policy != self.scenario.policy:
            cmd += f" --policy {self.policy}"
        return cmd + (" --expect-failure" if self.expects_failure else "")


def faults_for(sc: Scenario, rank: int) -> ProcessFaults:
    return arm_driver_faults(sc.faults, rank)


def make_input(seed: int, group: str, rank: int, op: str, numel: int, dtype: str) -> torch.Tensor:
    """Small integers: exact in float16/bfloat16, so the float64 reference is exact too."""
    # hashlib, not hash(): str hashing is salted per process, and a replay in another process
    # must see the same inputs.
    key = hashlib.blake2b(repr((seed, group, rank, op, numel, dtype)).encode(), digest_size=8).digest()
    g = torch.Generator().manual_seed(int.from_bytes(key, "little") & 0x7FFFFFFFFFFFFFFF)
    return torch.randint(-8, 9, (numel,), generator=g).to(TORCH[dtype])


def _error_name(e: BaseException) -> tuple[str, str]:
    if isinstance(e, SetupFailed):
        inner = e.error
        return (inner.name if isinstance(inner, CudaError) else type(inner).__name__), str(e)
    if isinstance(e, CudaError):
        return e.name, str(e)
    if isinstance(e, HangDetected):
        return "hang", str(e)
    if isinstance(e, GroupError):
        return type(e).__name__, str(e)
    return type(e).__name__, str(e)


class Inputs:
    """Inputs and the float64 reference: a pure function of (seed, group, op, size, dtype),
    made once per process and read-only (they stand for each rank's own data and never cross
    the group layer, so sharing them between in-process ranks bypasses no process boundary)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.memo: dict[tuple, tuple[list[torch.Tensor], torch.Tensor]] = {}

    def get(self, gname: str, size_: int, op: str, numel: int, dt: str):
        key = (gname, op, numel, dt, size_)
        if key not in self.memo:
            xs = [make_input(self.seed, gname, k, op, numel, dt) for k in range(size_)]
            total = torch.stack([x.double() for x in xs]).sum(0) if op != "all_gather" else torch.cat([x.double() for x in xs])
            self.memo[key] = (xs, total)
        return self.memo[key]


def prepare(sc: Scenario, policy: Policy | str | None,
            seed: int | None) -> tuple[int, Policy, RunResult]:
    """The seed, resolved policy and an empty result for a run of `sc` (both modes)."""
    seed = sc.seed if seed is None else seed
    spec = policy if policy is not None else sc.policy
    pol = resolve(spec, sc.path.parent if sc.path is not None else None)
    res = RunResult(sc, policy=spec if isinstance(spec, str) else pol.name)
    # A file's error/leak expectations describe what its own policy does (a shortcut policy
    # reproducing a report); run under another policy the file must simply pass.
    res.expects_failure = (policy is None or policy == sc.policy) and any(
        e.error or e.leak for e in sc.expectations)
    return seed, pol, res


def run_rank(sc: Scenario, pol: Policy, wg: Any, driver: Any, inputs: Inputs,
             disabled_rules: frozenset[str] = frozenset()) -> dict:
    """One rank's whole scenario: its groups, a communicator per group, the workload checked
    against the reference, close. Runs the same as a greenlet (thread mode) or as the body
    of a rank process (process mode)."""
    r = wg.rank
    wl = sc.workload
    mine: dict = {"backends": {}, "mismatch": [], "explain": {}, "leaks": []}
    subs = []
    for g in sc.groups:
        sub = wg.new_subgroup(list(g.ranks), g.name, tag=f"create group {g.name}")
        if sub is not None:
            subs.append((g, sub))
    for g, sub in subs:
        state = {"step": "discover"}
        comm = None
        try:
            comm = Communicator(sub, driver, pol)
            mine["explain"][g.name] = comm.explain()
            before = driver.ledger.count("ipc_mapping")
            checks: list = []

            def verify() -> None:
                # After the op (eager) or after the graph's first replay (capture).
                for y, ref, dt, label in checks:
                    tol = RTOL[dt] * ref.abs().max().item() + 1e-6
                    err = (y.double() - ref).abs().max().item() if y.shape == ref.shape else float("inf")
                    if err > tol:
                        mine["mismatch"].append(f"{label}: max error {err} > {tol}")
                checks.clear()

            # Capture first, as serving stacks do (CUDA-graph memory profiling and capture
            # run before serving), then the eager pass.
            for mode in (("capture",) if wl.graph_capture else ()) + ("eager",):
                ctx = comm.capture(discard=wl.discard_capture) if mode == "capture" else None
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
                            xs, total = inputs.get(g.name, sub.size, op, numel, dt)
                            x = xs[sub.rank]
                            if op == "all_reduce_rmsnorm":
                                resid = torch.ones(numel, dtype=TORCH[dt])
                                w = torch.ones(numel, dtype=TORCH[dt])
                                out, y = comm.all_reduce_rmsnorm(x, resid, w)
                                ref = total + 1.0
                            else:
                                y = getattr(comm, op)(x)
                                ref = total.chunk(sub.size)[sub.rank] if op == "reduce_scatter" else total
                            checks.append((y, ref, dt, f"group {g.name} rank {sub.rank}: {op} {size} B {dt}"))
                            if ctx is None:
                                verify()
                            mine["backends"][(g.name, op, size, dt)] = comm.chosen(op, numel * esz, dt)
                if ctx is not None:
                    state["step"] = "register"
                    ctx.__exit__(None, None, None)
                    verify()
                    if (wl.discard_capture and "G5" not in disabled_rules
                            and driver.ledger.count("ipc_mapping") > before):
                        mine["leaks"].append(
                            f"rank {r}: discarded capture left "
                            f"{driver.ledger.count('ipc_mapping') - before} IPC mapping(s) open "
                            f"(vLLM#46515, row G5)")
            mine["explain"][g.name] = comm.explain()
        except BaseException as e:
            e.commsim_group = g.ranks             # to map a group rank back to a world rank
            if not hasattr(e, "commsim_step"):   # Communicator.__init__ tags its own
                e.commsim_step = state["step"] if state["step"] in ("capture", "register") \
                    else (comm.step if comm is not None else "init")
            if comm is not None:
                try:
                    comm.close()
                except BaseException:
                    pass    # the first failure is the report; a teardown after it adds noise
            raise
        comm.close()
    return mine


def rank_error(r: int, error: BaseException) -> RankError:
    """What the report keeps of a rank's failure (plain data: it crosses processes)."""
    name, msg = _error_name(error)
    origin = r
    if isinstance(error, SetupFailed):     # the failing rank, as a world rank
        members = getattr(error, "commsim_group", None)
        origin = members[error.rank] if members else error.rank
    return RankError(r, getattr(error, "commsim_step", "?"), name, msg, origin,
                     getattr(error, "commsim_trace", ""))


def collect(res: RunResult, values: list[dict | None], errors: list[RankError | None]) -> None:
    """Fold every rank's result dict (or its error) into `res`, in rank order."""
    for r, (v, err) in enumerate(zip(values, errors)):
        if err is None and v is not None:
            for k, b in v["backends"].items():
                prev = res.backends.setdefault(k, b)
                if prev != b:
                    res.failures.append(f"ranks disagree on the backend for {k}: {prev} vs {b}")
            res.mismatches += v["mismatch"]
            res.leaks += v["leaks"]
            for gname, text in v["explain"].items():
                res.explain.setdefault(gname, text)
        elif err is not None:
            res.errors.append(err)


def run_scenario(sc: Scenario, policy: Policy | str | None = None, seed: int | None = None,
                 disabled_rules: frozenset[str] = frozenset()) -> RunResult:
    """Run `sc` in this process under its own policy, or under `policy` when given.
    `disabled_rules` switches simulator rules off (mutation tests only). Process mode, one
    real OS process per rank, is `commsim.procs.launcher.run_scenario_procs` (it builds on
    this module, never the other way round)."""
    set_torch_threads()
    seed, pol, res = prepare(sc, policy, seed)
    fabric = SimFabric(sc.cluster, seed, disabled_rules=disabled_rules)
    drivers = [spawn_driver(fabric, g, faults_for(sc, r)) for r, g in enumerate(sc.placement)]
    world = LocalWorld(sc.world_size, seed)
    inputs = Inputs(seed)
    outcomes = world.run(lambda wg: run_rank(sc, pol, wg, drivers[wg.rank], inputs, disabled_rules))
    res.trace_hash = world.trace_hash()
    collect(res, [o.value if o.ok else None for o in outcomes],
            [None if o.ok else rank_error(r, o.error) for r, o in enumerate(outcomes)])
    for r, d in enumerate(drivers):
        res.leaks += [f"rank {r}: {line}" for line in fabric.exit_process(d.proc.pid)]
    res.flags = list(fabric.flags)
    judge(res)
    return res


def judge(res: RunResult) -> None:
    sc = res.scenario
    if res.expects_failure:
        for e in sc.expectations:
            if e.error and not any(
                    x.name == e.error and (e.step is None or x.step == e.step)
                    and (e.rank is None or x.origin == e.rank)
                    and (e.message is None or e.message in x.message) for x in res.errors):
                got = "; ".join(f"rank {x.origin} at {x.step}: {x.name}" for x in res.errors) or "no error"
                res.failures.append(f"expected {e.error} at step {e.step}"
                                    f"{f' from rank {e.rank}' if e.rank is not None else ''}"
                                    f"{f' saying {e.message!r}' if e.message else ''}; got {got}")
            if e.leak and not (res.leaks or res.flags):
                res.failures.append("expected a leak or an undefined-behaviour flag; the run was clean")
        return
    for e in sc.expectations:
        if not e.backend:
            continue
        hits = [(k, b) for k, b in res.backends.items()
                if (e.group is None or k[0] == e.group) and (e.op is None or k[1] == e.op)
                and (e.size is None or k[2] == e.size)]
        if not hits and not res.errors:
            res.failures.append(f"expected backend {e.backend} for group {e.group}: no such op ran")
        for k, b in hits:
            if b != e.backend:
                res.failures.append(f"group {k[0]} {k[1]} {k[2]} B {k[3]}: chose {b}, expected {e.backend}")
    for x in res.errors:
        res.failures.append(f"rank {x.rank} failed at {x.step}: {x.name}: {x.message}")
    res.failures += res.mismatches
    if res.leaks:
        res.failures.append(f"{len(res.leaks)} ledger item(s) leaked: " + "; ".join(res.leaks[:3]))
    for f in res.flags:
        res.failures.append(f"undefined behaviour: {f}")
