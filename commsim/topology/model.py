"""The topology model: pure, immutable data describing a cluster of hosts and GPUs.

This is the simulator's *ground truth*: the communicator never reads it;
it only learns what a real process could learn through driver queries. Everything here is
plain frozen dataclasses with validation, so a topology can be hashed, compared, pickled and
written back out.

Vocabulary:
- a **host** is one OS instance: it shares `/dev/shm` and the AF_UNIX namespace, so legacy IPC
  and POSIX-fd handles reach exactly the processes of one host;
- an **NVLink domain** is the set of GPUs joined by NVSwitch fabric; it may span hosts (a
  GB200 NVL72 rack is 18 hosts in one domain). NVML reports it per GPU as fabric info.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Iterator



from commsim.errors import UserError
from commsim.versions import Versions, installed as installed_versions



# Row M9: multicast objects came with CUDA 12.1, whose drivers are branch 530 and later
# (CUDA Toolkit release notes, table "CUDA Toolkit and Corresponding Driver Versions": 12.1 GA
# >= 530.30.02; NCCL v2.27.3-1 src/misc/cudawrap.cc loads every cuMulticast* entry point at
# version 12010): an older driver has neither the calls nor attribute 132.
MULTICAST_SINCE_BRANCH = 530

class TopologyError(UserError, ValueError):
    """A topology that cannot exist. The message names the field and what is accepted."""


class FabricState(IntEnum):
    """`nvmlGpuFabricState_t`."""

    NOT_SUPPORTED = 0
    NOT_STARTED = 1
    IN_PROGRESS = 2
    COMPLETED = 3


NVML_SUCCESS = 0
NVML_ERROR_UNKNOWN = 999  # any non-success status; only meaningful when state is COMPLETED
ZERO_UUID = bytes(16)

# `nvidia-smi topo -m` link names (the legend printed under the matrix, see seeds/000).
PCIE_LINKS = ("PIX", "PXB", "PHB", "NODE", "SYS")
_NV_RE = re.compile(r"^NV(\d+)$")
# `nvidia-smi topo -p2p` cells other than OK: why the pair has no P2P (docs/fidelity-rules.md T4).
P2P_REASONS = ("NS", "CNS", "GNS", "TNS", "U", "disabled")
# How a reported-but-not-real P2P pair fails (docs/fidelity-rules.md P1-P3).
IPC_REFUSALS = ("", "acs", "iommu")
PEER_WRITES = ("ok", "dropped", "corrupt")


@dataclass(frozen=True)
class Link:
    """The path between two GPUs of one host, as `nvidia-smi topo -m` names it.

    `kind` is "NV" (with `nvlinks` = the bonded link count of `NV#`) or one of PCIE_LINKS.
    `p2p` is what `cuDeviceCanAccessPeer` answers for the pair: NVLink implies it, PCIe paths
    allow it only where the platform does (GeForce cards never).
    """

    kind: str
    nvlinks: int = 0
    p2p: bool = True
    # Why p2p is False, as `topo -p2p` prints it ("" = not given). Kept for `explain` only.
    p2p_reason: str = ""
    # P2P reported but not real (rows P1-P3): a legacy IPC open between the pair is refused
    # ("acs": PeerAccessUnsupported, "iommu": InvalidDevice), or peer writes are lost.
    ipc_refused: str = ""
    peer_writes: str = "ok"

    def __post_init__(self) -> None:
        if self.p2p_reason and self.p2p_reason not in P2P_REASONS:
            raise TopologyError(f"link p2p_reason {self.p2p_reason!r}; accepted: "
                                f"{', '.join(P2P_REASONS)}")
        if self.ipc_refused not in IPC_REFUSALS:
            raise TopologyError(f"link ipc_refused {self.ipc_refused!r}; accepted: acs, iommu "
                                f"(or empty)")
        if self.peer_writes not in PEER_WRITES:
            raise TopologyError(f"link peer_writes {self.peer_writes!r}; accepted: "
                                f"{', '.join(PEER_WRITES)}")
        if self.kind == "NV":
            if self.nvlinks < 1:
                raise TopologyError(f"link NV needs nvlinks >= 1, got {self.nvlinks}")
        elif self.kind in PCIE_LINKS:
            if self.nvlinks:
                raise TopologyError(f"link {self.kind} is PCIe and cannot carry nvlinks={self.nvlinks}")
        else:
            raise TopologyError(
                f"unknown link kind {self.kind!r}; accepted: NV<count>, {', '.join(PCIE_LINKS)}")

    @property
    def is_nvlink(self) -> bool:
        return self.kind == "NV"

    @property
    def label(self) -> str:
        """The `topo -m` cell text, e.g. `NV18` or `SYS`."""
        return f"NV{self.nvlinks}" if self.is_nvlink else self.kind

    @property
    def lost_writes(self) -> str:
        """How writes through the pair's peer path fail ("dropped", "corrupt"), "" for a sound
        path. Only a reported P2P can be a patched one (row P3: cuDeviceCanAccessPeer = 1
        and every call succeeds): with P2P not reported, `peer_writes` describes nothing, as
        `p2p_real` and the oracle's truth.p2p_unreal already read it."""
        return "" if not self.p2p or self.peer_writes == "ok" else self.peer_writes

    @property
    def p2p_real(self) -> bool:
        """P2P as a functional probe finds it: reported, IPC opens, and writes arrive (P4)."""
        return self.p2p and not self.ipc_refused and self.peer_writes == "ok"

    @classmethod
    def parse(cls, text: str, p2p: bool | None = None) -> "Link":
        """Parse a `topo -m` cell (`NV12`, `PIX`, ...). NVLink implies P2P unless told."""
        text = text.strip().upper()
        m = _NV_RE.match(text)
        if m:
            return cls("NV", int(m.group(1)), True if p2p is None else p2p)
        if text in PCIE_LINKS:
            return cls(text, 0, True if p2p is None else p2p)
        raise TopologyError(
            f"unknown link {text!r}; accepted: NV<count>, {', '.join(PCIE_LINKS)}")


@dataclass(frozen=True)
class FabricInfo:
    """`nvmlGpuFabricInfo_t` for one GPU: what NVML *reports*."""

    cluster_uuid: bytes = ZERO_UUID
    clique_id: int = 0
    state: FabricState = FabricState.NOT_SUPPORTED
    status: int = NVML_SUCCESS

    def __post_init__(self) -> None:
        if not isinstance(self.cluster_uuid, bytes) or len(self.cluster_uuid) != 16:
            raise TopologyError("fabric cluster_uuid must be 16 bytes (NVML_GPU_FABRIC_UUID_LEN)")
        object.__setattr__(self, "state", FabricState(self.state))


@dataclass(frozen=True)
class Gpu:
    """One GPU as its own process sees it through device attributes."""

    index: int                     # local ordinal on its host
    model: str                     # marketing name, e.g. "NVIDIA H100 80GB HBM3"
    compute_capability: tuple[int, int]
    memory_bytes: int
    vmm: bool = True               # CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED (102)
    posix_fd: bool = True          # ..._HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED (103)
    fabric_handle: bool = False    # ..._HANDLE_TYPE_FABRIC_SUPPORTED (128)
    multicast: bool = False        # ..._MULTICAST_SUPPORTED (132)
    gpu_direct_rdma: bool = True   # ..._GPU_DIRECT_RDMA_SUPPORTED (116)
    ipc_event: bool = True         # ..._IPC_EVENT_SUPPORTED (125); legacy IPC needs unified addressing
    fabric: FabricInfo = field(default_factory=FabricInfo)
    nvlinks_up: bool = True        # every P2P-capable NVLink active (what FlashInfer/TRT-LLM check)
    uuid: str = ""

    def __post_init__(self) -> None:
        if self.index < 0:
            raise TopologyError(f"gpu index must be >= 0, got {self.index}")
        if self.memory_bytes <= 0:
            raise TopologyError(f"gpu {self.index}: memory_bytes must be > 0")
        cc = tuple(self.compute_capability)
        if len(cc) != 2 or not all(isinstance(x, int) and x >= 0 for x in cc):
            raise TopologyError(f"gpu {self.index}: compute_capability must be (major, minor)")
        object.__setattr__(self, "compute_capability", cc)

    @property
    def sm(self) -> int:
        """Compute capability as vLLM's tables index it (9.0 -> 90, 10.0 -> 100)."""
        return self.compute_capability[0] * 10 + self.compute_capability[1]


@dataclass(frozen=True)
class ContainerCaps:
    """What the processes of a host can reach when they run in a container (rows W4-W7).
    The defaults are a bare-metal host: every device node present, every syscall allowed."""

    nvidia_caps: bool = True        # /dev/nvidia-caps mounted: multicast objects (row MC3)
    imex_channel_dev: bool = True   # /dev/nvidia-caps-imex-channels mounted (rows I1, W5)
    pidfd_getfd: bool = True        # CAP_SYS_PTRACE / ptrace scope lets fds be pulled (row W7)
    one_gpu_per_process: bool = False  # CUDA_VISIBLE_DEVICES = the process's own GPU (W1, W2)
    # Each process in a container of its own (Docker without --ipc=host / --pid=host): its own
    # /dev/shm, IPC and pid namespaces (row W6).
    container_per_process: bool = False
    # The size of the /dev/shm the host's processes see, in bytes; 0: the host's own, never
    # the limit here. Docker gives a container 64 MB unless --shm-size says otherwise
    # (NVIDIA/nccl#342).
    shm_bytes: int = 0
    # Each process in a UTS namespace of its own (a container per process with Docker's
    # default hostname, its container id): processes of one host do not share a hostname.
    own_uts: bool = False


@dataclass(frozen=True)
class Host:
    """One OS instance with its GPUs and the link matrix between them."""

    name: str
    gpus: tuple[Gpu, ...]
    # links[i][j] for i != j; the diagonal is None ("X" in topo -m).
    links: tuple[tuple[Link | None, ...], ...]
    imex_channels: tuple[int, ...] = ()   # /dev/nvidia-caps-imex-channels/channel<N> usable here
    # The kernel driver of this host when it differs from the run's (a host left on an older
    # driver: the driver_version fault); "" runs the run's (Cluster.versions.driver).
    driver_version: str = ""
    shm_namespace: str = ""               # hosts sharing a namespace share /dev/shm
    arch: str = "x86_64"
    container: ContainerCaps = field(default_factory=ContainerCaps)

    def __post_init__(self) -> None:
        if not self.name or not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", self.name):
            raise TopologyError(
                f"host name {self.name!r} is not a hostname; use letters, digits, '.', '_', '-'")
        n = len(self.gpus)
        if n == 0:
            raise TopologyError(f"host {self.name}: needs at least one GPU")
        for i, g in enumerate(self.gpus):
            if g.index != i:
                raise TopologyError(f"host {self.name}: gpu at position {i} has index {g.index}")
        if len(self.links) != n or any(len(row) != n for row in self.links):
            raise TopologyError(f"host {self.name}: link matrix must be {n}x{n}")
        for i in range(n):
            for j in range(n):
                a = self.links[i][j]
                if i == j:
                    if a is not None:
                        raise TopologyError(f"host {self.name}: links[{i}][{i}] must be empty (self)")
                    continue
                if a is None:
                    raise TopologyError(f"host {self.name}: links[{i}][{j}] is missing")
                b = self.links[j][i]
                if b is not None and (a.kind, a.nvlinks, a.p2p) != (b.kind, b.nvlinks, b.p2p):
                    raise TopologyError(
                        f"host {self.name}: link GPU{i}-GPU{j} is {a.label} but GPU{j}-GPU{i} is "
                        f"{b.label}; the matrix must be symmetric")
        if any(c < 0 for c in self.imex_channels):
            raise TopologyError(f"host {self.name}: imex channel numbers must be >= 0")
        if self.arch not in ("x86_64", "aarch64"):
            raise TopologyError(f"host {self.name}: arch must be x86_64 or aarch64, got {self.arch!r}")
        if not self.shm_namespace:
            object.__setattr__(self, "shm_namespace", self.name)
        if self.driver_version and not re.match(r"^\d+(\.\d+)*$", self.driver_version):
            raise TopologyError(f"host {self.name}: driver_version {self.driver_version!r} is not "
                                f"a version such as 580.82.07")

    def process_namespace(self, pid: int) -> str:
        """The /dev/shm, IPC and pid namespace process `pid` of this host is in: the host's,
        or, with `container.container_per_process`, its container's own (row W6)."""
        if self.container.container_per_process:
            return f"{self.shm_namespace}.container-{pid}"
        return self.shm_namespace

    def process_hostname(self, pid: int) -> str:
        """The hostname process `pid` of this host reads (gethostname, its UTS namespace):
        the host's, or with `container.own_uts` its container's id, as Docker names a
        container's host (twelve hex digits; these are derived from the pid)."""
        if self.container.own_uts:
            return hashlib.sha256(f"{self.name}/{pid}".encode()).hexdigest()[:12]
        return self.name

    def gpu_namespace(self, index: int) -> str:
        """The namespace of the process that drives GPU `index` (one process per GPU, as
        the oracle and NCCL's rules place ranks): distinct per GPU in per-process containers."""
        if self.container.container_per_process:
            return f"{self.shm_namespace}.container-gpu{index}"
        return self.shm_namespace

    @property
    def usable_imex_channels(self) -> tuple[int, ...]:
        """IMEX channels a process here can open: configured, and the device node present in
        its container (rows I1, W5)."""
        return self.imex_channels if self.container.imex_channel_dev else ()

    def link(self, i: int, j: int) -> Link:
        lk = self.links[i][j]
        if lk is None:
            raise TopologyError(f"host {self.name}: no link from GPU{i} to itself")
        return lk


@dataclass(frozen=True)
class GpuRef:
    """A GPU by (host name, local index): the global identity used across the cluster."""

    host: str
    index: int

    def __str__(self) -> str:
        return f"{self.host}/gpu{self.index}"


@dataclass(frozen=True)
class NvlinkDomain:
    """GPUs joined by one NVSwitch fabric. It may span hosts (GB200 NVL72: 18 trays).

    `multi_node` domains are the MNNVL ones: NVML reports a non-zero cluster UUID and the
    IMEX service can move fabric handles between their hosts. A single-host NVSwitch board
    (HGX H100) is a domain too, for multicast, but NVML reports a zero UUID there.
    """

    name: str
    members: tuple[GpuRef, ...]
    cluster_uuid: bytes = ZERO_UUID

    @property
    def hosts(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for m in self.members:
            seen.setdefault(m.host, None)
        return tuple(seen)

    @property
    def multi_node(self) -> bool:
        return len(self.hosts) > 1


@dataclass(frozen=True)
class ImexDomain:
    """Hosts whose IMEX daemons trust each other (one nodes_config): FABRIC handles move only
    between them. It need not equal an NVLink domain or clique (row I2)."""

    name: str
    hosts: tuple[str, ...]


@dataclass(frozen=True)
class Cluster:
    """Hosts plus the NVLink domains over them. `source` says where the shape comes from.

    `imex_domains` empty means the default: the hosts of each multi-node NVLink domain form one
    IMEX domain (how NVL72 racks are set up)."""

    name: str
    hosts: tuple[Host, ...]
    domains: tuple[NvlinkDomain, ...] = ()
    source: str = ""
    imex_domains: tuple[ImexDomain, ...] = ()
    # The run's driver, CUDA runtime, PyTorch and NCCL versions (commsim/versions.py): every
    # layer reads them here.
    versions: Versions = field(default_factory=installed_versions)

    def __post_init__(self) -> None:
        if not self.hosts:
            raise TopologyError(f"cluster {self.name}: needs at least one host")
        names = [h.name for h in self.hosts]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise TopologyError(f"cluster {self.name}: duplicate host names {sorted(dup)}")
        by_name = {h.name: h for h in self.hosts}
        owner: dict[GpuRef, str] = {}
        for d in self.domains:
            for m in d.members:
                if m.host not in by_name:
                    raise TopologyError(f"domain {d.name}: unknown host {m.host!r}")
                if not 0 <= m.index < len(by_name[m.host].gpus):
                    raise TopologyError(f"domain {d.name}: {m} is not a GPU of host {m.host}")
                if m in owner:
                    raise TopologyError(f"{m} is in two NVLink domains ({owner[m]}, {d.name})")
                owner[m] = d.name
        imex_owner: dict[str, str] = {}
        for d in self.imex_domains:
            for h in d.hosts:
                if h not in by_name:
                    raise TopologyError(f"IMEX domain {d.name}: unknown host {h!r}; hosts: "
                                        f"{', '.join(names)}")
                if h in imex_owner:
                    raise TopologyError(f"host {h} is in two IMEX domains ({imex_owner[h]}, "
                                        f"{d.name}); an IMEX daemon has one nodes_config")
                imex_owner[h] = d.name
        # Lookup tables (not fields: equality and hashing stay those of the shape). A scan per
        # lookup made a 576-rank run cubic: every pair check walked the domain's members.
        object.__setattr__(self, "_by_name", by_name)
        object.__setattr__(self, "_domain", {m: d for d in self.domains for m in d.members})
        # host -> its IMEX domain (imex_domain_of): asked at every FABRIC import, 72 x 72 of
        # them on a rack, and the default domain was rebuilt from the members at each.
        imex: dict[str, ImexDomain] = {}
        if self.imex_domains:
            imex = {h: d for d in self.imex_domains for h in d.hosts}
        else:
            for d in self.domains:
                if d.multi_node:
                    dom = ImexDomain(f"imex-{d.name}", d.hosts)
                    for h in dom.hosts:
                        imex.setdefault(h, dom)
        object.__setattr__(self, "_imex", imex)
        # host name -> GpuRef of each of its GPUs, filled on first ask (gpu_refs_of): every
        # simulated process is spawned with the GPUs of its host.
        object.__setattr__(self, "_refs_of", {})

    # -- lookups ------------------------------------------------------------------------
    def host(self, name: str) -> Host:
        h = self._by_name.get(name)  # type: ignore[attr-defined]
        if h is not None:
            return h
        raise TopologyError(f"cluster {self.name}: no host {name!r}; hosts: {', '.join(h.name for h in self.hosts)}")

    def driver_version(self, host: str) -> str:
        """The kernel driver `host` runs: its own when a fault set one, else the run's."""
        return self.host(host).driver_version or self.versions.driver

    def has_multicast_driver(self, host: str) -> bool:
        """Whether `host`'s driver has multicast objects at all (row M9)."""
        return self.driver_major(host) >= MULTICAST_SINCE_BRANCH

    def driver_major(self, host: str) -> int:
        """The branch of `host`'s driver (580 for 580.82.07): some answers changed by it (H2)."""
        return int(self.driver_version(host).split(".")[0])

    def gpu(self, ref: GpuRef) -> Gpu:
        h = self._by_name.get(ref.host)  # type: ignore[attr-defined]
        return (h if h is not None else self.host(ref.host)).gpus[ref.index]

    def gpu_refs_of(self, host: str) -> tuple[GpuRef, ...]:
        """The GPUs of `host`, in index order. Kept per host: GpuRefs are immutable values and
        a host's GPU count never changes (the cluster is frozen)."""
        refs = self._refs_of.get(host)  # type: ignore[attr-defined]
        if refs is None:
            refs = tuple(GpuRef(host, g.index) for g in self.host(host).gpus)
            self._refs_of[host] = refs  # type: ignore[attr-defined]
        return refs

    def gpu_refs(self) -> Iterator[GpuRef]:
        for h in self.hosts:
            for g in h.gpus:
                yield GpuRef(h.name, g.index)

    @property
    def num_gpus(self) -> int:
        return sum(len(h.gpus) for h in self.hosts)

    def domain_of(self, ref: GpuRef) -> NvlinkDomain | None:
        return self._domain.get(ref)  # type: ignore[attr-defined]

    def same_host(self, a: GpuRef, b: GpuRef) -> bool:
        return a.host == b.host

    def same_domain(self, a: GpuRef, b: GpuRef) -> bool:
        da = self.domain_of(a)
        return da is not None and da is self.domain_of(b)

    def imex_domain_of(self, host: str) -> ImexDomain | None:
        """The IMEX domain of `host`: the declared one, else the hosts of its multi-node NVLink
        domain (the default), else None (a node-local channel only reaches its own host)."""
        self.host(host)
        return self._imex.get(host)  # type: ignore[attr-defined]

    def same_imex_domain(self, a: str, b: str) -> bool:
        """Whether a FABRIC handle exported on host `b` can be imported on host `a` as far as
        IMEX goes (row I2): same host always; else both in one IMEX domain."""
        if a == b:
            return True
        da = self.imex_domain_of(a)
        return da is not None and b in da.hosts

    def p2p(self, a: GpuRef, b: GpuRef) -> bool:
        """`cuDeviceCanAccessPeer` between two GPUs of one host (False across hosts)."""
        if a.host != b.host:
            return False
        if a.index == b.index:
            return True
        return self.host(a.host).link(a.index, b.index).p2p

    # -- editing (returns new clusters; the model stays immutable) -----------------------
    def replace_host(self, name: str, **changes: object) -> "Cluster":
        self.host(name)
        hosts = tuple(dataclasses.replace(h, **changes) if h.name == name else h for h in self.hosts)
        return dataclasses.replace(self, hosts=hosts)

    def replace_gpu(self, ref: GpuRef, **changes: object) -> "Cluster":
        h = self.host(ref.host)
        if not 0 <= ref.index < len(h.gpus):
            raise TopologyError(f"host {h.name} has no GPU {ref.index} (it has {len(h.gpus)})")
        gpus = tuple(dataclasses.replace(g, **changes) if g.index == ref.index else g for g in h.gpus)
        return self.replace_host(ref.host, gpus=gpus)

    def set_p2p(self, host: str, i: int, j: int, allowed: bool) -> "Cluster":
        h = self.host(host)
        n = len(h.gpus)
        if not (0 <= i < n and 0 <= j < n) or i == j:
            raise TopologyError(f"host {host}: no GPU pair ({i}, {j}); GPUs are 0..{n - 1}")
        rows = [list(r) for r in h.links]
        rows[i][j] = dataclasses.replace(h.link(i, j), p2p=allowed)
        rows[j][i] = dataclasses.replace(h.link(j, i), p2p=allowed)
        return self.replace_host(host, links=tuple(tuple(r) for r in rows))

    def slice_hosts(self, count: int) -> "Cluster":
        """The first `count` hosts, with domains cut to the GPUs that remain."""
        if not 1 <= count <= len(self.hosts):
            raise TopologyError(
                f"cluster {self.name} has {len(self.hosts)} hosts; a slice must keep 1..{len(self.hosts)}")
        hosts = self.hosts[:count]
        keep = {h.name for h in hosts}
        domains = []
        for d in self.domains:
            members = tuple(m for m in d.members if m.host in keep)
            if members:
                domains.append(dataclasses.replace(d, members=members))
        return dataclasses.replace(self, name=f"{self.name}[:{count}]", hosts=hosts, domains=tuple(domains))


def full_matrix(n: int, link: Link) -> tuple[tuple[Link | None, ...], ...]:
    """An n x n link matrix with the same link between every pair (an NVSwitch board)."""
    return tuple(tuple(None if i == j else link for j in range(n)) for i in range(n))


def matrix_from(n: int, cell: "callable[[int, int], Link]") -> tuple[tuple[Link | None, ...], ...]:
    return tuple(tuple(None if i == j else cell(i, j) for j in range(n)) for i in range(n))
