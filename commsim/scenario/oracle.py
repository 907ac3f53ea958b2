"""The oracle (DESIGN.md §4): which backends are legal, from the topology alone, and a verdict
on a run.

Ground truth is the scenario's cluster after its faults. The oracle never calls a backend's
`eligibility` or `accepts` and never reads a discovery view: it restates the documented rules
over the topology (reference §9: rows L5-L10, V2-V8, M1-M7, F1-F4, B2-B6), so a wrong rule in
a backend shows up as a disagreement instead of being agreed with.

    legal = legal_backends(sc)           # {(group, op, size, dtype): ("fabric", "nccl")}
    v = judge(sc, run_scenario(sc))      # Verdict; v.ok, v.by_kind()
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..policy import Policy, resolve
from ..topology.model import Cluster, FabricState, GpuRef, ZERO_UUID
from .model import Scenario

# Handle types a rank may import from another.
IPC, POSIX_FD, FABRIC = "ipc", "posix_fd", "fabric"
KINDS = ("illegal-backend", "not-best", "cuda-error", "numerics", "leak", "nondeterministic")
KERNEL_MAX_RANKS = 128              # flag slots per array (restated, not imported: see above)
IPC_WORLD_SIZES = (2, 4, 6, 8)       # the compiled custom all-reduce kernels (row B2)
ESIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
OOM_ERRORS = ("cudaErrorMemoryAllocation", "CUDA_ERROR_OUT_OF_MEMORY")
Mi = 1 << 20


# -- pairs ------------------------------------------------------------------------------------
def _fabric_ready(cluster: Cluster, ref: GpuRef) -> bool:
    """NCCL's / TRT-LLM's MNNVL test on one GPU (rows F1, F2, F4) plus the device attributes
    FABRIC memory needs (rows V2, V4) and active NVLinks (FlashInfer / TRT-LLM, §4.2)."""
    g = cluster.gpu(ref)
    f = g.fabric
    return (g.vmm and g.fabric_handle and f.state == FabricState.COMPLETED and f.status == 0
            and f.cluster_uuid != ZERO_UUID and g.nvlinks_up)


def nvlink_p2p(cluster: Cluster, a: GpuRef, b: GpuRef) -> bool:
    """Same host, and the link between them is NVLink with P2P allowed (or the same GPU)."""
    if a.host != b.host:
        return False
    if a.index == b.index:
        return True
    lk = cluster.host(a.host).link(a.index, b.index)
    return lk.is_nvlink and lk.p2p


def importable(cluster: Cluster, a: GpuRef, b: GpuRef) -> frozenset[str]:
    """The handle types the process on GPU `a` can import from the process on GPU `b`."""
    out = set()
    same_host = a.host == b.host
    # Legacy IPC: host-local (row L8), and the importer needs P2P to the exporter (row L10).
    if same_host and (a.index == b.index or cluster.host(a.host).link(a.index, b.index).p2p):
        out.add(IPC)
    # POSIX fd: travels over AF_UNIX, so one shm / socket namespace (row V9, §4.3).
    ga, gb = cluster.gpu(a), cluster.gpu(b)
    if (cluster.host(a.host).shm_namespace == cluster.host(b.host).shm_namespace
            and ga.vmm and gb.vmm and ga.posix_fd and gb.posix_fd):
        out.add(POSIX_FD)
    # FABRIC: both MNNVL-ready, one IMEX channel in common (rows V3, V5), one domain (V7).
    ha, hb = cluster.host(a.host), cluster.host(b.host)
    if (_fabric_ready(cluster, a) and _fabric_ready(cluster, b)
            and set(ha.imex_channels) & set(hb.imex_channels)
            and cluster.same_domain(a, b)
            and ga.fabric.cluster_uuid == gb.fabric.cluster_uuid):
        out.add(FABRIC)
    return frozenset(out)


# -- groups -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GroupTruth:
    """What the topology allows one group: the legal backends and why the others are not."""

    name: str
    ranks: tuple[int, ...]
    gpus: tuple[GpuRef, ...]
    legal: tuple[str, ...]                     # group-level, in policy order
    why_not: dict[str, str] = field(default_factory=dict)


def group_truth(sc: Scenario, ranks: tuple[int, ...], name: str = "",
                order: tuple[str, ...] = Policy().order) -> GroupTruth:
    c = sc.cluster
    gpus = tuple(sc.placement[r] for r in ranks)
    ws = len(gpus)
    pairs = [(a, b) for i, a in enumerate(gpus) for j, b in enumerate(gpus) if i != j]
    imp = {(a, b): importable(c, a, b) for a, b in pairs}
    nvl_all = all(nvlink_p2p(c, a, b) for a, b in pairs)
    single_host = len({g.host for g in gpus}) == 1
    why: dict[str, str] = {}
    if ws < 2:
        why["ipc"] = why["fabric"] = why["multicast"] = "a group of one rank"
    else:
        bad = next(((a, b) for a, b in pairs if IPC not in imp[(a, b)]), None)
        if bad:
            why["ipc"] = f"{bad[0]} cannot open a legacy IPC handle of {bad[1]}"
        elif ws not in IPC_WORLD_SIZES:
            why["ipc"] = f"world size {ws} not in {IPC_WORLD_SIZES}"
        elif ws > 2 and not nvl_all:
            why["ipc"] = f"{ws} GPUs not fully NVLink-connected"
        bad = next(((a, b) for a, b in pairs if FABRIC not in imp[(a, b)]), None)
        if bad:
            why["fabric"] = f"{bad[0]} cannot import a FABRIC handle of {bad[1]}"
        gs = [c.gpu(g) for g in gpus]
        doms = {id(c.domain_of(g)) if c.domain_of(g) is not None else None for g in gpus}
        if not all(g.multicast and g.vmm for g in gs):
            why["multicast"] = "some GPU lacks multicast or VMM (row M1)"
        elif None in doms or len(doms) != 1:
            why["multicast"] = "GPUs are not in one NVLink domain"
        elif not all(g.fabric.state in (FabricState.COMPLETED, FabricState.NOT_SUPPORTED) for g in gs):
            # Row M3: binding fails SYSTEM_NOT_READY while the fabric manager is not done.
            why["multicast"] = "some GPU's fabric state is not COMPLETED (row M3)"
        elif single_host:
            if not nvl_all:
                why["multicast"] = "not every pair is NVLink + P2P"
            elif not all(POSIX_FD in imp[p] for p in pairs):
                why["multicast"] = "POSIX-fd handles unavailable"
        elif not all(FABRIC in imp[p] for p in pairs):
            why["multicast"] = "across hosts the multicast handle must be FABRIC (row M7)"
    if ws < 2:
        why["symm"] = "a group of one rank"
    elif len({c.host(g.host).shm_namespace for g in gpus}) == 1:
        # One socket namespace: the symmetric buffers travel as POSIX fds (§2.5) and peers
        # load and store through the mappings over NVLink P2P (rows L10, B3).
        bad = next(((a, b) for a, b in pairs if POSIX_FD not in imp[(a, b)]), None)
        if bad:
            why["symm"] = f"{bad[0]} cannot import a POSIX-fd handle of {bad[1]}"
        elif not nvl_all:
            why["symm"] = "not every pair is NVLink + P2P"
    else:
        bad = next(((a, b) for a, b in pairs if FABRIC not in imp[(a, b)]), None)
        if bad:
            why["symm"] = f"across hosts: {bad[0]} cannot import a FABRIC handle of {bad[1]}"
    legal = tuple(b for b in order if b not in why)
    if "nccl" not in legal:
        legal += ("nccl",)
    return GroupTruth(name, ranks, gpus, legal, why)


def op_nbytes(op: str, size: int, dtype: str, ws: int) -> int:
    """The bytes an op hands the communicator for a workload size (the runner's rounding:
    whole elements, at least one, reduce_scatter a multiple of the group size)."""
    esz = ESIZE[dtype]
    numel = max(size // esz, 1)
    if op == "reduce_scatter":
        numel = max(numel // ws, 1) * ws
    return numel * esz


def op_legal(backend: str, op: str, nbytes: int, ws: int, params: dict[str, Any]) -> bool:
    """Per-call limits: peer backends need 16-byte multiples and fit the workspace (row B5);
    multicast does all-reduce only, within its own workspace. commsim's kernels take at most
    128 ranks (one flag slot each: device/kernels/commsim_common.cuh); more go to nccl."""
    if backend != "nccl" and ws > KERNEL_MAX_RANKS:
        return False
    if backend in ("ipc", "fabric"):
        total = nbytes * ws if op == "all_gather" else nbytes
        return nbytes % 16 == 0 and total < int(params.get("max_size", 8 * Mi))
    if backend == "multicast":
        return op in ("all_reduce", "all_reduce_rmsnorm") and nbytes < int(params.get("multicast_max_size", 64 * Mi))
    if backend == "symm":
        total = nbytes * ws if op == "all_gather" else nbytes
        return nbytes % 16 == 0 and total < int(params.get("symm_max_size", 64 * Mi))
    return backend == "nccl"


def legal_backends(sc: Scenario, policy: Policy | None = None) -> dict[tuple[str, str, int, str], tuple[str, ...]]:
    """(group, op, size, dtype) -> the legal backends, in the policy's order."""
    pol = policy or resolve(sc.policy, sc.path.parent if sc.path is not None else None)
    out = {}
    wl = sc.workload
    for g in sc.groups:
        gt = group_truth(sc, g.ranks, g.name, tuple(pol.order))
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
    legal = legal_backends(sc, pol)
    v.legal, v.backends = legal, dict(res.backends)
    # Injected driver failures (out of memory, a failing set-up call): the error they cause
    # on the faulted rank, voted to its group, is expected; a backend they knock out may be
    # skipped in favour of the next legal one.
    oom = [f for f in sc.faults if f.kind in ("oom", "call_fails")]
    oom_ranks = {f.rank for f in oom if f.rank is not None}
    errored = bool(res.errors)
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
            demoted = set(_setup_failed(res.explain.get(key[0], ""))) if oom else set()
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
    for e in res.errors:
        if oom and _caused_by_oom(sc, e, oom_ranks):
            v.notes.append(f"expected under the oom fault: rank {e.rank} at {e.step}: {e.name}")
            continue
        v.add("cuda-error", f"rank {e.rank} (GPU {sc.placement[e.rank]}) at {e.step}: {e.name}: "
                            f"{e.message[:300]}")
    for m in res.mismatches:
        v.add("numerics", m)
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
    truths = {g.name: group_truth(sc, g.ranks, g.name, tuple(pol.order)) for g in sc.groups}
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
    return v


def _caused_by_oom(sc: Scenario, e: Any, oom_ranks: set[int]) -> bool:
    """An error that is the injected out-of-memory itself: the faulted rank's OOM, which a
    collective set-up reports on every rank of the group (`origin` is the failing world rank),
    or a peer that stopped because a rank died of that voted OOM. A hang or a
    collective mismatch is never excused: the ranks fell out of step."""
    text = f"{e.name} {e.message}"
    if "CollectiveMismatch" in text or "HangDetected" in text or e.name == "hang":
        return False
    injected = set(OOM_ERRORS) | {f.code for f in sc.faults if f.kind == "call_fails"}
    if e.name in injected:
        return e.origin in oom_ranks
    return e.name == "RankFailed" and "SetupFailed" in text and any(c in text for c in injected)


def _setup_failed(explain: str) -> list[str]:
    return [m.group(1) for m in map(_ADMITTED.match, explain.splitlines())
            if m and m.group(2).startswith("declined")]


_ADMITTED = re.compile(r"^  ([A-Za-z0-9_]+): (admitted|declined after set-up failure)")
