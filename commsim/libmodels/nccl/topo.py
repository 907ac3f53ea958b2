"""What NCCL learns of the machine at init, through the process's own driver and NVML, and
the bootstrap all-gather that shares it (src/init.cc fillInfo + bootstrapAllGather, then
ncclTopoGetSystem over NVML / sysfs; NVIDIA/nccl v2.27.3-1). The result is the decision
model's `NcclMachine` (commsim/libmodels/nccl_rules.py), so NCCL's search is that model, fed
by what this process's driver answers rather than by the topology file.

Per rank (src/init.cc fillInfo, src/misc/utils.cc getHostHash):
- hostHash (src/misc/utils.cc getHostHashOnce): the hash of gethostname(2), as the
  process's UTS namespace answers it, followed by /proc/sys/kernel/random/boot_id;
  NCCL_HOSTID, where set, replaces the whole string. One simulated host has one boot id
  (UNCONFIRMED that containers of a host read the same one; the kernel's), so the hostname
  decides: processes with hostnames of their own (no_shared_host_identity) are other nodes
  to every hostHash comparison (p2p.cc p2pCanConnect, shm.cc shmCanConnect, init.cc's
  local ranks), rule NC23. The identity string stands for the hash here.
- shmDev: `stat("/dev/shm").st_dev`, here the driver's shm namespace.
- busId / nvmlDev: the host index of the current device (`driver.nvml_index`, then
  `nvml_host_index`: a container numbers its own GPUs from 0, row W3), which keys every
  per-GPU fact below; two containers' GPUs never collide in NCCL's "Duplicate GPU
  detected", which compares hostHash and busId (src/init.cc).
- cuMem support: CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
  (src/misc/cudawrap.cc ncclIsCuMemSupported); multicast: CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED
  (src/transport/nvls.cc ncclNvlsInit); FABRIC handles: ..._HANDLE_TYPE_FABRIC_SUPPORTED and
  NVML's fabric info (src/init.cc ncclMnnvlCheck); IMEX channels: the channel device nodes
  the process can open (the FABRIC self-test needs one).
- per same-host peer outside the process's container: NVLink from the far ends of this GPU's
  own links (2.27 fills only its own GPU into the topology, ncclTopoFillGpu through NVML,
  src/graph/xml.cc, and fuses the local ranks' XML, src/graph/topo.cc ncclTopoGetSystem), so
  a switched peer in another container is NVL (rule NC25); its PCIe path stays SYS;
- per same-host peer: NVLink from the far ends of this GPU's active P2P-capable links
  (src/graph/xml.cc ncclTopoGetXmlFromGpu reads them one by one: a GPU with some link down
  keeps NVLink over the rest), nvmlDeviceGetP2PStatus where the driver cannot tell per link; and
  whether `cudaDeviceCanAccessPeer` allows it; for a peer not visible to this process NCCL
  reads NVML's P2P status of the pair instead (src/transport/p2p.cc p2pCanConnect: "CUDA
  10.1 and later can use P2P with invisible devices", checked against the NVML pair info);
  which NVML capability index it reads is UNCONFIRMED (the simulated NVML's one status).
- per same-host peer without NVLink: the PCIe path NCCL's topology detection reads from
  sysfs (src/graph/topo.cc), asked of the driver (`pci_path`); `nvidia-smi topo -m`'s NODE
  (host bridges within a CPU socket) is NCCL's PHB. A driver that cannot tell gives SYS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cuda.bindings import driver as cu

from commsim.driver import NVML_P2P_STATUS_OK
from commsim.libmodels.nccl_rules import NcclMachine, NcclRank, pcie_path

_A = cu.CUdevice_attribute


@dataclass(frozen=True)
class PeerInfo:
    """One rank's ncclPeerInfo as the bootstrap all-gather carries it: the decision model's
    facts of the rank (`facts`: hostHash as the host, shmDev as the shm namespace, the GPU's
    cuMem / multicast / FABRIC / IMEX support and fabric info), and what only set-up needs."""

    facts: NcclRank
    pid: int                            # pidHash
    nvml: int                           # busId: the GPU's host index
    cuda_dev: int
    nvlink: tuple[bool, ...]            # per host index of this host's GPUs
    pci: tuple[str, ...]                # NCCL's PCIe path type per host index (PIX ... SYS)
    access: tuple[bool, ...]            # cudaDeviceCanAccessPeer per host index (NVML's P2P
                                        # status for an invisible one)

    @property
    def rank(self) -> int:
        return self.facts.rank

    @property
    def host(self) -> str:
        return self.facts.host

    @property
    def node(self) -> tuple[bytes, int]:
        """The NVLink clique (cluster UUID, clique id): an MNNVL node."""
        return (self.facts.uuid, self.facts.clique)


def _attr(driver: Any, attr: Any, dev: int) -> bool:
    err, v = driver.cuDeviceGetAttribute(attr, dev)
    return int(err) == 0 and bool(v)


def _nvml_index(driver: Any, ordinal: int) -> int:
    """The NVML index of a CUDA ordinal (NCCL matches them by PCI bus id); a driver that
    cannot tell numbers them alike."""
    index = getattr(driver, "nvml_index", None)
    return ordinal if index is None else int(index(ordinal))


def host_identity(driver: Any, host_id: str | None = None) -> str:
    """What NCCL hashes into hostHash (module docstring): NCCL_HOSTID (`host_id`) where set,
    else the hostname this process reads (the boot id every process of a host shares adds
    nothing that tells them apart)."""
    if host_id:
        return host_id
    uts = getattr(driver, "uts_hostname", None)
    return driver.gethostname() if uts is None else uts()


def local_info(driver: Any, rank: int, host_id: str | None = None) -> PeerInfo:
    """What this rank learns of itself through its driver (fillInfo + topology detection);
    `host_id`: the process's NCCL_HOSTID."""
    _, dev = driver.cudaGetDevice()
    dev = int(dev)
    nvml = _nvml_index(driver, dev)
    _, count = driver.nvmlDeviceGetCount()
    _, ordinals = driver.cudaGetDeviceCount()
    by_nvml = {_nvml_index(driver, o): o for o in range(int(ordinals))}
    # Facts by host index, what the PCI bus id names across processes: under a container's
    # device cgroup NVML numbers only the container's GPUs (row W3), so two containers'
    # index 0 are different GPUs; one outside this container is neither asked nor linked.
    host_of = getattr(driver, "nvml_host_index", None)
    bus = [j if host_of is None else int(host_of(j)) for j in range(int(count))]
    width = getattr(driver, "host_gpu_count", None)
    width = max(max(bus, default=-1) + 1, int(width()) if width is not None else 0)
    nvlink, access, pci = [False] * width, [False] * width, ["SYS"] * width
    # A GPU outside the container: the far ends of this GPU's own NVLinks name it (NC25),
    # and a peer this process cannot see is allowed P2P on that fact (NC16).
    reach_of = getattr(driver, "nvml_nvlink_reach", None)
    reach = reach_of(nvml) if reach_of is not None else None
    for k in range(width):
        if k not in bus and reach is not None and reach[k]:
            nvlink[k] = access[k] = True
    ask = getattr(driver, "pci_path", None)
    for j in range(int(count)):
        k = bus[j]
        if ask is not None and j != nvml:
            pci[k] = pcie_path(ask(nvml, j))
        err, status = driver.nvmlDeviceGetP2PStatus(nvml, j)
        p2p_status = j != nvml and int(err) == 0 and status == NVML_P2P_STATUS_OK
        # NCCL counts NVLinks link by link (src/graph/xml.cc, row NC28): a GPU with a link down
        # still reaches its peers over the others, where NVML's pair status says not
        # supported (row N2). A driver without the per-link answer gives the pair status.
        nvlink[k] = j != nvml and bool(reach[k]) if reach is not None else p2p_status
        o = by_nvml.get(j)
        if o is None:
            access[k] = p2p_status          # NVML's P2P status of the invisible peer
        elif j == nvml:
            access[k] = True
        else:
            err, ok = driver.cudaDeviceCanAccessPeer(dev, o)
            access[k] = int(err) == 0 and bool(ok)
    err, fab = driver.nvmlDeviceGetGpuFabricInfo(nvml)
    uuid, clique, state = (fab.cluster_uuid, fab.clique_id, fab.state) if int(err) == 0 \
        else (bytes(16), 0, 0)
    fabric_handle = _attr(driver, _A.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, dev)
    arch = "aarch64" if fabric_handle and any(uuid) else "x86_64"   # as machine_from_view
    host = host_identity(driver, host_id)
    facts = NcclRank(rank, host, driver.shm_namespace(), (driver.gethostname(), bus[nvml]), arch,
                     _attr(driver, _A.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev),
                     True, _attr(driver, _A.CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, dev),
                     fabric_handle, bool(driver.imex_channels()), bytes(uuid), int(clique),
                     int(state))
    return PeerInfo(facts, driver.getpid(), bus[nvml], dev, tuple(nvlink), tuple(pci), tuple(access))


def machine(infos: list[PeerInfo]) -> NcclMachine:
    """The decision model's view of the communicator, from every rank's PeerInfo."""
    ranks, paths, access = [p.facts for p in infos], {}, set()
    for a in infos:
        for b in infos:
            if a.rank == b.rank or a.host != b.host or a.nvml == b.nvml:
                continue
            paths[(a.rank, b.rank)] = ("NVL" if b.nvml < len(a.nvlink) and a.nvlink[b.nvml]
                                       else a.pci[b.nvml] if b.nvml < len(a.pci) else "SYS")
            if b.nvml < len(a.access) and a.access[b.nvml]:
                access.add((a.rank, b.rank))
    return NcclMachine(tuple(ranks), paths, frozenset(access), "driver")
