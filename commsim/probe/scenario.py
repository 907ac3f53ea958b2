"""A MachineProbe as a scenario file: the explicit-matrix `[topology]` plus `[[fault]]`s.

Pure (no GPU): `scenario_text(probe)` is what `commsim probe` writes, tested on CPU with
made-up probes. The topology is the `nvidia-smi topo -m` form the loader reads
(docs/scenario-format.md, `cluster_from_matrix_table`); what that form would assume and the
probe contradicts is corrected with topology faults (IMEX missing, fabric state, zero cluster
UUID, no multicast, NVLinks down). What neither can express (a fabric-handle attribute the
model's defaults get wrong, IMEX channels on a host outside a rack domain) is written as a
comment under "not expressible", so the gap is visible instead of silently wrong.
"""

from __future__ import annotations

import json
import re
from typing import Any

from commsim.topology import gpu_models
from commsim.topology.importers.nvidia_smi import cluster_from_matrix_table
from commsim.topology.model import Cluster, FabricState, GpuRef, TopologyError, ZERO_UUID

from commsim.probe.machine import MachineProbe

_HOST_OK = re.compile(r"[^A-Za-z0-9._-]+")


def host_prefix(hostname: str) -> str:
    """A host prefix the scenario format accepts (the loader names the host `<prefix>-0`)."""
    return _HOST_OK.sub("-", hostname).strip("-._") or "host"


def _q(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)   # a JSON string is a valid TOML basic string


def _fabric_state(probe: MachineProbe, i: int) -> FabricState | None:
    g = probe.gpus[i]
    if g.fabric is not None:
        return FabricState(g.fabric.state)
    return FabricState.NOT_SUPPORTED if g.fabric_rc == 3 else None   # NVML_ERROR_NOT_SUPPORTED


def _domain(probe: MachineProbe) -> str:
    n = len(probe.gpus)
    all_nv = all(probe.links[i][j].upper().startswith("NV")
                 for i in range(n) for j in range(n) if i != j)
    if not all_nv:
        return "none"
    g0 = probe.gpus[0]
    if g0.fabric is not None and g0.fabric.cluster_uuid != ZERO_UUID:
        return "rack"   # NVML names a multi-node NVLink domain; this host is one member
    state = _fabric_state(probe, 0)
    switched = (state not in (None, FabricState.NOT_SUPPORTED)) or g0.multicast
    if switched and probe.imex_channels:
        # Only a rack domain has IMEX channels in the format; the zero cluster UUID NVML
        # reports is restored by zero_cluster_uuid faults (_faults).
        return "rack"
    return "node" if switched else "none"     # NVLink bridges without NVSwitch: no domain


def _gpu_model(probe: MachineProbe, notes: list[str]) -> str | None:
    names = sorted({g.name for g in probe.gpus})
    if len(names) > 1:
        notes.append(f"GPUs differ ({', '.join(names)}); the scenario gives all of them the "
                     f"model of GPU 0")
    try:
        gpu_models.resolve(probe.gpus[0].name)
    except TopologyError:
        notes.append(f"GPU model {probe.gpus[0].name!r} is not one the simulator knows; the "
                     f"importer's default attributes are used")
        return None
    return probe.gpus[0].name


def topology_table(probe: MachineProbe, notes: list[str]) -> dict[str, Any]:
    n = len(probe.gpus)
    matrix = [["X" if i == j else probe.links[i][j].upper() for j in range(n)] for i in range(n)]
    p2p = [[True if i == j else bool(probe.p2p[i][j]) for j in range(n)] for i in range(n)]
    table: dict[str, Any] = {"hosts": 1, "host_prefix": host_prefix(probe.hostname)}
    model = _gpu_model(probe, notes)
    if model:
        table["gpu_model"] = model
    table.update(domain=_domain(probe), matrix=matrix, p2p_matrix=p2p)
    return table


def _faults(probe: MachineProbe, cluster: Cluster, notes: list[str]) -> list[dict[str, Any]]:
    """Topology faults that make the imported cluster answer as the probed machine does."""
    host = cluster.hosts[0]
    out: list[dict[str, Any]] = []
    if host.imex_channels and not probe.imex_channels:
        out.append({"kind": "imex_missing", "host": host.name})
    elif probe.imex_channels and not host.imex_channels:
        notes.append(f"IMEX channel(s) {list(probe.imex_channels)} are present, but a host "
                     f"outside a rack domain has none in the scenario format")
    for i, g in enumerate(probe.gpus):
        sim = cluster.gpu(GpuRef(host.name, i))
        ref = f"{host.name}/{i}"
        state = _fabric_state(probe, i)
        if state is None:
            notes.append(f"GPU {i}: NVML fabric info unknown (return code {g.fabric_rc}); kept "
                         f"the importer's {sim.fabric.state.name}")
        elif state != sim.fabric.state:
            out.append({"kind": "fabric_state", "gpu": ref, "state": state.name})
        if g.fabric is not None and g.fabric.state == FabricState.COMPLETED and g.fabric.status:
            out.append({"kind": "fabric_status_error", "gpu": ref})
        if g.fabric is not None and g.fabric.cluster_uuid == ZERO_UUID and sim.fabric.cluster_uuid != ZERO_UUID:
            out.append({"kind": "zero_cluster_uuid", "gpu": ref})
        if sim.multicast and not g.multicast:
            out.append({"kind": "no_multicast", "gpu": ref})
        if g.nvlinks_up is False and sim.nvlinks_up:
            out.append({"kind": "nvlinks_down", "gpu": ref})
        for what, real, model in (("MULTICAST_SUPPORTED", g.multicast, sim.multicast),
                                  ("HANDLE_TYPE_FABRIC_SUPPORTED", g.fabric_handle, sim.fabric_handle),
                                  ("VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED", g.vmm, sim.vmm),
                                  ("HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED", g.posix_fd, sim.posix_fd)):
            if bool(real) != bool(model) and not (what == "MULTICAST_SUPPORTED" and not real):
                notes.append(f"GPU {i}: {what} is {int(real)} here, {int(model)} in the scenario")
        if tuple(g.compute_capability) != tuple(sim.compute_capability):
            notes.append(f"GPU {i}: compute capability {g.compute_capability} here, "
                         f"{sim.compute_capability} in the scenario")
    return out


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return _q(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return str(v)


def _probe_comment(probe: MachineProbe) -> list[str]:
    lines = [f"# host {probe.hostname} ({probe.arch}), NVIDIA driver {probe.driver_version or '?'}, "
             f"CUDA driver API {probe.cuda_driver_version}",
             f"# IMEX channels: {list(probe.imex_channels) or 'none'}"]
    for g in probe.gpus:
        fab = ("unknown" if g.fabric is None else
               f"{FabricState(g.fabric.state).name} status {g.fabric.status} clique "
               f"{g.fabric.clique_id} uuid {g.fabric.cluster_uuid.hex()}")
        lines.append(f"# GPU {g.index}: {g.name} sm_{g.compute_capability[0]}{g.compute_capability[1]} "
                     f"{g.memory_bytes >> 20} MiB {g.uuid}; vmm {int(g.vmm)} posix_fd "
                     f"{int(g.posix_fd)} fabric {int(g.fabric_handle)} multicast "
                     f"{int(g.multicast)}; fabric {fab}; nvlinks up {g.nvlinks_up}")
    return lines


def scenario_text(probe: MachineProbe, name: str | None = None) -> str:
    """The scenario file for `probe` (loads with commsim.scenario.schema.loads)."""
    if not probe.gpus:
        raise ValueError("a probe with no GPU")
    notes = list(probe.notes)
    table = topology_table(probe, notes)
    cluster = cluster_from_matrix_table(table, "<probe>")
    faults = _faults(probe, cluster, notes)
    sname = name or f"probe-{table['host_prefix']}"
    lines = [f"# Written by `commsim probe` on {probe.hostname}: this machine as the simulator "
             f"models it.", *_probe_comment(probe)]
    if notes:
        lines.append("# Not expressible in the scenario format, or not readable:")
        lines += [f"#   - {' '.join(n.split())}" for n in notes]
    lines += ["", "[scenario]", f"name = {_q(sname)}",
              f"description = {_q(f'{len(probe.gpus)} x {probe.gpus[0].name} on {probe.hostname}, probed')}",
              "", "[topology]"]
    lines += [f"{k} = {_value(v)}" for k, v in table.items()]
    for f in faults:
        lines += ["", "[[fault]]"] + [f"{k} = {_value(v)}" for k, v in f.items()]
    return "\n".join(lines) + "\n"
