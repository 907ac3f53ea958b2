"""Generated scenarios for sweeps: a deterministic enumeration and a seeded random sampler.

Every generated scenario has a stable id from which it is rebuilt exactly:

    s<seed>-<index>    the index-th draw of the sampler with that seed (the default mix)
    e<index>           the index-th point of the enumeration (a scrambled mixed-radix walk
                       over every dimension, so any prefix of it is spread over all of them)

`scenario_from_id(id)` regenerates one; `sample(seed, count)` and `enumerate_scenarios(count)`
yield many. Each draw is a pure function of its id (its random stream is seeded from the id
alone), so a scenario can be rebuilt without generating the ones before it.

Dimensions: machine shape (every preset, sliced to 1..N hosts, plus two-box shapes joined by a
network whose boxes are separate NVLink domains), layout (TP 1/2/4/6/8/16 x DP, with DP groups
sometimes), placement of ranks on GPUs (contiguous, strided, round-robin over hosts, random),
faults (topology edits and out-of-memory at the k-th allocation of a rank), ops, sizes at the
backends' cut-offs, dtypes, graph capture and discard, and the workload knobs of lifecycle
fidelity: lazy set-up, expandable segments, NCCL environment variables. Cost is kept low on purpose: most
scenarios are one op at one small size on at most 8 ranks; large sizes come with two ranks.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import random
import re
from dataclasses import dataclass
from typing import Any, Iterator

from commsim.errors import UserError
from commsim.topology.model import Cluster, GpuRef, NvlinkDomain
from commsim.topology.presets import PRESETS, build as build_preset
from commsim.scenario import faults as F
from commsim.scenario import fidelity_faults as FF
from commsim.scenario import knobs as K
from commsim.scenario import memo
from commsim.scenario.seeds import seed_of
from commsim.scenario.model import DTYPES, OPS, Expectation, Fault, Group, RankView, Scenario, Workload

Ki, Mi = 1 << 10, 1 << 20
MAX_WORLD = 16

# -- machine shapes -------------------------------------------------------------------------
SINGLE_HOST = ("hgx-h100-8", "hgx-h200-8", "dgx-b200-8", "l40s-8-pcie", "rtx4090-8",
               "a100-pcie-bridge-8", "dgx1-v100")
# The fidelity rules' machines (docs/fidelity-rules.md G): bridges and meshes without NVSwitch, PCIe and
# consumer boards, Blackwell Ultra.
MORE_SINGLE_HOST = ("hgx-b300-8", "h200-nvl-2way-8", "h200-nvl-4way-8", "rtx-pro-6000-4",
                    "rtx5090-2", "rtx3090-2-nvlink")
# Two boxes joined by a network (InfiniBand / Ethernet): each box is its own NVLink domain,
# with its own cluster UUID, so nothing but NCCL may span them.
JOINED = ("hgx-h100-8*2", "gb200-nvl72:2*2", "gh200-nvl32:2*2")


def _default_shapes() -> tuple[tuple[str, float], ...]:
    """(shape spec, weight) of the default mix: racks kept to <= 4 hosts / 16 GPUs."""
    out: list[tuple[str, float]] = [(s, 1.0) for s in SINGLE_HOST]
    out += [(f"gb200-nvl72:{h}", 1.0) for h in (1, 2, 3, 4)]
    out += [(f"gb200-nvl36x2:{h}", 0.5) for h in (1, 2, 4)]
    out += [(f"gh200-nvl32:{h}", 0.6) for h in (1, 2, 4, 8)]
    out += [(s, 0.8) for s in JOINED]
    out += [(s, 0.6) for s in MORE_SINGLE_HOST]
    out += [(f"gb300-nvl72:{h}", 0.5) for h in (1, 2)] + [("dgx-spark-2", 0.4)]
    return tuple(out)


# The rare big racks (a few per cent of draws): whole or nearly whole racks, world still <= 16.
BIG_SHAPES = ("gb200-nvl72:9", "gb200-nvl72:18", "gb200-nvl36x2:10", "gb200-nvl36x2:18",
              "gh200-nvl32:16")
BIG_FRACTION = 0.03
DEFAULT_SHAPES = _default_shapes()
_SHAPE_NAMES, _SHAPE_WEIGHTS = [s for s, _ in DEFAULT_SHAPES], [w for _, w in DEFAULT_SHAPES]


def shape_family(spec: str) -> str:
    return re.split(r"[:*]", spec)[0]


@functools.lru_cache(maxsize=None)
def build_shape(spec: str) -> Cluster:
    """A preset (`name` or `name:hosts`), or `P*K`: K copies of preset slice P on a network."""
    if "*" in spec:
        base, _, k = spec.partition("*")
        return _joined(base, int(k))
    return build_preset(spec)


def _joined(base: str, copies: int) -> Cluster:
    parts = []
    for c in range(copies):
        cl = build_preset(base)
        ren = {h.name: f"box{c}-{h.name}" for h in cl.hosts}
        hosts = tuple(dataclasses.replace(h, name=ren[h.name], shm_namespace=ren[h.name]) for h in cl.hosts)
        domains = []
        for d in cl.domains:
            uuid = d.cluster_uuid
            if any(uuid):
                uuid = hashlib.sha256(uuid + bytes([c])).digest()[:16]
            domains.append(NvlinkDomain(f"box{c}-{d.name}",
                                        tuple(GpuRef(ren[m.host], m.index) for m in d.members), uuid))
        # NVML on each GPU reports its own box's cluster UUID.
        fixed = []
        for h in hosts:
            gpus = []
            for g in h.gpus:
                if any(g.fabric.cluster_uuid):
                    dom = next(d for d in domains if GpuRef(h.name, g.index) in d.members)
                    g = dataclasses.replace(g, fabric=dataclasses.replace(g.fabric, cluster_uuid=dom.cluster_uuid))
                gpus.append(g)
            fixed.append(dataclasses.replace(h, gpus=tuple(gpus)))
        parts.append((tuple(fixed), tuple(domains)))
    return Cluster(name=f"{base}*{copies}", hosts=sum((p[0] for p in parts), ()),
                   domains=sum((p[1] for p in parts), ()),
                   source=f"{copies} x {base} joined by a network; each its own NVLink domain")


# -- sizes ------------------------------------------------------------------------------------
SMALL_SIZES = (16, 32, 256, 1024, 2048, 4096, 8192, 16 * Ki, 64 * Ki)
ODD_SIZES = (8, 24, 100, 1000, 4100, 4104)          # not multiples of 16 (after dtype rounding)


def medium_sizes(tp: int) -> tuple[int, ...]:
    """The ipc one/two-shot edges (256 KiB, 512 KiB) and the fabric one-shot edge
    (bytes * ws = 1 MiB) for a group of `tp` ranks."""
    f = (1 * Mi // max(tp, 1)) // 16 * 16
    return (256 * Ki - 16, 256 * Ki, 256 * Ki + 16, 512 * Ki - 16, 512 * Ki, 512 * Ki + 16,
            f - 16, f, f + 16)


def large_sizes(tp: int) -> tuple[int, ...]:
    """The max_size (8 MiB) edges, for all_reduce (bytes) and all_gather (bytes * ws)."""
    g = (8 * Mi // max(tp, 1)) // 16 * 16
    return (8 * Mi - 16, 8 * Mi, 8 * Mi + 16, g - 16, g, g + 16)


# -- faults (each kind's weight and aim: the fault registry, commsim/scenario/faults.py) ---------
PLACEMENTS = ("contiguous", "strided", "roundrobin", "random")
TP_SIZES = (1, 2, 4, 6, 8, 16)


def fault_label(f: Fault) -> str:
    return F.get_fault(f.kind).describe(f)


# -- the plan of one scenario -------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """Every choice of a generated scenario; `build()` turns it into a Scenario."""

    id: str
    shape: str
    tp: int
    dp: int
    dp_groups: bool
    placement: str
    faults: tuple[Fault, ...]          # resolved against the placement
    ops: tuple[str, ...]
    sizes: tuple[int, ...]
    dtypes: tuple[str, ...]
    graph_capture: bool
    discard: bool
    seed: int
    # The lifecycle workload knobs (docs/lifecycle-rules.md), drawn from their own stream so the draws above stay as they
    # were: lazy set-up, expandable segments, NCCL environment variables.
    setup: str = "init"
    allocator: str = "caching"
    nccl_env: tuple[tuple[str, str], ...] = ()
    fd_transport: str = ""
    # A knob scenario (commsim/scenario/knobs.py): (policy parameter, value) of the shortcut
    # policy it runs under; () = the default policy.
    knob: tuple = ()
    # The run's versions (commsim/versions.py) as (field, text) pairs over the installed
    # defaults, drawn from a stream of their own; () = the defaults.
    versions: tuple[tuple[str, str], ...] = ()
    # What the ranks' processes see (sim/visibility.py), from a stream of its own: "" = the
    # whole host; "reordered" = every process of a host with one CUDA_VISIBLE_DEVICES
    # listing that host's placed GPUs in a drawn order (indices or abbreviated UUIDs, maybe
    # cut by an invalid entry after them); "container" = one container per host holding
    # just its placed GPUs (a device cgroup). `view_seed` draws the order and forms.
    views: str = ""
    view_seed: int = 0
    # A non-error outcome to expect (scenario/outcomes.py), from a stream of its own:
    # (group index, i, j) = NCCL's transport between the group's i-th and j-th rank; ().
    outcome: tuple[int, int, int] = ()

    @property
    def world(self) -> int:
        return self.tp * self.dp

    @property
    def layout(self) -> str:
        s = f"tp{self.tp}" + (f"xdp{self.dp}" if self.dp > 1 else "")
        return s + ("+dp" if self.dp_groups else "")


def _place(cluster: Cluster, world: int, how: str, rng: random.Random) -> tuple[GpuRef, ...]:
    refs = list(cluster.gpu_refs())
    n = len(refs)
    if how == "contiguous":
        return tuple(refs[:world])
    if how == "strided":
        s = max(1, n // world)
        return tuple(refs[k * s] for k in range(world))
    if how == "roundrobin":
        hosts = cluster.hosts
        depth = max(len(h.gpus) for h in hosts)
        rr = [GpuRef(h.name, i) for i in range(depth) for h in hosts if i < len(h.gpus)]
        return tuple(rr[:world])
    return tuple(rng.sample(refs, world))


@functools.lru_cache(maxsize=256)
def placement_of(shape: str, world: int, how: str, pid: str) -> tuple[GpuRef, ...]:
    """The GPUs of generated scenario `pid`'s ranks, on its machine shape before faults: the
    random placement draws from a stream seeded by the id, so this is a pure function of its
    arguments, kept for the calls one scenario makes (its plan's fault targets, its build,
    its tags) instead of drawn again for each."""
    return _place(build_shape(shape), world, how, random.Random(seed_of("place", pid)))


def _groups(tp: int, dp: int, dp_groups: bool) -> tuple[Group, ...]:
    gs = [Group(f"tp{d}" if dp > 1 else "tp", tuple(range(d * tp, (d + 1) * tp))) for d in range(dp)]
    if dp_groups and dp > 1:
        gs += [Group(f"dp{i}" if tp > 1 else "dp", tuple(i + d * tp for d in range(dp))) for i in range(tp)]
    return tuple(gs)


def _resolve_fault(kind: F.FaultKind, cluster: Cluster, placement: tuple[GpuRef, ...],
                   rng: random.Random) -> Fault:
    """A fault aimed at the GPUs the scenario uses (so it matters)."""
    gpu = rng.choice(placement)
    return kind.make(cluster, placement, rng, gpu)


def _machine(shape: str, versions: tuple, faults: tuple[Fault, ...]) -> Cluster:
    """Preset shape `shape` with the plan's component versions, then its machine faults."""
    cluster = build_shape(shape)
    if versions:
        cluster = dataclasses.replace(
            cluster, versions=cluster.versions.with_fields(dict(versions)))
    for f in faults:
        cluster = F.apply_machine_fault(cluster, f)
    return cluster


def build(plan: Plan) -> Scenario:
    """The Scenario a plan describes (topology faults applied to the cluster)."""
    placement = placement_of(plan.shape, plan.world, plan.placement, plan.id)
    faults = plan.faults
    # driver faults act on calls, not on the machine
    on_machine = tuple(f for f in faults if not F.is_driver_fault(f))
    cluster = memo.machine((plan.shape, plan.versions, on_machine),
                           lambda: _machine(plan.shape, plan.versions, on_machine))
    groups = _groups(plan.tp, plan.dp, plan.dp_groups)
    wl = Workload(ops=plan.ops, sizes=plan.sizes, dtypes=plan.dtypes,
                  graph_capture=plan.graph_capture, discard_capture=plan.graph_capture and plan.discard,
                  setup=plan.setup, allocator=plan.allocator, nccl_env=plan.nccl_env,
                  fd_transport=plan.fd_transport)
    desc = (f"{plan.shape}, {plan.layout}, {plan.placement} placement, "
            f"{','.join(plan.ops)} at {','.join(map(str, plan.sizes))} B {','.join(plan.dtypes)}"
            f"{', graph capture' if plan.graph_capture else ''}{' + discard' if wl.discard_capture else ''}"
            f"{', faults: ' + ', '.join(fault_label(f) for f in faults) if faults else ''}"
            f"{', lazy set-up' if plan.setup == 'lazy' else ''}"
            f"{', expandable segments' if plan.allocator != 'caching' else ''}"
            f"{', ' + ' '.join(f'{k}={v}' for k, v in plan.nccl_env) if plan.nccl_env else ''}"
            f"{', fds by ' + plan.fd_transport if plan.fd_transport else ''}"
            f"{f', shortcut policy {plan.knob[0]}={plan.knob[1]}' if plan.knob else ''}"
            f"{', versions ' + ' '.join(f'{k}={v}' for k, v in plan.versions) if plan.versions else ''}")
    extra = {"knob": plan.knob} if plan.knob else {}
    views = rank_views(plan, cluster, placement)
    expect = expected_outcome(plan, cluster, placement, groups)
    if views:
        desc += f", {plan.views} visible devices"
    if expect:
        desc += f", expect NCCL {expect[0].transport} for ranks {expect[0].pair[0]}-{expect[0].pair[1]}"
    return Scenario(name=plan.id, cluster=cluster, placement=placement, groups=groups, workload=wl,
                    views=views, expectations=expect,
                    faults=faults, policy=K.policy_of(plan.knob) if plan.knob else "default",
                    seed=plan.seed, description=desc,
                    topology_spec=plan.shape,
                    extra={"id": plan.id, "shape": plan.shape, "layout": plan.layout,
                           "placement": plan.placement, "plan": plan,
                           "tags": plan_tags(plan, placement), **extra})


def plan_tags(plan: Plan, placement: tuple[GpuRef, ...] | None = None) -> str:
    """The words a `--filter` substring is matched against."""
    if placement is None:
        placement = placement_of(plan.shape, plan.world, plan.placement, plan.id)
    tags = [plan.id, plan.shape, plan.layout, plan.placement, *plan.ops, *plan.dtypes,
            *(f.kind for f in plan.faults), "capture" if plan.graph_capture else "eager",
            "discard" if plan.graph_capture and plan.discard else "",
            "faults" if plan.faults else "clean",
            "lazy" if plan.setup == "lazy" else "", "expandable" if plan.allocator != "caching" else "",
            "nccl_env" if plan.nccl_env else "", plan.fd_transport,
            *(("knob", plan.knob[0]) if plan.knob else ()),
            "multihost" if len({g.host for g in placement}) > 1 else "onehost"]
    return " ".join(t for t in tags if t)


# -- the sampler ---------------------------------------------------------------------------------
def _wchoice(rng: random.Random, items, weights):
    return rng.choices(items, weights=weights, k=1)[0]


def _layouts(n_gpus: int, max_world: int) -> list[tuple[int, int]]:
    cap = min(n_gpus, max_world)
    return [(t, d) for t in TP_SIZES for d in (1, 2, 4) if t * d <= cap]


@functools.lru_cache(maxsize=None)
def _layout_draw(n_gpus: int, max_world: int) -> tuple[list[tuple[int, int]], list[float]]:
    """The layouts a machine of `n_gpus` allows up to `max_world` ranks, and their weights
    (constants per pair: made once, not per draw)."""
    lays = _layouts(n_gpus, max_world)
    return lays, [_layout_weight(t, d) for t, d in lays]


def _layout_weight(t: int, d: int) -> float:
    w = t * d
    base = {1: 0.3, 2: 2.0, 4: 1.6, 6: 0.4, 8: 1.1, 16: 0.5}[t]
    return base * (0.2 if w > 8 else 1.0) * (0.6 if d > 1 else 1.0)


def sample_plan(seed: int, index: int) -> Plan:
    pid = f"s{seed}-{index}"
    rng = random.Random(seed_of("sample", seed, index))
    if rng.random() < BIG_FRACTION:
        shape = rng.choice(BIG_SHAPES)
    else:
        shape = _wchoice(rng, _SHAPE_NAMES, _SHAPE_WEIGHTS)
    cluster = build_shape(shape)
    tier = _wchoice(rng, ("small", "medium", "large"), (925, 70, 5))
    max_world = {"small": MAX_WORLD, "medium": 8, "large": 2}[tier]
    lays, weights = _layout_draw(cluster.num_gpus, max_world)
    tp, dp = _wchoice(rng, lays, weights)
    dp_groups = dp > 1 and (tp == 1 or rng.random() < 0.4)
    placement = _wchoice(rng, PLACEMENTS, (45, 20, 15, 20))
    if tier == "small":
        nsizes = 1 if rng.random() < 0.8 else 2
        pool = SMALL_SIZES + ODD_SIZES
        sizes = tuple(rng.sample(pool, nsizes))
        ops = tuple(rng.sample(OPS, 1 if rng.random() < 0.85 else 2))
        dtypes = tuple(rng.sample(DTYPES, 1 if rng.random() < 0.9 else 2))
    else:
        sizes = (rng.choice(medium_sizes(tp) if tier == "medium" else large_sizes(tp)),)
        ops = (rng.choice(OPS),)
        dtypes = (rng.choice(DTYPES),)
    capture = rng.random() < 0.25
    discard = capture and rng.random() < 0.5
    nf = _wchoice(rng, (0, 1, 2), (50, 40, 10))
    drawn = F.drawn_kinds()
    kinds = [_wchoice(rng, drawn, [k.weight for k in drawn]) for _ in range(nf)]
    sc_seed = rng.randrange(1 << 31)
    # The placement (hence the faults' targets) comes from the id-seeded placement stream.
    placement_refs = placement_of(shape, tp * dp, placement, pid)
    frng = random.Random(seed_of("faults", pid))
    faults = tuple(_resolve_fault(k, cluster, placement_refs, frng) for k in kinds)
    left_out = FF.unjudgeable(faults)
    if left_out:
        faults = tuple(f for f in faults if f not in left_out)
    return Plan(pid, shape, tp, dp, dp_groups, placement, faults, ops, sizes, dtypes,
                capture, discard, sc_seed, *_knobs(pid), versions=draw_versions(pid),
                **draw_views(pid), outcome=draw_outcome(pid, tp, dp, dp_groups))


VIEWS_FRACTION = 0.1
OUTCOME_FRACTION = 0.1


def draw_views(pid: str) -> dict[str, Any]:
    """One plan in ten runs its ranks under a placement view (Plan.views), from a stream
    seeded by the id, so the other draws stay as they were."""
    rng = random.Random(seed_of("views", pid))
    if rng.random() >= VIEWS_FRACTION:
        return {}
    return {"views": rng.choice(("reordered", "container")), "view_seed": rng.randrange(1 << 31)}


def draw_outcome(pid: str, tp: int, dp: int, dp_groups: bool) -> tuple[int, int, int]:
    """One plan in ten expects NCCL's transport between two ranks of one of its groups."""
    rng = random.Random(seed_of("outcome", pid))
    groups = _groups(tp, dp, dp_groups)
    sized = [k for k, g in enumerate(groups) if len(g.ranks) > 1]
    if rng.random() >= OUTCOME_FRACTION or not sized:
        return ()
    k = rng.choice(sized)
    i, j = rng.sample(range(len(groups[k].ranks)), 2)
    return (k, i, j)


def rank_views(plan: Plan, cluster: Cluster, placement: tuple[GpuRef, ...]) -> tuple[RankView, ...]:
    """The RankViews Plan.views describes. A host whose processes each see only their own GPU
    (fault one_gpu_per_process) keeps that: the fault sets CUDA_VISIBLE_DEVICES itself."""
    if not plan.views:
        return ()
    rng = random.Random(plan.view_seed)
    lists: dict[str, str] = {}
    for host in dict.fromkeys(g.host for g in placement):
        h = cluster.host(host)
        placed = sorted({g.index for g in placement if g.host == host})
        if plan.views == "container":
            lists[host] = ",".join(map(str, placed))
            continue
        rng.shuffle(placed)
        # The entries name the host's GPUs: an index, or a UUID cut to "GPU-" + 8 digits.
        words = [h.gpus[i].uuid[:12] if h.gpus[i].uuid and rng.random() < 0.3 else str(i)
                 for i in placed]
        hidden = [i for i in range(len(h.gpus)) if i not in placed]
        if hidden and rng.random() < 0.5:
            words += ["-1", str(rng.choice(hidden))]     # cut: the hidden GPU stays hidden
        lists[host] = ",".join(words)
    key = "devices" if plan.views == "container" else "visible"
    return tuple(RankView(**{key: lists[g.host]}) for g in placement)


def expected_outcome(plan: Plan, cluster: Cluster, placement: tuple[GpuRef, ...],
                     groups: tuple[Group, ...]) -> tuple[Expectation, ...]:
    """Plan.outcome as an `[[expect]]` of NCCL's transport, from NCCL's rules over the true
    machine the simulated NCCL meets (nccl_truth.nccl_decision: the plan's faults applied,
    the default policy's advice); none where NCCL's init fails there."""
    if not plan.outcome:
        return ()
    from commsim.scenario.nccl_truth import nccl_decision
    k, i, j = plan.outcome
    g = groups[k]
    d = nccl_decision(cluster, [placement[r] for r in g.ranks], dict(plan.nccl_env))
    got = next((t for t in d.transports if {t.a, t.b} == {i, j}), None)
    if d.init_error is not None or got is None:
        return ()
    return (Expectation(group=g.name, transport=got.kind, pair=(g.ranks[i], g.ranks[j])),)


# Drivers the generator pairs with a CUDA runtime: a release of a branch that runs it (CUDA
# 13.0 release notes: R580 and later; CUDA 12.x toolkits' minor-version compatibility:
# R525 and later, here the branches commsim answers by, rows of host_layout).
DRIVERS_FOR_CUDA = {12: ("550.54.15", "570.86.10", "575.57.08", "580.82.07"),
                    13: ("580.82.07", "580.95.05")}
VERSIONS_FRACTION = 0.2


def draw_versions(pid: str) -> tuple[tuple[str, str], ...]:
    """One in five plans runs other versions than the installed ones: a PyTorch release of
    the table, one of the CUDA builds it ships, the NCCL of that build, a driver that runs
    that CUDA. From a stream seeded by the id, so the other draws stay as they were."""
    from commsim.versions import TORCH_NCCL
    rng = random.Random(seed_of("versions", pid))
    if rng.random() >= VERSIONS_FRACTION:
        return ()
    torch = rng.choice(sorted(TORCH_NCCL))
    cuda = rng.choice(sorted(TORCH_NCCL[torch]))
    nccl = TORCH_NCCL[torch][cuda]
    driver = rng.choice(DRIVERS_FOR_CUDA[cuda[0]])
    return (("driver", driver), ("cuda", "%d.%d" % cuda), ("torch", "%d.%d.0" % torch),
            ("nccl", "%d.%d.%d" % nccl))


# NCCL settings the generator tries; none of them makes NCCL's init fail by itself.
NCCL_ENV_CHOICES = ((("NCCL_NVLS_ENABLE", "0"),), (("NCCL_P2P_DISABLE", "1"),),
                    (("NCCL_CUMEM_ENABLE", "0"),), (("NCCL_ALGO", "Ring"),),
                    (("NCCL_MNNVL_ENABLE", "0"),), (("NCCL_SHM_DISABLE", "1"),))


def _knobs(pid: str) -> tuple[str, str, tuple[tuple[str, str], ...], str]:
    """(setup, allocator, nccl_env, fd_transport) of a plan, from a stream seeded by its id."""
    rng = random.Random(seed_of("knobs", pid))
    setup = "lazy" if rng.random() < 0.15 else "init"
    allocator = "expandable_segments" if rng.random() < 0.15 else "caching"
    env = rng.choice(NCCL_ENV_CHOICES) if rng.random() < 0.15 else ()
    fd = "flashinfer_mesh" if rng.random() < 0.2 else ""
    return setup, allocator, env, fd


def knob_plan(seed: int, index: int) -> Plan:
    """`k<seed>-<index>`: the sampler's draw without its faults and workload knobs, under one
    shortcut-policy knob (commsim/scenario/knobs.py), plus the fault a failure-hygiene knob
    needs to act on (`Knob.provoke`). The base draw's own streams are reused, so the machine,
    layout and placement are those of `s<seed>-<index>`."""
    base = sample_plan(seed, index)
    pid = f"k{seed}-{index}"
    plan = dataclasses.replace(base, id=pid, faults=(), setup="init", allocator="caching",
                               nccl_env=(), fd_transport="", knob=K.draw(pid), views="",
                               outcome=())
    # A knob that acts only on a set-up failure gets one, chosen from the truth (knobs.py).
    return dataclasses.replace(plan, faults=K.provocation(build(plan), pid))


def sample(seed: int, count: int, start: int = 0) -> Iterator[Scenario]:
    for i in range(start, start + count):
        yield build(sample_plan(seed, i))


def sample_ids(seed: int, count: int, start: int = 0) -> list[str]:
    return [f"s{seed}-{i}" for i in range(start, start + count)]


# -- the enumeration -----------------------------------------------------------------------------
ENUM_SHAPES = tuple(s for s, _ in DEFAULT_SHAPES)
ENUM_LAYOUTS = ((2, 1, False), (4, 1, False), (8, 1, False), (6, 1, False), (1, 1, False),
                (2, 2, False), (2, 2, True), (4, 2, False), (4, 2, True), (2, 4, False),
                (1, 4, True), (16, 1, False), (8, 2, False))
ENUM_FAULTS = (None,) * 4 + F.drawn_kinds()
ENUM_SIZES = SMALL_SIZES + ODD_SIZES + ("medium",) * 3
ENUM_CAPTURE = ((False, False), (False, False), (True, False), (True, True))
_RADICES = (len(ENUM_SHAPES), len(ENUM_LAYOUTS), len(PLACEMENTS), len(ENUM_FAULTS), len(OPS),
            len(ENUM_SIZES), len(DTYPES), len(ENUM_CAPTURE))
ENUM_TOTAL = math.prod(_RADICES)


def _multiplier() -> int:
    # A multiplier coprime with the total scrambles the walk: consecutive indices change
    # every digit, so the first N points cover every dimension evenly.
    m = int(ENUM_TOTAL * 0.6180339887) | 1
    while math.gcd(m, ENUM_TOTAL) != 1:
        m += 2
    return m


_MULT = _multiplier()


def enum_plan(index: int) -> Plan:
    if not 0 <= index < ENUM_TOTAL:
        raise UserError(f"enumeration index {index} out of range 0..{ENUM_TOTAL - 1}")
    pid = f"e{index}"
    k = (index * _MULT) % ENUM_TOTAL
    digits = []
    for r in _RADICES:
        k, d = divmod(k, r)
        digits.append(d)
    si, li, pi, fi, oi, zi, di, ci = digits
    rng = random.Random(seed_of("enum", index))
    shape = ENUM_SHAPES[si]
    cluster = build_shape(shape)
    tp, dp, dpg = ENUM_LAYOUTS[li]
    if tp * dp > min(cluster.num_gpus, MAX_WORLD):
        fits = [lay for lay in ENUM_LAYOUTS if lay[0] * lay[1] <= cluster.num_gpus]
        tp, dp, dpg = fits[li % len(fits)]
    size = ENUM_SIZES[zi]
    if size == "medium":
        if tp * dp > 8:              # keep the expensive sizes on small worlds
            tp, dp, dpg = (8, 1, False) if cluster.num_gpus >= 8 else (2, 1, False)
        ms = medium_sizes(tp)
        size = ms[rng.randrange(len(ms))]
    placement = PLACEMENTS[pi]
    capture, discard = ENUM_CAPTURE[ci]
    placement_refs = placement_of(shape, tp * dp, placement, pid)
    kind = ENUM_FAULTS[fi]
    faults = () if kind is None else (
        _resolve_fault(kind, cluster, placement_refs, random.Random(seed_of("faults", pid))),)
    return Plan(pid, shape, tp, dp, dpg, placement, faults, (OPS[oi],), (size,), (DTYPES[di],),
                capture, discard, rng.randrange(1 << 31), *_knobs(pid))


def enumerate_scenarios(count: int, start: int = 0) -> Iterator[Scenario]:
    for i in range(start, start + count):
        yield build(enum_plan(i))


def enum_ids(count: int, start: int = 0) -> list[str]:
    return [f"e{i}" for i in range(start, start + count)]


# -- ids -------------------------------------------------------------------------------------------
_ID = re.compile(r"^(?:([sk])(\d+)-(\d+)|e(\d+))$")


def plan_from_id(sid: str) -> Plan:
    m = _ID.match(sid.strip())
    if not m:
        raise UserError(f"scenario id {sid!r} is not a generated id; accepted: s<seed>-<index> "
                        f"(the sampler, e.g. s0-17), k<seed>-<index> (a shortcut-policy knob scenario, "
                        f"e.g. k0-17) or e<index> (the enumeration, e.g. e42)")
    if m.group(4) is not None:
        return enum_plan(int(m.group(4)))
    draw = knob_plan if m.group(1) == "k" else sample_plan
    return draw(int(m.group(2)), int(m.group(3)))


def scenario_from_id(sid: str) -> Scenario:
    """Regenerate the scenario a sweep reported under `sid`."""
    return build(plan_from_id(sid))


def vocabulary() -> dict[str, tuple[str, ...]]:
    """Words a --filter substring may match, by dimension (for error messages)."""
    return {
        "shape": tuple(dict.fromkeys([s for s, _ in DEFAULT_SHAPES] + list(BIG_SHAPES))),
        "family": tuple(PRESETS),
        "layout": ("tp1", "tp2", "tp4", "tp6", "tp8", "tp16", "xdp2", "xdp4", "+dp"),
        "placement": PLACEMENTS,
        "op": OPS,
        "dtype": DTYPES,
        "fault": F.kind_names() + ("faults", "clean"),
        "mode": ("capture", "eager", "discard", "multihost", "onehost", "lazy", "expandable",
                 "nccl_env", "flashinfer_mesh", "knob"),
        "knob": tuple(k.name for k in K.KNOBS),
        "id": ("s<seed>-<index>", "k<seed>-<index>", "e<index>"),
    }
