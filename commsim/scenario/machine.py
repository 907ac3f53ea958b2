"""The machine half of a scenario file: `[topology]`, `[placement]` and `[[fault]]`.

Machine faults are applied here, as the fault registry (commsim/scenario/faults.py) declares
them, so the Scenario's cluster is already the degraded machine; driver faults are only
validated and kept.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from commsim.topology import importers
from commsim.topology.model import Cluster, FabricState, GpuRef, TopologyError
from commsim.topology.presets import PRESETS
from commsim.scenario.fields import (
    ScenarioError, Table, check_choice, check_cuda_error, check_host, describe, parse_gpu,
)
from commsim.scenario import faults as F
from commsim.scenario import fidelity_faults   # the accepted causes of its kinds
from commsim.scenario.model import Fault

PRESET_KEYS = ("preset", "hosts")
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


def placement(source: str, data: Mapping[str, Any] | None, cluster: Cluster) -> tuple[GpuRef, ...]:
    """rank -> GPU. Default: the first `ranks` GPUs in cluster order (hosts, then index)."""
    t = Table(source, "[placement]", data or {}, ("ranks", "gpus"))
    total = cluster.num_gpus
    ranks = t.integer("ranks", minimum=1, what="world size")
    if ranks is not None and ranks > total:
        raise t.error(f"world size {ranks} is larger than the cluster's {total} GPUs; "
                      f"accepted: 1..{total} (one rank per GPU)", "ranks")
    items = t.array("gpus", 'gpus = ["host/0", "host/1"]')
    if items is None:
        world = total if ranks is None else ranks
        return tuple(cluster.gpu_refs())[:world]
    refs: list[GpuRef] = []
    for v in items:
        ref = parse_gpu(t, "gpus", v, cluster)
        if ref in refs:
            raise t.error(f"GPU {v!r} is placed twice; each rank drives its own GPU", "gpus")
        refs.append(ref)
    if ranks is not None and ranks != len(refs):
        raise t.error(f"lists {len(refs)} GPU(s) but ranks = {ranks}; give one GPU per rank "
                      f"(or drop ranks)", "gpus")
    return tuple(refs)


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
    kind = check_choice(probe, "kind", data["kind"], kinds, what="fault kind")
    needed = F.get_fault(kind).fields
    accepted = ("kind",) + needed + F.get_fault(kind).optional
    t = Table(source, label, data, accepted,
              required={f: _FAULT_EXAMPLES.get(f, f"{f} = ...") for f in needed}, hint=f" for kind {kind}")
    f: dict[str, Any] = {"kind": kind}
    if "host" in data:
        f["host"] = check_host(t, "host", data["host"], cluster)
    if "gpu" in data:
        f["gpu"] = parse_gpu(t, "gpu", data["gpu"], cluster)
    if "gpus" in data:
        f["gpus"] = _gpu_pair(t, data["gpus"], cluster, f["host"])
    if "state" in data:
        f["state"] = _fabric_state(t, data["state"])
    if "rank" in data:
        f["rank"] = t.check_int(data["rank"], "rank", 0, world - 1, what="rank",
                                note=f" (world size {world})")
    if "at_allocation" in data:
        f["at_allocation"] = t.check_int(data["at_allocation"], "at_allocation", 1,
                                         what="allocation number", note=" (1 = the first)")
    if "api" in data:
        f["api"] = t.string("api", pattern=r"[A-Za-z_][A-Za-z0-9_]*",
                            shape='a driver call name, e.g. "cudaIpcOpenMemHandle"')
    if "code" in data:
        f["code"] = check_cuda_error(t, "code", data["code"])
    if "nth" in data:
        f["nth"] = t.check_int(data["nth"], "nth", 1, what="call number", note=" (1 = the first)")
    if "cause" in data:
        choices = fidelity_faults.CAUSES.get(kind, ())
        f["cause"] = check_choice(t, "cause", data["cause"], choices, what=f"{kind} cause")
    if "hosts" in data:
        f["hosts"] = _host_list(t, data["hosts"], cluster)
    if "version" in data:
        f["version"] = t.string("version", pattern=r"\d+(\.\d+)*",
                                shape='a driver version such as "450.80.02"')
    return Fault(**f), t


def _host_list(t: Table, value: Any, cluster: Cluster) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise t.error(f'expected a non-empty array of host names, e.g. hosts = ["{cluster.hosts[0].name}"]; '
                      f"got {describe(value)}", "hosts")
    out = []
    for v in value:
        h = check_host(t, "hosts", v, cluster)
        if h in out:
            raise t.error(f"host {h!r} is listed twice", "hosts")
        out.append(h)
    return tuple(out)


_FAULT_EXAMPLES = {
    "host": 'host = "<host name>"',
    "gpu": 'gpu = "<host>/0"',
    "gpus": "gpus = [0, 1]",
    "state": f'state = "IN_PROGRESS" (one of {", ".join(s.name for s in FabricState)})',
    "rank": "rank = 0",
    "at_allocation": "at_allocation = 1",
    "api": 'api = "cudaIpcOpenMemHandle"',
    "code": 'code = "cudaErrorInvalidValue"',
    "cause": 'cause = "acs"',
    "hosts": 'hosts = ["<host name>"]',
    "version": 'version = "450.80.02"',
}


def _gpu_pair(t: Table, value: Any, cluster: Cluster, host: str) -> tuple[int, int]:
    n = len(cluster.host(host).gpus)
    if (not isinstance(value, list) or len(value) != 2
            or any(isinstance(v, bool) or not isinstance(v, int) for v in value)):
        got = describe(value) if not isinstance(value, list) else f"{value!r}"
        raise t.error(f"expected a pair of GPU indices of host {host}, e.g. gpus = [0, 1]; "
                      f"got {got}", "gpus")
    for v in value:
        t.check_int(v, "gpus", 0, n - 1, what="GPU index", note=f" (host {host} has {n} GPUs)")
    if value[0] == value[1]:
        raise t.error(f"the pair [{value[0]}, {value[1]}] names one GPU twice; give two "
                      f"distinct GPUs of host {host}", "gpus")
    return value[0], value[1]


def _fabric_state(t: Table, value: Any) -> str:
    names = tuple(s.name for s in FabricState)
    if isinstance(value, str) and value.upper() in names:
        return value.upper()  # NVML spells them in capitals; accept any case, store canonical
    return check_choice(t, "state", value, names, what="fabric state")
