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
- busId: the PCI bus id of the current device, here its host index
  (`driver.nvml_host_index`): inside a container's device cgroup NVML numbers the GPUs from
  0 (row W3), the bus id stays the host's, so two containers' GPUs never collide (NCCL's
  "Duplicate GPU detected" compares hostHash and busId, src/init.cc).
- cuMem support: CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
  (src/misc/cudawrap.cc ncclIsCuMemSupported); multicast: CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED
  (src/transport/nvls.cc ncclNvlsInit); FABRIC handles: ..._HANDLE_TYPE_FABRIC_SUPPORTED and
  NVML's fabric info (src/init.cc ncclMnnvlCheck); IMEX channels: the channel device nodes
  the process can open (the FABRIC self-test needs one).
- per same-host peer outside the process's container: NVLink from the far ends of this GPU's
  own links (2.27 fills only its own GPU into the topology, ncclTopoFillGpu through NVML,
  src/graph/xml.cc, and fuses the local ranks' XML, src/graph/topo.cc ncclTopoGetSystem), so
  a switched peer in another container is NVL (rule NC25);
- per same-host peer: NVLink from nvmlDeviceGetP2PStatus (NCCL reads NVLinks from NVML), and
  whether `cudaDeviceCanAccessPeer` allows it; for a peer not visible to this process NCCL
  reads NVML's P2P status of the pair instead (src/transport/p2p.cc p2pCanConnect: "CUDA
  10.1 and later can use P2P with invisible devices", checked against the NVML pair info);
  which NVML capability index it reads is UNCONFIRMED (the simulated NVML's one status).
  The PCIe distance NCCL reads from sysfs is not asked of the driver: a same-host pair
  without NVLink is SYS (UNCONFIRMED, as nccl_rules.machine_from_view).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cuda.bindings import driver as cu

from commsim.driver import NVML_P2P_STATUS_OK
from commsim.libmodels.nccl_rules import NcclMachine, NcclRank

_A = cu.CUdevice_attribute


@dataclass(frozen=True)
class PeerInfo:
    """One rank's ncclPeerInfo as the bootstrap all-gather carries it: the decision model's
    facts of the rank (`facts`: hostHash as the host, shmDev as the shm namespace, the GPU's
    cuMem / multicast / FABRIC / IMEX support and fabric info), and what only set-up needs."""

    facts: NcclRank
    pid: int                            # pidHash
    nvml: int                           # busId: the GPU's host index (not its container's)
    cuda_dev: int
    nvlink: tuple[bool, ...]            # per host index
    access: tuple[bool, ...]            # cudaDeviceCanAccessPeer per host index (the NVLink
                                        # fact for an invisible one)

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
    nvml = _nvml_index(driver, dev)         # in this process's NVML: its container's numbering
    _, count = driver.nvmlDeviceGetCount()
    _, ordinals = driver.cudaGetDeviceCount()
    # NCCL names GPUs by PCI bus id (peerInfo.busId), which a container does not renumber:
    # here the host index (row W3); facts about peers are kept by it.
    host_of = getattr(driver, "nvml_host_index", None)
    bus = [j if host_of is None else int(host_of(j)) for j in range(int(count))]
    slots = getattr(driver, "host_gpu_count", None)
    width = max(max(bus, default=-1) + 1, slots() if slots is not None else 0)
    at = {k: j for j, k in enumerate(bus)}                      # bus id -> NVML index
    me = bus[nvml]
    by_bus = {bus[_nvml_index(driver, o)]: o for o in range(int(ordinals))}
    reach_of = getattr(driver, "nvml_nvlink_reach", None)
    reach = reach_of(nvml) if reach_of is not None else None
    nvlink, access = [], []
    for k in range(width):
        if k in at:
            err, status = driver.nvmlDeviceGetP2PStatus(nvml, at[k])
            link = k != me and int(err) == 0 and status == NVML_P2P_STATUS_OK
        else:       # outside the container: the far end of this GPU's own links (NC25)
            link = bool(reach is not None and reach[k])
        nvlink.append(link)
        o = by_bus.get(k)
        if o is None:
            access.append(link)             # the invisible peer's NVLink (NC16)
        elif k == me:
            access.append(True)
        else:
            err, ok = driver.cudaDeviceCanAccessPeer(dev, o)
            access.append(int(err) == 0 and bool(ok))
    err, fab = driver.nvmlDeviceGetGpuFabricInfo(nvml)
    uuid, clique, state = (fab.cluster_uuid, fab.clique_id, fab.state) if int(err) == 0 \
        else (bytes(16), 0, 0)
    fabric_handle = _attr(driver, _A.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, dev)
    arch = "aarch64" if fabric_handle and any(uuid) else "x86_64"   # as machine_from_view
    host = host_identity(driver, host_id)
    facts = NcclRank(rank, host, driver.shm_namespace(), (driver.gethostname(), me), arch,
                     _attr(driver, _A.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev),
                     True, _attr(driver, _A.CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, dev),
                     fabric_handle, bool(driver.imex_channels()), bytes(uuid), int(clique),
                     int(state))
    return PeerInfo(facts, driver.getpid(), me, dev, tuple(nvlink), tuple(access))


def machine(infos: list[PeerInfo]) -> NcclMachine:
    """The decision model's view of the communicator, from every rank's PeerInfo."""
    ranks, paths, access = [p.facts for p in infos], {}, set()
    for a in infos:
        for b in infos:
            if a.rank == b.rank or a.host != b.host or a.nvml == b.nvml:
                continue
            paths[(a.rank, b.rank)] = "NVL" if b.nvml < len(a.nvlink) and a.nvlink[b.nvml] else "SYS"
            if b.nvml < len(a.access) and a.access[b.nvml]:
                access.add((a.rank, b.rank))
    return NcclMachine(tuple(ranks), paths, frozenset(access), "driver")
