"""NCCL's own choices, as rules: which transport each pair of ranks can use and which
algorithm classes each collective can use, from the machine and NCCL's environment
variables. Rules NC1-NC12 of docs/lifecycle-rules.md; every branch cites its row.

This states the eligibility NCCL computes; it does not re-implement NCCL's tuner (which
picks among the eligible algorithms by its own cost model) or its graph search.

    m = machine_from_cluster(cluster, placement)   # ground truth (the oracle, `explain`)
    m = machine_from_view(view)                    # what a communicator discovered
    d = decide(m, parse_env({"NCCL_NVLS_ENABLE": "0"}))
    d.transports, d.algorithms("all_reduce"), d.init_error
    env_sensitivity(m, env)                        # which variables would change what
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Mapping, Sequence

from commsim.errors import UserError
from commsim.topology.model import Cluster, FabricState, GpuRef

if TYPE_CHECKING:
    from commsim.discovery import GroupView

# NCCL path types, nearest first (src/graph/topo.h order; PXN and C2C omitted).
PATHS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS", "NET")
# NCCL_P2P_LEVEL's numeric form (levelsOldToNew in src/graph/paths.cc).
_OLD_LEVELS = ("LOC", "PIX", "PXB", "PHB", "SYS", "SYS")
# `nvidia-smi topo -m` cells to NCCL path types: NODE (host bridges within one NUMA node) is
# what NCCL calls PHB (UNCONFIRMED mapping: NCCL builds its own graph from sysfs).
_SMI_TO_PATH = {"PIX": "PIX", "PXB": "PXB", "PHB": "PHB", "NODE": "PHB", "SYS": "SYS"}
ALGORITHMS = ("Ring", "Tree", "NVLS", "NVLSTree", "PAT", "CollNetDirect", "CollNetChain")
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_reduce_rmsnorm")

# Every variable modelled, with what it does here (also the `--help` / docs table).
ENV_VARS: dict[str, str] = {
    "NCCL_P2P_DISABLE": "1: no P2P transport (= NCCL_P2P_LEVEL=LOC) (NC3)",
    "NCCL_P2P_LEVEL": "farthest path P2P may take: LOC, NVL, PIX, PXB, PHB, SYS or 0-5 (NC3)",
    "NCCL_SHM_DISABLE": "1: no SHM transport (NC4)",
    "NCCL_CUMEM_ENABLE": "-2 auto (default), 0 off, 1 on: cuMem (POSIX fd / FABRIC) P2P buffers (NC6)",
    "NCCL_NVLS_ENABLE": "2 auto (default), 0 off, 1 force: NVLink SHARP (multicast) (NC7)",
    "NCCL_MNNVL_ENABLE": "2 auto (default), 0 off, 1 force: multi-node NVLink (NC8)",
    "NCCL_MNNVL_CROSS_CLIQUE": "1: MNNVL P2P also between cliques of one domain (NC8)",
    "NCCL_PAT_ENABLE": "2 auto (default), 0 off, 1 force: PAT all_gather / reduce_scatter (NC9)",
    "NCCL_ALGO": "comma list of algorithms to allow, or ^list to exclude (NC9)",
}


@dataclass(frozen=True)
class NcclRank:
    rank: int
    host: str
    shm: str
    gpu: tuple[str, int]        # the physical GPU (host, NVML index): duplicates are an error
    arch: str                   # x86_64 | aarch64 (NCCL's default P2P level depends on it)
    vmm: bool
    legacy_ipc: bool
    multicast: bool
    fabric_handle: bool
    imex: bool
    uuid: bytes
    clique: int
    state: int


@dataclass(frozen=True)
class NcclMachine:
    """What NCCL sees of a group: per rank, and per same-host pair the path type and
    whether `cudaDeviceCanAccessPeer` allows it."""

    ranks: tuple[NcclRank, ...]
    paths: Mapping[tuple[int, int], str]
    p2p_access: frozenset[tuple[int, int]]
    source: str = "topology"


def pcie_path(smi: str) -> str:
    """NCCL's path type for a PCIe path as `nvidia-smi topo -m` names it (NODE, host bridges
    within one CPU socket, is NCCL's PHB); an unknown or empty one is SYS."""
    return _SMI_TO_PATH.get(smi, "SYS")


def machine_from_cluster(cluster: Cluster, placement: Sequence[GpuRef]) -> NcclMachine:
    ranks, paths, access = [], {}, set()
    for r, ref in enumerate(placement):
        h, g = cluster.host(ref.host), cluster.gpu(ref)
        ranks.append(NcclRank(r, h.name, h.gpu_namespace(ref.index), (h.name, ref.index), h.arch, g.vmm,
                              g.ipc_event, g.multicast, g.fabric_handle, bool(h.imex_channels),
                              g.fabric.cluster_uuid, g.fabric.clique_id, int(g.fabric.state)))
    for i, a in enumerate(placement):
        for j, b in enumerate(placement):
            if i != j and a.host == b.host and a.index != b.index:
                lk = cluster.host(a.host).link(a.index, b.index)
                paths[(i, j)] = "NVL" if lk.is_nvlink else pcie_path(lk.kind)
                if lk.p2p:
                    access.add((i, j))
    return NcclMachine(tuple(ranks), paths, frozenset(access), "topology")


def machine_from_view(view: "GroupView") -> NcclMachine:
    """From discovery. NVML says which pairs are NVLink; the PCIe distance NCCL reads from
    sysfs is not in the view, so other same-host pairs count as SYS (UNCONFIRMED), and the
    CPU architecture as x86_64 unless the host is a Grace one (fabric-capable, aarch64)."""
    ranks, paths, access = [], {}, set()
    for r in view.ranks:
        arch = "aarch64" if r.fabric_handle and any(r.fabric_uuid) else "x86_64"
        # The physical GPU is the NVML index (r.gpu), not the CUDA ordinal: with one GPU per
        # process (CUDA_VISIBLE_DEVICES, row W1) every rank's ordinal is 0, and NCCL compares
        # bus ids, so that is no duplicate.
        ranks.append(NcclRank(r.rank, r.host, r.shm_namespace, (r.host, r.gpu), arch, r.vmm,
                              True, r.multicast, r.fabric_handle, r.imex, r.fabric_uuid,
                              r.fabric_clique, r.fabric_state))
    for a, b in view.host_pairs():
        if a.gpu != b.gpu:
            paths[(a.rank, b.rank)] = "NVL" if a.nvlink[b.gpu] else "SYS"
            known = a.p2p[b.gpu] if b.gpu < len(a.p2p) else None
            # A peer this process cannot see (None) is not asked: NCCL's p2p.cc
            # ("CUDA 10.1 and later can use P2P with invisible devices") keeps P2P on.
            if known is None or known:
                access.add((a.rank, b.rank))
    return NcclMachine(tuple(ranks), paths, frozenset(access), "discovery")


# -- environment ---------------------------------------------------------------------------
@dataclass(frozen=True)
class NcclEnv:
    p2p_level: str | None = None        # None: NCCL's default for the CPU
    shm_disable: bool = False
    cumem: int = -2
    nvls: int = 2
    mnnvl: int = 2
    cross_clique: bool = False
    pat: int = 2
    algos: frozenset[str] = frozenset(ALGORITHMS)
    raw: tuple[tuple[str, str], ...] = ()


def _int(name: str, value: str, allowed: Sequence[int]) -> int:
    try:
        v = int(value.strip())
    except ValueError:
        v = None
    if v not in allowed:
        raise UserError(f"{name}={value!r}: accepted values are {', '.join(map(str, allowed))}")
    return v


def parse_env(env: Mapping[str, str]) -> NcclEnv:
    """NCCL_* variables to an NcclEnv; an unknown NCCL_* name or a bad value is a UserError
    naming it. Other variables are ignored."""
    out = NcclEnv(raw=tuple(sorted((k, v) for k, v in env.items() if k.startswith("NCCL_"))))
    for k, v in out.raw:
        if k not in ENV_VARS:
            raise UserError(f"{k}: not an NCCL variable commsim models; modelled: {', '.join(ENV_VARS)}")
    get = dict(out.raw).get
    level = get("NCCL_P2P_LEVEL")
    if level is not None:
        s = level.strip().upper()
        if s.isdigit():
            s = _OLD_LEVELS[min(int(s), len(_OLD_LEVELS) - 1)]
        if s not in PATHS[:-1]:
            raise UserError(f"NCCL_P2P_LEVEL={level!r}: accepted LOC, NVL, PIX, PXB, PHB, SYS or 0-5")
        out = replace(out, p2p_level=s)
    if get("NCCL_P2P_DISABLE") is not None and _int("NCCL_P2P_DISABLE", get("NCCL_P2P_DISABLE"), (0, 1)):
        out = replace(out, p2p_level="LOC")
    if get("NCCL_SHM_DISABLE") is not None:
        out = replace(out, shm_disable=bool(_int("NCCL_SHM_DISABLE", get("NCCL_SHM_DISABLE"), (0, 1))))
    if get("NCCL_CUMEM_ENABLE") is not None:
        out = replace(out, cumem=_int("NCCL_CUMEM_ENABLE", get("NCCL_CUMEM_ENABLE"), (-2, 0, 1)))
    for key, attr in (("NCCL_NVLS_ENABLE", "nvls"), ("NCCL_MNNVL_ENABLE", "mnnvl"), ("NCCL_PAT_ENABLE", "pat")):
        if get(key) is not None:
            out = replace(out, **{attr: _int(key, get(key), (0, 1, 2))})
    if get("NCCL_MNNVL_CROSS_CLIQUE") is not None:
        out = replace(out, cross_clique=bool(_int("NCCL_MNNVL_CROSS_CLIQUE", get("NCCL_MNNVL_CROSS_CLIQUE"), (0, 1))))
    algo = get("NCCL_ALGO")
    if algo is not None:
        neg = algo.strip().startswith("^")
        names = [n.strip() for n in algo.strip().lstrip("^").split(",") if n.strip()]
        canon = {a.lower(): a for a in ALGORITHMS}
        bad = [n for n in names if n.lower() not in canon]
        if bad or not names:
            raise UserError(f"NCCL_ALGO={algo!r}: unknown {', '.join(bad) or 'empty list'}; accepted "
                            f"{', '.join(ALGORITHMS)}, comma-separated, '^' to exclude (the per-"
                            f"collective 'allreduce:...' form is not modelled)")
        chosen = {canon[n.lower()] for n in names}
        out = replace(out, algos=frozenset(set(ALGORITHMS) - chosen if neg else chosen))
    return out


# -- decisions -----------------------------------------------------------------------------
@dataclass(frozen=True)
class PairTransport:
    a: int
    b: int
    kind: str       # P2P | SHM | NET
    via: str        # how: "cuMem POSIX fd over NVLink", "legacy IPC over PCIe PXB", ...
    why: str        # why not the nearer transports


@dataclass(frozen=True)
class NcclDecision:
    cumem: bool
    mnnvl: bool
    nvls: bool
    nodes: int                          # NCCL's node count for algorithm rules
    transports: tuple[PairTransport, ...]
    notes: tuple[str, ...]              # why cuMem / MNNVL / NVLS are on or off
    init_error: tuple[str, str] | None  # (ncclResult name, message) when init fails
    env: NcclEnv

    @functools.cached_property
    def nranks(self) -> int:
        return len({t.a for t in self.transports} | {t.b for t in self.transports}) or 1

    def algorithms(self, op: str) -> tuple[str, ...]:
        """The algorithm classes NCCL can use for `op` (NC7, NC9), in ALGORITHMS order. Kept
        per op (a pure function of this frozen decision): every rank's describe() and each
        op's dispatch ask."""
        memo = self.__dict__.setdefault("_algorithms", {})    # not a field, as cached_property
        got = memo.get(op)
        if got is None:
            got = memo[op] = self._algorithms_for(op)
        return got

    def _algorithms_for(self, op: str) -> tuple[str, ...]:
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}; ops: {', '.join(OPS)}")
        if self.init_error is not None:
            return ()
        reduce_all = op in ("all_reduce", "all_reduce_rmsnorm")
        ok = {"Ring"}
        if reduce_all:
            ok.add("Tree")
            if self.nvls:
                ok.add("NVLS" if self.nodes == 1 else "NVLSTree")   # "NVLS Tree" off on 1 node
        else:
            if self.nvls and self.nodes == 1:    # "only single-node NVLS allgather/reducescatter"
                ok.add("NVLS")
            pat_auto = self.nodes == self.nranks and self.nranks > 1   # "1 GPU per node"
            if self.env.pat == 1 or (self.env.pat == 2 and pat_auto):
                ok.add("PAT")
        return tuple(a for a in ALGORITHMS if a in ok and a in self.env.algos)

    def transport_summary(self) -> str:
        return self._summary

    @functools.cached_property
    def _summary(self) -> str:
        # Cached: O(ranks^2) over the pairs, and every rank's explain() asks for it.
        if self.init_error is not None:
            return f"init fails: {self.init_error[0]}"
        if not self.transports:
            return "one rank: no transport"
        groups: dict[tuple[str, str], int] = {}
        for t in self.transports:
            groups[(t.kind, t.via)] = groups.get((t.kind, t.via), 0) + 1
        return "; ".join(f"{k} via {v} ({n} pair{'s' * (n > 1)})" for (k, v), n in sorted(groups.items()))


def _p2p_level(env: NcclEnv, arch: str) -> str:
    """NC3: the user's level, else PXB: P2P never crosses a CPU host bridge by default.
    src/graph/paths.cc ncclTopoCheckP2p, NVIDIA/nccl v2.23.4-1 to v2.29.7-1: `int p2pLevel =
    PATH_PXB`, raised to SYS only on AMD x86 hosts with at most two GPUs; v2.18.1-1 to
    v2.22.3-1: `PATH_SYS`, lowered to PXB on ARM, Intel and Zhaoxin CPUs. The topology
    records no CPU vendor, so an x86 host counts as an Intel one (UNCONFIRMED per machine),
    which gives PXB in every release from 2.18 on; `arch` stays an input for that reason."""
    if env.p2p_level is not None:
        return env.p2p_level
    return "PXB"


def _cumem(m: NcclMachine, env: NcclEnv) -> tuple[bool, str]:
    """NC6: auto = driver >= 12.0 (every modelled host) and VMM on every device."""
    if env.cumem == 0:
        return False, "cuMem off (NCCL_CUMEM_ENABLE=0): P2P buffers through legacy IPC"
    if all(r.vmm for r in m.ranks):
        return True, "cuMem on" + (" (forced)" if env.cumem == 1 else " (auto: VMM supported)")
    return False, "cuMem off: some device lacks VMM support (forcing it is UNCONFIRMED: modelled as off)"


def _mnnvl(m: NcclMachine, env: NcclEnv, cumem: bool, hosts: int) -> tuple[bool, str, tuple[str, str] | None]:
    """NC8 (ncclMnnvlCheck): runs for a multi-node comm unless disabled or P2P is LOC."""
    runs = (hosts > 1 and env.mnnvl != 0 and env.p2p_level != "LOC") or env.mnnvl == 1
    if not runs:
        return False, ("MNNVL off (NCCL_MNNVL_ENABLE=0)" if env.mnnvl == 0 and hosts > 1
                       else "MNNVL not checked (one host)" if hosts == 1 else "MNNVL off (P2P level LOC)"), None
    rs = m.ranks
    domain = max(sum(1 for s in rs if s.uuid == r.uuid) for r in rs)
    why = ("cuMem is off" if not cumem else
           "some GPU lacks FABRIC handle support" if not all(r.fabric_handle for r in rs) else
           "some GPU's fabric state is not COMPLETED" if not all(r.state == FabricState.COMPLETED for r in rs) else
           "some GPU reports an all-zero cluster UUID" if not all(any(r.uuid) for r in rs) else
           "no two ranks share an NVLink domain" if domain < 2 else "")
    if why:
        return False, f"MNNVL off: {why}", None
    if not all(r.imex for r in rs):
        # The FABRIC alloc/export/import self-test fails: a hard init error (row F5).
        bad = next(r for r in rs if not r.imex)
        return False, "MNNVL self-test failed", (
            "ncclSystemError", f"MNNVL (cluster UUID + clique) looks available but is not working: a FABRIC "
            f"handle could not be created or imported on rank {bad.rank} (host {bad.host}). Check the IMEX "
            f"channel configuration (nvidia-imex-ctl -N). Set NCCL_MNNVL_ENABLE=0 to disable MNNVL")
    return True, "MNNVL on: FABRIC handles across hosts of one NVLink domain", None


def _pair(m: NcclMachine, env: NcclEnv, i: int, j: int, cumem: bool, mnnvl: bool) -> PairTransport:
    a, b = m.ranks[i], m.ranks[j]
    level = _p2p_level(env, a.arch)
    if a.host != b.host:
        same_clique = a.uuid == b.uuid and any(a.uuid) and (a.clique == b.clique or env.cross_clique)
        if mnnvl and same_clique:
            return PairTransport(i, j, "P2P", "cuMem FABRIC over multi-node NVLink", "MNNVL clique peers (NC8)")
        why = ("different hosts; MNNVL off" if not mnnvl else
               "different NVLink cliques (NCCL_MNNVL_CROSS_CLIQUE=1 allows P2P)" if a.uuid == b.uuid
               else "different NVLink domains")
        return PairTransport(i, j, "NET", "network", why)
    if a.shm != b.shm:
        # Row W6: ranks in different containers of one host (own /dev/shm, pid and IPC
        # namespaces): NCCL treats them as separate nodes and tries neither P2P nor SHM
        # (NVIDIA/nccl#1647, maintainer's answer; the /dev/shm check of NVIDIA/nccl#248).
        return PairTransport(i, j, "NET", "network", "different containers (own /dev/shm, pid and IPC namespaces)")
    path = m.paths.get((i, j), "LOC")
    reasons = []
    if PATHS.index(path) > PATHS.index(level):
        reasons.append(f"path {path} is beyond P2P level {level}")
    elif (i, j) not in m.p2p_access:
        reasons.append("cudaDeviceCanAccessPeer = 0")
    elif not cumem and not (a.legacy_ipc and b.legacy_ipc):
        reasons.append("Legacy IPC not supported and cuMem off")
    else:
        over = "NVLink" if path == "NVL" else f"PCIe {path}"
        how = "cuMem POSIX fd" if cumem else "legacy IPC"
        return PairTransport(i, j, "P2P", f"{how} over {over}", "")
    if env.shm_disable:
        reasons.append("SHM disabled (NCCL_SHM_DISABLE=1)")
    else:
        return PairTransport(i, j, "SHM", "host shared memory", "; ".join(reasons))
    return PairTransport(i, j, "NET", "network", "; ".join(reasons))


def decide(m: NcclMachine, env: NcclEnv | None = None) -> NcclDecision:
    """NCCL's eligibility for this group under `env` (NC1-NC12)."""
    env = env or NcclEnv()
    rs = m.ranks
    hosts = len({r.host for r in rs})
    seen: dict[tuple[str, int], int] = {}
    for r in rs:
        if r.gpu in seen:   # NC10
            return NcclDecision(False, False, False, hosts, (), (), (
                "ncclInvalidUsage", f"Duplicate GPU detected : rank {r.rank} and rank {seen[r.gpu]} both on "
                                    f"CUDA device {r.gpu[0]}/{r.gpu[1]}"), env)
        seen[r.gpu] = r.rank
    cumem, cumem_note = _cumem(m, env)
    mnnvl, mnnvl_note, err = _mnnvl(m, env, cumem, hosts)
    if err is not None:
        return NcclDecision(cumem, False, False, hosts, (), (cumem_note, mnnvl_note), err, env)
    # NC12 (UNCONFIRMED): under MNNVL a clique is one NVLink "node" for algorithm rules.
    # Row W6: containers of one host with their own /dev/shm are separate nodes to NCCL
    # (NVIDIA/nccl#1647), so a host and its shm namespace name a node.
    nodes = len({(r.uuid, r.clique) for r in rs}) if mnnvl else len({(r.host, r.shm) for r in rs})
    per_node: dict[object, int] = {}
    for r in rs:
        key = (r.uuid, r.clique) if mnnvl else (r.host, r.shm)
        per_node[key] = per_node.get(key, 0) + 1
    if env.nvls == 0:
        nvls, nvls_note = False, "NVLS off (NCCL_NVLS_ENABLE=0)"
    elif len(rs) < 2 or max(per_node.values()) < 2:
        nvls, nvls_note = False, "NVLS off: fewer than 2 GPUs per NVLink node"
    elif not all(r.multicast for r in rs):
        nvls, nvls_note = False, "NVLS off: some GPU lacks multicast (no NVSwitch / Fabric Manager)"
    elif not cumem:
        nvls, nvls_note = False, "NVLS off: multicast objects need cuMem (inference)"
    else:
        nvls, nvls_note = True, "NVLS on: every GPU supports multicast" + (" (forced)" if env.nvls == 1 else "")
    pairs = tuple(_pair(m, env, i, j, cumem, mnnvl) for i in range(len(rs)) for j in range(i + 1, len(rs)))
    return NcclDecision(cumem, mnnvl, nvls, nodes, pairs, (cumem_note, mnnvl_note, nvls_note), None, env)


# Settings whose effect `env_sensitivity` tries, one at a time, against the current env.
PROBES: tuple[tuple[str, str], ...] = (
    ("NCCL_P2P_DISABLE", "1"), ("NCCL_P2P_LEVEL", "NVL"), ("NCCL_P2P_LEVEL", "SYS"),
    ("NCCL_SHM_DISABLE", "1"), ("NCCL_CUMEM_ENABLE", "0"), ("NCCL_NVLS_ENABLE", "0"),
    ("NCCL_MNNVL_ENABLE", "0"), ("NCCL_MNNVL_CROSS_CLIQUE", "1"), ("NCCL_PAT_ENABLE", "0"),
    ("NCCL_PAT_ENABLE", "1"), ("NCCL_ALGO", "Ring"))


def env_sensitivity(m: NcclMachine, env: Mapping[str, str] | None = None,
                    ops: Sequence[str] = ("all_reduce", "all_gather", "reduce_scatter")) -> list[tuple[str, str]]:
    """(VAR=value, what changes) for each probe setting that changes a transport, an
    algorithm class or the init outcome; computed by re-deciding, never listed by hand."""
    env = dict(env or {})
    base = decide(m, parse_env(env))
    out = []
    for k, v in PROBES:
        if env.get(k) == v:
            continue
        d = decide(m, parse_env({**env, k: v}))
        changes = []
        if d.transport_summary() != base.transport_summary():
            changes.append(f"transports -> {d.transport_summary()}")
        for op in ops:
            if d.init_error is None and d.algorithms(op) != base.algorithms(op):
                changes.append(f"{op} -> {', '.join(d.algorithms(op)) or 'no algorithm'}")
        if changes:
            out.append((f"{k}={v}", "; ".join(changes)))
    return out


def report(m: NcclMachine, env: Mapping[str, str] | None = None,
           ops: Sequence[str] = ("all_reduce", "all_gather", "reduce_scatter")) -> list[str]:
    """What NCCL would use for this group and why, and which variables would change it: the
    lines `commsim explain` prints (indented by the caller)."""
    env = dict(env or {})
    d = decide(m, parse_env(env))
    shown = " ".join(f"{k}={v}" for k, v in sorted(env.items())) or "none set"
    lines = [f"NCCL (environment: {shown}; machine from {m.source})"]
    if d.init_error is not None:
        lines.append(f"  init fails: {d.init_error[0]}: {d.init_error[1]}")
    else:
        lines += [f"  {n}" for n in d.notes]
        lines.append(f"  transports: {d.transport_summary()}")
        whys = sorted({t.why for t in d.transports if t.why})
        lines += [f"    because: {w}" for w in whys]
        for op in ops:
            lines.append(f"  {op}: algorithm classes {', '.join(d.algorithms(op)) or 'none'}")
    sens = env_sensitivity(m, env, ops)
    if sens:
        lines.append("  variables that change this:")
        lines += [f"    {k}: {what}" for k, what in sens]
    else:
        lines.append("  no modelled variable changes this")
    return lines
