"""`commsim scenario new`: from a bug report to a runnable scenario in one step.

Input is what a report carries: the pasted `nvidia-smi topo -m` of one host, how many hosts the
job used, the parallel layout (TP x DP), how ranks were placed, and optionally the policy (the
shortcut under suspicion) and the error the report shows.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from commsim.errors import UserError
from commsim.topology.importers.nvidia_smi import build_cluster, matrix_table, parse_topo_matrix
from commsim.topology.model import Cluster


@dataclass
class NewScenario:
    name: str
    topo_text: str
    topo_source: str
    hosts: int
    tp: int
    dp: int = 1
    placement: str = "contiguous"        # contiguous: fill a host first; spread: round-robin hosts
    policy: str = "default"
    ops: tuple[str, ...] = ("all_reduce",)
    sizes: tuple[str, ...] = ("16KiB",)
    dtype: str = "bfloat16"
    graph_capture: bool = False
    expect_error: str | None = None
    expect_step: str | None = None
    domain: str | None = None
    gpu_model: str | None = None
    host_prefix: str = "node"
    p2p_text: str | None = None          # `nvidia-smi topo -p2p r` of the same host, when given
    p2p_source: str = "<p2p>"


def _place(cluster: Cluster, world: int, how: str) -> list[str]:
    hosts = cluster.hosts
    if how == "contiguous":
        refs = [f"{h.name}/{g.index}" for h in hosts for g in h.gpus]
    elif how == "spread":
        depth = max(len(h.gpus) for h in hosts)
        refs = [f"{h.name}/{i}" for i in range(depth) for h in hosts if i < len(h.gpus)]
    else:
        raise UserError(f"--placement {how!r}: accepted: contiguous (fill each host first), "
                        f"spread (one rank per host in turn)")
    if world > len(refs):
        raise UserError(f"TP x DP needs {world} GPUs but {len(hosts)} host(s) of "
                        f"{len(hosts[0].gpus)} GPUs have {len(refs)}; raise --hosts or lower --tp/--dp")
    return refs[:world]


def build(spec: NewScenario, out: Path | None) -> tuple[str, list[str]]:
    """The scenario text and the import warnings. Nothing is written here."""
    if spec.tp < 1 or spec.dp < 1:
        raise UserError(f"--tp and --dp must be >= 1, got tp={spec.tp} dp={spec.dp}")
    parsed = parse_topo_matrix(spec.topo_text, spec.topo_source, spec.p2p_text, spec.p2p_source)
    cluster, warnings = build_cluster(parsed, spec.hosts, spec.domain, spec.gpu_model,
                                      host_prefix=spec.host_prefix, name=spec.name)
    world = spec.tp * spec.dp
    gpus = _place(cluster, world, spec.placement)
    policy = spec.policy
    if ":" in policy and ".py" in policy.split(":")[0] and out is not None:
        file, _, attr = policy.partition(":")
        policy = f"{os.path.relpath(Path(file).resolve(), out.resolve().parent)}:{attr}"
    q = json.dumps
    lines = [f"# Made by `commsim scenario new` from {spec.topo_source!r}: {spec.hosts} host(s), "
             f"TP {spec.tp} x DP {spec.dp}, {spec.placement} placement."]
    lines += [f"#   assumed: {' '.join(w.split())}" for w in warnings]
    lines += ["", "[scenario]", f"name = {q(spec.name)}", f"policy = {q(policy)}", "", "[topology]"]
    for key, value in matrix_table(cluster, spec.host_prefix).items():
        if isinstance(value, str) and "\n" in value:
            lines.append(f"{key} = '''\n{value}'''")
        else:
            lines.append(f"{key} = {q(value) if isinstance(value, str) else value}")
    lines += ["", "[placement]", f"gpus = {q(gpus)}"]
    for d in range(spec.dp):
        lines += ["", "[[group]]", f"name = {q('tp' if spec.dp == 1 else f'tp{d}')}",
                  f"ranks = {list(range(d * spec.tp, (d + 1) * spec.tp))}"]
    lines += ["", "[workload]", f"ops = {q(list(spec.ops))}", f"sizes = {q(list(spec.sizes))}",
              f"dtypes = {q([spec.dtype])}", f"graph_capture = {str(spec.graph_capture).lower()}"]
    if spec.expect_error:
        lines += ["", "[[expect]]", f"error = {q(spec.expect_error)}"]
        if spec.expect_step:
            lines.append(f"step = {q(spec.expect_step)}")
    return "\n".join(lines) + "\n", warnings
