"""Run a scenario: simulated processes on its placement, a communicator per group, the
workload checked against a float64 reference, expectations compared, the ledger audited.

A run is a function of (scenario, seed): the fabric, the scheduler and the inputs all derive
from `scenario.seed`, and `RunResult.trace_hash` fingerprints the interleaving.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any

from commsim.libmodels import caching_allocator as allocators
from commsim.backends.base import SetupFailed
from commsim.backends.nccl import NcclError
from commsim.libmodels.caching_allocator import CachingAllocator
from commsim.communicator import Communicator
from commsim.driver import CAPTURE_MODE_GLOBAL, CudaError, check
from commsim.group import LocalWorld
from commsim.runtime.diagnosis import GroupError, HangDetected
from commsim.runtime.scheduler import hash_trace
from commsim.policy import Policy, resolve
from commsim.sim import SimFabric, set_torch_threads, spawn_driver
from commsim.sim import visibility
from commsim.sim.faults import ProcessFaults
from commsim.scenario.faults import arm_driver_faults
from commsim.scenario.outcomes import judge_outcomes
from commsim.scenario.model import Scenario

from commsim.scenario.reference import ESIZE, RTOL, TORCH, Inputs, make_input, message_numel  # noqa: F401  (re-exported)


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
    # group -> [[a, b, kind, via] ...]: the transports NCCL's set-up made on the machine
    # (group ranks), for the groups whose nccl backend ran the simulated NCCL.
    nccl_transports: dict[str, list[list]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)         # unmet expectations
    outcomes: list[str] = field(default_factory=list)         # met non-error expectations (outcomes.py)
    unmet: list[str] = field(default_factory=list)            # unmet ones (also in failures)
    # The schedule's events (thread mode; process mode has none): hashed only when asked,
    # since a sweep compares hashes only for the scenarios it runs twice.
    trace: list[tuple] | None = field(default=None, repr=False)
    policy: str = ""
    expects_failure: bool = False     # judged against the file's error/leak expectations
    pids: list[int] = field(default_factory=list)   # process mode: the rank processes' OS pids

    @property
    def ok(self) -> bool:
        return not self.failures

    @functools.cached_property
    def trace_hash(self) -> str:
        """Fingerprint of the interleaving ("" without one): equal for equal seeds."""
        return hash_trace(self.trace) if self.trace is not None else ""

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
        cmd += "".join(f" {x}" for x in self.scenario.extra.get("version_flags", ()))
        return cmd + (" --expect-failure" if self.expects_failure else "")


def spawn_rank(fabric: Any, sc: Scenario, rank: int) -> Any:
    """Rank `rank`'s process on its GPU, seeing what its container and CUDA_VISIBLE_DEVICES
    give it (rows W1, W3; sim/visibility.py). A host whose container shows each process its
    own GPU only (fault one_gpu_per_process) sets CUDA_VISIBLE_DEVICES to it."""
    g = sc.placement[rank]
    view = sc.view(rank)
    host = sc.cluster.host(g.host)
    visible = container = None
    if view.devices is not None:
        container = visibility.container_devices(view.devices, len(host.gpus))
    if host.container.one_gpu_per_process:
        visible = [g.index]
    elif view.devices is not None or view.visible is not None:
        uuids = visibility.host_uuids(host)
        visible = list(visibility.process_view(uuids, view.devices, view.visible))
    return spawn_driver(fabric, g, faults_for(sc, rank), visible=visible, container=container)


def faults_for(sc: Scenario, rank: int) -> ProcessFaults:
    return arm_driver_faults(sc.faults, rank)


def _error_name(e: BaseException) -> tuple[str, str]:
    if isinstance(e, SetupFailed):
        inner = e.error
        return (inner.name if isinstance(inner, (CudaError, NcclError)) else type(inner).__name__), str(e)
    if isinstance(e, CudaError):
        return e.name, str(e)
    if isinstance(e, HangDetected):
        return "hang", str(e)
    if isinstance(e, GroupError):
        return type(e).__name__, str(e)
    return type(e).__name__, str(e)


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
        e.failure for e in sc.expectations)
    return seed, pol, res


def run_rank(sc: Scenario, pol: Policy, wg: Any, driver: Any, inputs: Inputs,
             disabled_rules: frozenset[str] = frozenset()) -> dict:
    """One rank's whole scenario: its groups, a communicator per group, the workload checked
    against the reference, close. Runs the same as a greenlet (thread mode) or as the body
    of a rank process (process mode)."""
    alloc = CachingAllocator(driver, expandable_segments=sc.workload.allocator == "expandable_segments")
    allocators.install(driver, alloc)
    mine: dict = {"backends": {}, "mismatch": [], "explain": {}, "leaks": []}
    try:
        _run_groups(sc, pol, wg, driver, inputs, disabled_rules, mine)
        return mine
    except BaseException as e:
        # What the rank found before it failed still counts: a wrong result checked before a
        # later op's error is a defect of its own, not hidden by that error (collect()).
        e.commsim_partial = mine
        raise
    finally:
        try:
            alloc.close()  # the process's allocator exits with it: every segment returns
        except CudaError:
            pass           # after a failure: what could not return shows as ledger residue
        allocators.uninstall(driver)


def _run_groups(sc: Scenario, pol: Policy, wg: Any, driver: Any, inputs: Inputs,
                disabled_rules: frozenset[str], mine: dict) -> None:
    """Fills `mine` as the rank goes, so what it found survives a later failure."""
    r = wg.rank
    wl = sc.workload
    subs = []
    for g in sc.groups:
        sub = wg.new_subgroup(list(g.ranks), g.name, tag=f"create group {g.name}")
        if sub is not None:
            subs.append((g, sub))
    for g, sub in subs:
        state = {"step": "discover"}
        comm = None
        try:
            comm = Communicator(sub, driver, pol, setup=wl.setup if wl.setup != "init" else None,
                                nccl_env=wl.nccl_env, fd_transport=wl.fd_transport)
            checks: list = []

            def verify() -> None:
                # After the op (eager) or after the graph's first replay (capture).
                for y, ref, label in checks:
                    err = ref.check(y, sub.rank)
                    if err is not None:
                        mine["mismatch"].append(f"{label}: {err}")
                checks.clear()

            # Capture first, as serving stacks do (CUDA-graph memory profiling and capture
            # run before serving), then the eager pass.
            for mode in (("capture",) if wl.graph_capture else ()) + ("eager",):
                ctx = comm.capture(discard=wl.discard_capture) if mode == "capture" else None
                if ctx is not None:
                    ctx.__enter__()
                    state["step"] = "capture"
                    _stream_capture(driver, begin=True)
                for op in wl.ops:
                    for size in wl.sizes:
                        for dt in wl.dtypes:
                            numel = message_numel(op, size, dt, sub.size)
                            state["step"] = "capture" if ctx else "op"
                            ref = inputs.get(g.name, sub.size, op, numel, dt)
                            x = ref.input(sub.rank)
                            if op == "all_reduce_rmsnorm":    # residual and weight: ones
                                out, y = comm.all_reduce_rmsnorm(x, ref.ones(), ref.ones())
                                del out
                            else:
                                y = getattr(comm, op)(x)
                            checks.append((y, ref, f"group {g.name} rank {sub.rank}: {op} {size} B {dt}"))
                            # Hold no output across the next collective: every rank parked
                            # in it would keep one (O(ranks x message) at rack scale).
                            del x, y, ref
                            if ctx is None:
                                verify()
                            mine["backends"][(g.name, op, size, dt)] = comm.chosen(op, numel * ESIZE[dt], dt)
                if ctx is not None:
                    _stream_capture(driver, begin=False)
                    state["step"] = "register"
                    # Counted after the ops: a lazy set-up inside the capture opened the
                    # workspace's own mappings, which are not the capture's (row G5).
                    before = driver.ledger.count("ipc_mapping")
                    ctx.__exit__(None, None, None)
                    verify()
                    if (wl.discard_capture and "G5" not in disabled_rules
                            and driver.ledger.count("ipc_mapping") > before):
                        mine["leaks"].append(
                            f"rank {r}: discarded capture left "
                            f"{driver.ledger.count('ipc_mapping') - before} IPC mapping(s) open "
                            f"(vLLM#46515, row G5)")
            mine["explain"][g.name] = comm.explain()
            made = _nccl_made(comm)
            if made is not None:
                mine.setdefault("nccl_transports", {})[g.name] = made
            mine.setdefault("silent", []).extend(comm.silent_fallbacks)
        except BaseException as e:
            e.commsim_group = g.ranks             # to map a group rank back to a world rank
            if not hasattr(e, "commsim_step"):   # Communicator.__init__ tags its own
                e.commsim_step = state["step"] if state["step"] in ("capture", "register") \
                    else (comm.step if comm is not None else "init")
            if comm is not None and not getattr(e, "commsim_trace", ""):
                # A failure after set-up (capture, graph registration, an op): the decisions
                # that admitted the path are its explanation.
                e.commsim_trace = comm.trace()
            if comm is not None:
                try:
                    comm.close()
                except BaseException:
                    pass    # the first failure is the report; a teardown after it adds noise
            raise
        comm.close()


def _stream_capture(driver: Any, begin: bool) -> None:
    """The workload's own CUDA-graph capture on the rank's stream, in GLOBAL mode (the default
    of torch.cuda.graph's capture_error_mode, which vLLM keeps: vllm-project/vllm#48053): begun
    after the library's capture hook, ended before graph-buffer registration (vLLM registers
    after capture). Ending raises cudaErrorStreamCaptureInvalidated when a
    call refused during the capture invalidated it (rules CG1-CG2, commsim/sim/stream_capture.py).
    Only the simulated driver models the workload's capture; another driver has no such call."""
    if not hasattr(driver, "cudaStreamBeginCapture"):
        return
    if begin:
        check("cudaStreamBeginCapture", driver.cudaStreamBeginCapture(0, CAPTURE_MODE_GLOBAL))
    else:
        check("cudaStreamEndCapture", driver.cudaStreamEndCapture(0))


def rank_error(r: int, error: BaseException) -> RankError:
    """What the report keeps of a rank's failure (plain data: it crosses processes)."""
    name, msg = _error_name(error)
    origin = r
    if isinstance(error, SetupFailed):     # the failing rank, as a world rank
        members = getattr(error, "commsim_group", None)
        origin = members[error.rank] if members else error.rank
    return RankError(r, getattr(error, "commsim_step", "?"), name, msg, origin,
                     getattr(error, "commsim_trace", ""))


def partial(error: BaseException) -> dict | None:
    """What a failed rank had found before its error (run_rank), or None."""
    return getattr(error, "commsim_partial", None)


def _nccl_made(comm: Any) -> list[list] | None:
    """The transports the simulated NCCL's set-up made for `comm`'s group, as lists (procs
    mode pickles them); None where the nccl backend did not run NCCL on the machine (absent,
    or deciding by the rules alone)."""
    nc = getattr(comm.backends.get("nccl"), "comm", None)
    if nc is None:
        return None
    return [[t.a, t.b, t.kind, t.via] for t in nc.decision.transports]


def collect(res: RunResult, values: list[dict | None], errors: list[RankError | None]) -> None:
    """Fold every rank's result dict (or its error) into `res`, in rank order. A failed rank's
    value, when it has one, is what it found before failing: its mismatches and leaks count,
    its backends do not (the op that failed chose none)."""
    for r, (v, err) in enumerate(zip(values, errors)):
        if v is not None:
            res.mismatches += v["mismatch"]
            res.leaks += v["leaks"]
        if err is not None:
            res.errors.append(err)
            continue
        if v is None:
            continue
        for k, b in v["backends"].items():
            prev = res.backends.setdefault(k, b)
            if prev != b:
                res.failures.append(f"ranks disagree on the backend for {k}: {prev} vs {b}")
        for step, what in v.get("silent", ()):     # rule FH3: a fallback nobody reported
            res.errors.append(RankError(r, step, "SilentFallback", what, r))
        for gname, text in v["explain"].items():
            res.explain.setdefault(gname, text)
        for gname, made in v.get("nccl_transports", {}).items():
            res.nccl_transports.setdefault(gname, made)


def input_keys(sc: Scenario) -> list[tuple[str, int, str, int, str]]:
    """(group, group size, op, elements, dtype) of every message the workload sends, in the
    order a rank meets them (`Inputs` keys)."""
    wl = sc.workload
    return [(g.name, len(g.ranks), op, message_numel(op, size, dt, len(g.ranks)), dt)
            for g in sc.groups for op in wl.ops for size in wl.sizes for dt in wl.dtypes]


def run_scenario(sc: Scenario, policy: Policy | str | None = None, seed: int | None = None,
                 disabled_rules: frozenset[str] = frozenset()) -> RunResult:
    """Run `sc` in this process under its own policy, or under `policy` when given.
    `disabled_rules` switches simulator rules off (mutation tests only). Process mode, one
    real OS process per rank, is `commsim.procs.launcher.run_scenario_procs` (it builds on
    this module, never the other way round)."""
    set_torch_threads()
    seed, pol, res = prepare(sc, policy, seed)
    fabric = SimFabric(sc.cluster, seed, disabled_rules=disabled_rules)
    drivers = [spawn_rank(fabric, sc, r) for r in range(sc.world_size)]
    world = LocalWorld(sc.world_size, seed)
    inputs = Inputs(seed, ahead=input_keys(sc))
    outcomes = world.run(lambda wg: run_rank(sc, pol, wg, drivers[wg.rank], inputs, disabled_rules))
    res.trace = world.scheduler.trace
    collect(res, [o.value if o.ok else partial(o.error) for o in outcomes],
            [None if o.ok else rank_error(r, o.error) for r, o in enumerate(outcomes)])
    for r, d in enumerate(drivers):
        res.leaks += [f"rank {r}: {line}" for line in fabric.exit_process(d.proc.pid)]
    res.flags = list(fabric.flags)
    judge(res)
    return res


def judge(res: RunResult) -> None:
    sc = res.scenario
    wanted_mismatches, wanted_flags = judge_outcomes(res)
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
    res.failures += [m for m in res.mismatches if m not in wanted_mismatches]
    if res.leaks:
        res.failures.append(f"{len(res.leaks)} ledger item(s) leaked: " + "; ".join(res.leaks[:3]))
    for f in res.flags:
        if f not in wanted_flags:
            res.failures.append(f"undefined behaviour: {f}")
