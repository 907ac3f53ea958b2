"""The machine half of a scenario file: `[topology]`, `[placement]` and `[[fault]]`.

Machine faults are applied here, as the fault registry (commsim/scenario/faults.py) declares
them, so the Scenario's cluster is already the degraded machine; driver faults are only
validated and kept.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

from commsim.topology import importers
from commsim.topology.model import Cluster, GpuRef, TopologyError
from commsim.topology.presets import PRESETS
from commsim.scenario.fields import ScenarioError, Table, check_choice, parse_gpu
from commsim.scenario import fault_keys
from commsim.scenario import faults as F
from commsim.scenario.model import Fault, RankView
from commsim.sim import visibility

PRESET_KEYS = ("preset", "hosts")
PLACEMENT_KEYS = ("ranks", "gpus", "devices", "visible")
MATRIX_KEYS = ("hosts", "host_prefix", "gpu_model", "domain", "matrix", "p2p_matrix")


def topology(source: str, data: Mapping[str, Any]) -> tuple[Cluster, str, list[str]]:
    """The cluster a `[topology]` table describes, its one-line spec for summaries, and the
    assumptions an explicit matrix import made (empty for presets)."""
    if "preset" in data and "matrix" in data:
        raise ScenarioError(
            f"{source}: [topology]: give either preset = \"...\" (a known machine) or an explicit "
            f"matrix = [...] topology, not both")
    if "matrix" in data:
        return _matrix_topology(source, data)
    if "preset" not in data:
        raise ScenarioError(
            f"{source}: [topology]: needs preset = \"<name>\" (one of {', '.join(PRESETS)}) or an "
            f"explicit matrix = [...] topology")
    stray = [k for k in data if k in MATRIX_KEYS and k not in PRESET_KEYS]
    if stray:
        raise ScenarioError(
            f"{source}: [topology] {stray[0]}: only an explicit matrix topology takes "
            f"{', '.join(MATRIX_KEYS)}; with preset the accepted keys are {', '.join(PRESET_KEYS)}")
    t = Table(source, "[topology]", data, PRESET_KEYS)
    name = check_choice(t, "preset", data["preset"], tuple(PRESETS), what="preset")
    cluster = _wrap(t, "preset", lambda: importers.load(name).cluster)   # the CLI's loader too
    hosts = t.integer("hosts", what="host count")
    if hosts is None:
        return cluster, name, []
    n = len(cluster.hosts)
    t.check_int(hosts, "hosts", 1, n, what="host count",
                note=f" (preset {name} has {n} host{'s' if n != 1 else ''})")
    return _wrap(t, "hosts", lambda: cluster.slice_hosts(hosts)), f"{name}:{hosts}", []


def _matrix_topology(source: str, data: Mapping[str, Any]) -> tuple[Cluster, str, list[str]]:
    t = Table(source, "[topology]", data, MATRIX_KEYS, hint=" for an explicit matrix topology")
    # Imported here: only explicit-matrix files need the nvidia-smi parser.
    from commsim.topology.importers.nvidia_smi import cluster_from_matrix_table
    notes: list[str] = []
    cluster = _wrap(t, None, lambda: cluster_from_matrix_table(dict(data), source, notes))
    return cluster, f"matrix x{len(cluster.hosts)} ({_domain_kind(cluster)})", notes


def _domain_kind(cluster: Cluster) -> str:
    """none | node | rack, read from the built cluster (the importer may have inferred it)."""
    if any(d.multi_node for d in cluster.domains):
        return "rack"
    return "node" if cluster.domains else "none"


def _wrap(t: Table, key: str | None, build: Callable[[], Cluster]) -> Cluster:
    """Run a model call; a TopologyError becomes a ScenarioError naming the file and field."""
    try:
        return build()
    except ScenarioError:
        raise
    except TopologyError as e:
        if str(e).startswith(f"{t.source}: "):
            raise ScenarioError(str(e)) from None  # already names the file and field
        raise t.error(str(e), key) from None


def placement(source: str, data: Mapping[str, Any] | None,
              cluster: Cluster) -> tuple[tuple[GpuRef, ...], tuple[RankView, ...]]:
    """rank -> GPU, and what each rank's process sees. Default: the first `ranks` GPUs in
    cluster order (hosts, then index), each process seeing its whole host."""
    t = Table(source, "[placement]", data or {}, PLACEMENT_KEYS)
    total = cluster.num_gpus
    ranks = t.integer("ranks", minimum=1, what="world size")
    items = t.array("gpus", 'gpus = ["host/0", "host/1"]')
    if items is None:
        if ranks is not None and ranks > total:
            raise t.error(f"world size {ranks} is larger than the cluster's {total} GPUs; "
                          f"accepted: 1..{total} (one rank per GPU), or list `gpus` to place "
                          f"several ranks on one GPU", "ranks")
        world = total if ranks is None else ranks
        refs = list(cluster.gpu_refs())[:world]
    else:
        # A GPU listed twice: several processes on one GPU (time-sliced, each its own
        # context); NCCL refuses two ranks of one communicator there (NC10).
        refs = [parse_gpu(t, "gpus", v, cluster) for v in items]
        if ranks is not None and ranks != len(refs):
            raise t.error(f"lists {len(refs)} GPU(s) but ranks = {ranks}; give one GPU per rank "
                          f"(or drop ranks)", "gpus")
    return tuple(refs), _views(t, refs, cluster)


def _per_rank(t: Table, key: str, world: int, example: str) -> list[str | None]:
    items = t.array(key, example)
    if items is None:
        return [None] * world
    if len(items) != world:
        raise t.error(f"lists {len(items)} entries for {world} rank(s); give one per rank "
                      f'("" for a rank left as is)', key)
    bad = [v for v in items if not isinstance(v, str)]
    if bad:
        raise t.error(f"{bad[0]!r} is not a string; write each rank's list as a string, "
                      f'{example}', key)
    return [v if v else None for v in items]


def _views(t: Table, refs: Sequence[GpuRef], cluster: Cluster) -> tuple[RankView, ...]:
    """`devices` (each rank's container device cgroup, host indices) and `visible` (each
    rank's CUDA_VISIBLE_DEVICES, indices or UUIDs of the container's GPUs); the rank's own
    GPU must be among what it sees."""
    devices = _per_rank(t, "devices", len(refs), 'devices = ["0,1", "2,3"]')
    visible = _per_rank(t, "visible", len(refs), 'visible = ["1,0", "GPU-8932f937"]')
    if all(d is None for d in devices) and all(v is None for v in visible):
        return ()
    out = []
    for r, (g, dev, vis) in enumerate(zip(refs, devices, visible)):
        uuids = visibility.host_uuids(cluster.host(g.host))
        try:
            seen = visibility.process_view(uuids, dev, vis)
        except ValueError as e:
            raise t.error(f"rank {r}: {e}", "devices") from None
        if g.index not in seen:
            key = "visible" if vis is not None else "devices"
            raise t.error(f"rank {r} drives {g.host}/{g.index}, which its process does not see "
                          f"(it sees {list(seen) or 'no GPU'}); add that GPU to its list", key)
        out.append(RankView(dev, vis))
    return tuple(out)


def faults(source: str, items: Sequence[Mapping[str, Any]], cluster: Cluster,
           world: int) -> tuple[tuple[Fault, ...], Cluster]:
    """Validate every `[[fault]]` and apply the topology ones, in file order."""
    out: list[Fault] = []
    for n, data in enumerate(items, 1):
        fault, t = _fault(source, n, data, cluster, world)
        out.append(fault)
        if not F.is_driver_fault(fault):
            cluster = _wrap(t, None, lambda: F.apply_machine_fault(cluster, fault))
    return tuple(out), cluster


def _fault(source: str, n: int, data: Mapping[str, Any], cluster: Cluster,
           world: int) -> tuple[Fault, Table]:
    label = f"[[fault]] #{n}"
    kinds = F.kind_names()
    if "kind" not in data:
        raise ScenarioError(f"{source}: {label} kind: missing; accepted: {', '.join(kinds)}")
    probe = Table(source, label, {}, ())
    kind = F.get_fault(check_choice(probe, "kind", data["kind"], kinds, what="fault kind"))
    keys = {f.name: f for f in dataclasses.fields(Fault)}
    t = Table(source, label, data, ("kind",) + kind.fields + kind.optional,
              required={k: fault_keys.example(keys[k]) for k in kind.fields},
              hint=f" for kind {kind.name}")
    f: dict[str, Any] = {"kind": kind.name}
    at = fault_keys.At(cluster, world, kind, f)
    for name, field in keys.items():
        if name != "kind" and name in data:
            f[name] = fault_keys.parse(field, t, data[name], at)
    return Fault(**f), t
