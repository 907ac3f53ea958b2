"""Issue 17 fault kinds (docs/fidelity-rules.md), each declared once: its fields, how it
edits the machine, its generator weight and target, its label and its docs-table line.

Every kind here is a machine fact (an edit of the ground truth), applied while the scenario
loads, like the topology faults of machine.py. This table is the port unit for the fault
registry (issue 14): each entry carries everything the registry asks of a kind.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..topology.model import Cluster, ContainerCaps, GpuRef, ImexDomain, TopologyError
from .model import Fault

P2P_IPC_CAUSES = ("acs", "iommu")
P2P_WRITE_MODES = ("dropped", "corrupt")


@dataclass(frozen=True)
class FaultKind:
    name: str
    required: tuple[str, ...]           # [[fault]] keys besides kind
    apply: Callable[[Cluster, Fault], Cluster]
    target: Callable[[Cluster, Sequence[GpuRef], random.Random], dict[str, Any]]
    weight: float                       # relative weight in the sweep sampler
    label: Callable[[Fault], str]
    doc: str                            # one line of the docs/scenario-format.md fault table
    choices: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)


# -- edits ------------------------------------------------------------------------------------
def _edit_link(cluster: Cluster, host: str, gpus: tuple[int, int], **facts: Any) -> Cluster:
    h = cluster.host(host)
    i, j = gpus
    rows = [list(r) for r in h.links]
    rows[i][j] = dataclasses.replace(h.link(i, j), **facts)
    rows[j][i] = dataclasses.replace(h.link(j, i), **facts)
    return cluster.replace_host(host, links=tuple(tuple(r) for r in rows))


def _container(cluster: Cluster, host: str, **caps: bool) -> Cluster:
    h = cluster.host(host)
    return cluster.replace_host(host, container=dataclasses.replace(h.container, **caps))


def _imex_split(cluster: Cluster, hosts: tuple[str, ...]) -> Cluster:
    """`hosts` leave the IMEX domain they were in and form one of their own (row I2)."""
    current: list[ImexDomain] = list(cluster.imex_domains)
    if not current:
        seen: dict[tuple[str, ...], None] = {}
        for h in cluster.hosts:
            d = cluster.imex_domain_of(h.name)
            if d is not None:
                seen.setdefault(d.hosts, None)
        current = [ImexDomain(f"imex-{k}", hs) for k, hs in enumerate(seen)]
    kept = [dataclasses.replace(d, hosts=tuple(h for h in d.hosts if h not in hosts))
            for d in current]
    kept = [d for d in kept if d.hosts]
    return dataclasses.replace(cluster, imex_domains=tuple(kept) + (
        ImexDomain(f"imex-split-{len(kept)}", tuple(hosts)),))


# -- generator targets ---------------------------------------------------------------------------
def _pair(cluster: Cluster, placement: Sequence[GpuRef], rng: random.Random) -> dict[str, Any]:
    by_host: dict[str, list[int]] = {}
    for g in placement:
        by_host.setdefault(g.host, []).append(g.index)
    multi = sorted(h for h, ix in by_host.items() if len(ix) >= 2)
    if multi:
        h = rng.choice(multi)
        i, j = rng.sample(sorted(by_host[h]), 2)
    else:
        h = rng.choice(placement).host
        n = len(cluster.host(h).gpus)
        if n < 2:
            return {}
        i, j = rng.sample(range(n), 2)
    return {"host": h, "gpus": (min(i, j), max(i, j))}


def _with(target: dict[str, Any], **more: Any) -> dict[str, Any]:
    """A target plus more fields; still empty when the target found nothing to aim at."""
    return {**target, **more} if target else {}


def _host(cluster: Cluster, placement: Sequence[GpuRef], rng: random.Random) -> dict[str, Any]:
    return {"host": rng.choice(placement).host}


def _hosts(cluster: Cluster, placement: Sequence[GpuRef], rng: random.Random) -> dict[str, Any]:
    hosts = sorted({g.host for g in placement})
    if len(hosts) < 2:
        return {}
    return {"hosts": tuple(rng.sample(hosts, rng.randint(1, len(hosts) - 1)))}


def _old_driver(cluster: Cluster, placement: Sequence[GpuRef], rng: random.Random) -> dict[str, Any]:
    return {"host": rng.choice(placement).host,
            "version": rng.choice(("450.80.02", "535.104.05", "570.86.10"))}


KINDS: tuple[FaultKind, ...] = (
    FaultKind(
        "p2p_ipc_refused", ("host", "gpus", "cause"),
        lambda c, f: _edit_link(c, f.host, f.gpus, p2p=True, ipc_refused=f.cause),
        lambda c, p, r: _with(_pair(c, p, r), cause=r.choice(P2P_IPC_CAUSES)), 4.0,
        lambda f: f"p2p_ipc_refused({f.host} {f.gpus[0]}-{f.gpus[1]} {f.cause})",
        "P2P reported, but a legacy IPC open between the pair is refused: `cause` acs "
        "(cudaErrorPeerAccessUnsupported) or iommu (cudaErrorInvalidDevice); rows P1, P2",
        {"cause": P2P_IPC_CAUSES}),
    FaultKind(
        "p2p_writes_lost", ("host", "gpus", "cause"),
        lambda c, f: _edit_link(c, f.host, f.gpus, p2p=True, peer_writes=f.cause),
        lambda c, p, r: _with(_pair(c, p, r), cause=r.choice(P2P_WRITE_MODES)), 4.0,
        lambda f: f"p2p_writes_lost({f.host} {f.gpus[0]}-{f.gpus[1]} {f.cause})",
        "patched P2P: cuDeviceCanAccessPeer = 1 and every call succeeds, but peer writes are "
        "`cause` dropped or corrupt; the functional probe finds it; row P3",
        {"cause": P2P_WRITE_MODES}),
    FaultKind(
        "imex_split", ("hosts",),
        lambda c, f: _imex_split(c, f.hosts),
        _hosts, 3.0,
        lambda f: f"imex_split({','.join(f.hosts)})",
        "the listed hosts form an IMEX domain of their own: FABRIC handles still work within "
        "a host, but not between hosts of different IMEX domains; rows I2, I3"),
    FaultKind(
        "no_nvidia_caps", ("host",),
        lambda c, f: _container(c, f.host, nvidia_caps=False),
        _host, 3.0,
        lambda f: f"no_nvidia_caps({f.host})",
        "the host's processes run in a container without /dev/nvidia-caps: cuMulticastCreate "
        "answers CUDA_ERROR_INVALID_VALUE; symmetric memory carries on without multicast; rows "
        "MC3, W4, S1"),
    FaultKind(
        "no_imex_channel_device", ("host",),
        lambda c, f: _container(c, f.host, imex_channel_dev=False),
        _host, 3.0,
        lambda f: f"no_imex_channel_device({f.host})",
        "the host's container lacks /dev/nvidia-caps-imex-channels: FABRIC memory and imports "
        "answer CUDA_ERROR_NOT_PERMITTED although the host has channels; rows I1, W5"),
    FaultKind(
        "one_gpu_per_process", ("host",),
        lambda c, f: _container(c, f.host, one_gpu_per_process=True),
        _host, 3.0,
        lambda f: f"one_gpu_per_process({f.host})",
        "each process of the host sees only its own GPU (CUDA_VISIBLE_DEVICES, as Ray places "
        "workers): ordinals remapped, NVML still sees the host; rows W1, W2"),
    FaultKind(
        "pidfd_getfd_denied", ("host",),
        lambda c, f: _container(c, f.host, pidfd_getfd=False),
        _host, 2.0,
        lambda f: f"pidfd_getfd_denied({f.host})",
        "the host's processes may not pull a peer's fd with pidfd_getfd (container without "
        "CAP_SYS_PTRACE, Yama ptrace_scope >= 1): EPERM where the fd exchange relies on it; "
        "SCM_RIGHTS over a Unix socket is unaffected; row W7"),
    FaultKind(
        "driver_version", ("host", "version"),
        lambda c, f: c.replace_host(f.host, driver_version=f.version),
        _old_driver, 2.0,
        lambda f: f"driver_version({f.host} {f.version})",
        "the host runs this kernel driver (e.g. \"450.80.02\"): before branch 470 a second "
        "open of one IPC handle answers cudaErrorAlreadyMapped; row H2"),
)
BY_NAME = {k.name: k for k in KINDS}
NAMES = tuple(BY_NAME)


def apply(cluster: Cluster, f: Fault) -> Cluster:
    try:
        return BY_NAME[f.kind].apply(cluster, f)
    except TopologyError:
        raise
    except (KeyError, ValueError) as e:
        raise TopologyError(f"fault {f.kind}: {e}") from None


def resolve(kind: str, cluster: Cluster, placement: Sequence[GpuRef],
            rng: random.Random) -> Fault | None:
    """A generated fault of `kind` aimed at the scenario's GPUs, or None where it cannot
    apply (a pair on a host of one GPU, a split of a single host)."""
    fields = BY_NAME[kind].target(cluster, placement, rng)
    return Fault(kind, **fields) if fields else None


def _row_ids(doc: str) -> str:
    return doc.rsplit("; row", 1)[-1].removeprefix("s").strip() if "; row" in doc else "-"


def docs_table() -> str:
    """The rows of the docs/scenario-format.md fault table for these kinds (the docs hold
    exactly this text between the generated-table markers; a test keeps them equal)."""
    out = []
    for k in KINDS:
        keys = ", ".join(f"`{f}`" for f in k.required)
        extra = "; ".join(f"`{f}` one of {', '.join(f'`{c}`' for c in cs)}"
                          for f, cs in k.choices.items())
        text = k.doc.rsplit("; row", 1)[0]
        out.append(f"| `{k.name}` | {keys} | {text}{'. ' + extra if extra else ''}. | "
                   f"{_row_ids(k.doc)} |")
    return "\n".join(out)
