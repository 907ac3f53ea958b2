"""Text renderings of a cluster: the `nvidia-smi topo -m` matrix per host and the domain map."""

from __future__ import annotations

from commsim.topology.model import Cluster, FabricState, Host


def topo_matrix(host: Host) -> str:
    """The GPU part of `nvidia-smi topo -m`, tab-separated as the tool prints it, with a P2P
    column block appended after the legend (`topo -m` itself does not show P2P; `topo -p2p r`
    does, so it is printed the same way: OK / NS)."""
    n = len(host.gpus)
    head = "\t" + "\t".join(f"GPU{j}" for j in range(n))
    rows = [head]
    for i in range(n):
        cells = [" X " if i == j else host.link(i, j).label for j in range(n)]
        rows.append(f"GPU{i}\t" + "\t".join(cells))
    rows.append("")
    rows.append("P2P (cuDeviceCanAccessPeer):")
    rows.append(head)
    for i in range(n):
        cells = [" X " if i == j else _p2p_cell(host.link(i, j)) for j in range(n)]
        rows.append(f"GPU{i}\t" + "\t".join(cells))
    return "\n".join(rows)


def _p2p_cell(link) -> str:
    """The `topo -p2p r` cell: OK, or the refusal's cause when the topology knows it (T4)."""
    if link.p2p:
        return "OK"
    return link.p2p_reason if link.p2p_reason not in ("", "disabled") else "NS"


def domain_map(cluster: Cluster) -> str:
    lines = []
    if not cluster.domains:
        lines.append("NVLink domains: none (no NVSwitch fabric)")
    for d in cluster.domains:
        kind = "multi-node (MNNVL)" if d.multi_node else "single-node NVSwitch"
        uuid = d.cluster_uuid.hex() if any(d.cluster_uuid) else "0" * 32
        lines.append(f"domain {d.name}: {kind}, {len(d.members)} GPUs on {len(d.hosts)} host(s), "
                     f"cluster uuid {uuid}")
    lines.append("")
    lines.append("host\tGPUs\tmodel\tsm\tarch\tIMEX\tfabric (state/clique/uuid[0:4])")
    for h in cluster.hosts:
        g0 = h.gpus[0]
        states = sorted({FabricState(g.fabric.state).name for g in h.gpus})
        cliques = sorted({g.fabric.clique_id for g in h.gpus})
        uuids = sorted({g.fabric.cluster_uuid[:4].hex() for g in h.gpus})
        imex = ",".join(map(str, h.imex_channels)) or "-"
        lines.append(f"{h.name}\t{len(h.gpus)}\t{g0.model}\t{g0.sm}\t{h.arch}\t{imex}\t"
                     f"{'/'.join(states)} {','.join(map(str, cliques))} {','.join(uuids)}")
    return "\n".join(lines)


def describe(cluster: Cluster, max_hosts: int = 2) -> str:
    """Matrix of the first `max_hosts` distinct host shapes plus the domain map."""
    out = [f"cluster {cluster.name}: {len(cluster.hosts)} host(s), {cluster.num_gpus} GPUs"]
    if cluster.source:
        out.append(f"source: {cluster.source}")
    shown: set[tuple] = set()
    for h in cluster.hosts:
        shape = tuple(tuple(None if l is None else (l.label, l.p2p) for l in row) for row in h.links)
        if shape in shown:
            continue
        if len(shown) >= max_hosts:
            out.append("(further host shapes omitted)")
            break
        shown.add(shape)
        same = sum(1 for o in cluster.hosts
                   if tuple(tuple(None if l is None else (l.label, l.p2p) for l in row) for row in o.links) == shape)
        out.append("")
        out.append(f"host {h.name}" + (f" (and {same - 1} more of this shape)" if same > 1 else ""))
        out.append(topo_matrix(h))
    out.append("")
    out.append(domain_map(cluster))
    return "\n".join(out)
