"""The fault kinds of the fidelity rules (docs/fidelity-rules.md: P2P reported but not real,
IMEX domains, container capabilities, the kernel driver's version), declared like the
built-in ones (scenario/faults.py registers them after those): keys, the causes a `cause` key
accepts, how each edits the machine, its generator weight and aim, its label and its
docs-table line. Every kind here is a machine fact, applied while the scenario loads.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Sequence

from commsim.topology.model import Cluster, GpuRef, ImexDomain
from commsim.scenario.fault_registry import MACHINE, FaultKind
from commsim.scenario.model import Fault

P2P_IPC_CAUSES = ("acs", "iommu")
P2P_WRITE_MODES = ("dropped", "corrupt")


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


def unjudgeable(faults: Sequence[Fault]) -> list[Fault]:
    """The drawn faults a sweep cannot judge: lost P2P writes (row P3) on a host whose
    processes each run in a container of their own (row W6). The functional probe's IPC
    open cannot cross containers and no query reports lost writes, so no communicator can
    know to avoid the same-host FABRIC path that then loses its bytes, and the oracle has
    nothing to hold it to (sweep s12-9281). The sampler leaves such a fault out; a scenario
    file may still combine them, to see the corruption."""
    boxed = {f.host for f in faults if f.kind == "container_per_process"}
    return [f for f in faults if f.kind == "p2p_writes_lost" and f.host in boxed]


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


def _aim(kind: str, target) -> Any:
    """The registry's draw: this kind aimed at the scenario's GPUs, or, where it cannot apply
    (a pair on a host of one GPU, a split of a single host), that GPU's NVLinks down."""
    def draw(cluster: Cluster, placement: Sequence[GpuRef], rng: random.Random, gpu: GpuRef) -> Fault:
        fields = target(cluster, placement, rng)
        return Fault(kind, **fields) if fields else Fault("nvlinks_down", gpu=GpuRef(gpu.host, gpu.index))
    return draw


KINDS: tuple[FaultKind, ...] = (
    FaultKind(
        "p2p_ipc_refused", ("host", "gpus", "cause"), MACHINE,
        "P2P reported, but a legacy IPC open between the pair is refused: `cause` `acs` "
        "(`cudaErrorPeerAccessUnsupported`) or `iommu` (`cudaErrorInvalidDevice`); the "
        "functional probe finds it.", "P1, P2",
        apply=lambda c, f: _edit_link(c, f.host, f.gpus, p2p=True, ipc_refused=f.cause), weight=4,
        draw=_aim("p2p_ipc_refused", lambda c, p, r: _with(_pair(c, p, r), cause=r.choice(P2P_IPC_CAUSES))),
        label=lambda f: f"p2p_ipc_refused({f.host} {f.gpus[0]}-{f.gpus[1]} {f.cause})",
        causes=P2P_IPC_CAUSES),
    FaultKind(
        "p2p_writes_lost", ("host", "gpus", "cause"), MACHINE,
        "patched P2P: `cuDeviceCanAccessPeer` = 1 and every call succeeds, but peer writes are "
        "`cause` `dropped` or `corrupt`; the functional probe's byte check finds it. A "
        "`p2p_disabled` of the pair listed after it leaves no reported P2P, hence no patched "
        "path; the sampler does not draw it on a host of `container_per_process` (no probe "
        "crosses containers, so no communicator could avoid it).", "P3",
        apply=lambda c, f: _edit_link(c, f.host, f.gpus, p2p=True, peer_writes=f.cause), weight=4,
        draw=_aim("p2p_writes_lost", lambda c, p, r: _with(_pair(c, p, r), cause=r.choice(P2P_WRITE_MODES))),
        label=lambda f: f"p2p_writes_lost({f.host} {f.gpus[0]}-{f.gpus[1]} {f.cause})",
        causes=P2P_WRITE_MODES),
    FaultKind(
        "imex_split", ("hosts",), MACHINE,
        "the listed hosts form an IMEX domain of their own: FABRIC handles still work within a "
        "host, not between hosts of different IMEX domains (`CUDA_ERROR_NOT_PERMITTED` at import); "
        "no query reveals it.", "I2, I3",
        apply=lambda c, f: _imex_split(c, f.hosts), weight=3, draw=_aim("imex_split", _hosts),
        label=lambda f: f"imex_split({','.join(f.hosts)})"),
    FaultKind(
        "no_nvidia_caps", ("host",), MACHINE,
        "the host's processes run in a container without `/dev/nvidia-caps`: "
        "`cuMulticastCreate` / `AddDevice` answer `CUDA_ERROR_INVALID_VALUE`; symmetric memory "
        "carries on without multicast.", "MC3, W4, S1",
        apply=lambda c, f: _container(c, f.host, nvidia_caps=False), weight=3,
        draw=_aim("no_nvidia_caps", _host), label=lambda f: f"no_nvidia_caps({f.host})"),
    FaultKind(
        "no_imex_channel_device", ("host",), MACHINE,
        "the host's container lacks `/dev/nvidia-caps-imex-channels`: FABRIC memory and imports "
        "answer `CUDA_ERROR_NOT_PERMITTED` although the host has channels.", "I1, W5",
        apply=lambda c, f: _container(c, f.host, imex_channel_dev=False), weight=3,
        draw=_aim("no_imex_channel_device", _host),
        label=lambda f: f"no_imex_channel_device({f.host})"),
    FaultKind(
        "one_gpu_per_process", ("host",), MACHINE,
        "each process of the host sees only its own GPU (`CUDA_VISIBLE_DEVICES`, as Ray places "
        "workers): ordinals remapped, NVML still sees the whole host.", "W1, W2",
        apply=lambda c, f: _container(c, f.host, one_gpu_per_process=True), weight=3,
        draw=_aim("one_gpu_per_process", _host), label=lambda f: f"one_gpu_per_process({f.host})"),
    FaultKind(
        "pidfd_getfd_denied", ("host",), MACHINE,
        "the host's processes may not pull a peer's fd with `pidfd_getfd` (container without "
        "`CAP_SYS_PTRACE`, Yama `ptrace_scope` >= 1): EPERM where the fd exchange relies on it; "
        "SCM_RIGHTS over a Unix socket is unaffected.", "W7",
        apply=lambda c, f: _container(c, f.host, pidfd_getfd=False), weight=2,
        draw=_aim("pidfd_getfd_denied", _host), label=lambda f: f"pidfd_getfd_denied({f.host})"),
    FaultKind(
        "container_per_process", ("host",), MACHINE,
        "each process of the host runs in a container of its own (Docker without `--ipc=host` / "
        "`--pid=host`): its own `/dev/shm`, IPC and pid namespaces. Same-node tests through shm "
        "see other nodes, fds do not cross containers (no socket path, `pidfd_open` ESRCH), legacy "
        "IPC opens are refused; NCCL uses the network.", "W6",
        apply=lambda c, f: _container(c, f.host, container_per_process=True), weight=2,
        draw=_aim("container_per_process", _host), label=lambda f: f"container_per_process({f.host})"),
    FaultKind(
        "driver_version", ("host", "version"), MACHINE,
        "the host runs this kernel driver (`version = \"450.80.02\"`): before branch 470 a second "
        "open of one IPC handle in one context answers `cudaErrorAlreadyMapped`.", "H2",
        apply=lambda c, f: c.replace_host(f.host, driver_version=f.version), weight=2,
        draw=_aim("driver_version", _old_driver), label=lambda f: f"driver_version({f.host} {f.version})"),
)
NAMES = tuple(k.name for k in KINDS)
