"""Import the topology XML NCCL reads from NCCL_TOPO_FILE and writes with NCCL_TOPO_DUMP_FILE.

The file is a `<system version="1">` root with one `<cpu>` per NUMA node; under each a tree of
`<pci>` elements (bridges, then devices), with `<gpu dev sm rank gdr>` (holding `<nvlink target
count tclass>` and `<c2c>`) and `<nic>/<net>` leaves. A dump NCCL fuses over several hosts of
one NVLink domain (MNNVL) tags every `<cpu>` with `host_hash`. Hand-written files for VMs are
often *flattened*: bare `<pci class="0x030200">` devices, no `<gpu>`, no `<nvlink>` (NCCL asks
the driver for those at run time).

`parse_nccl_xml` reads the text; `build_cluster` turns it into a Cluster and returns, as
warnings, everything the file does not say and the import had to assume. Parsing uses the
standard library only (xml.etree.ElementTree); malformed input raises XmlTopologyError naming
the file, the line and column, and what is accepted.
"""

from __future__ import annotations

import dataclasses
import re
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from commsim.topology import gpu_models
from commsim.topology.limits import check_size
from commsim.topology.model import (
    Cluster, FabricInfo, FabricState, Gpu, GpuRef, Host, Link, NvlinkDomain, TopologyError,
)
from commsim.topology.presets import _cluster_uuid, _uuid  # same derivations as the presets, so shapes compare

__all__ = [
    "ACCEPTED", "DEVICE_MODELS", "XmlGpu", "XmlNic", "XmlTopology", "XmlTopologyError",
    "build_cluster", "import_file", "looks_like_xml", "parse_nccl_xml",
]

ACCEPTED = ("an NCCL topology XML (NCCL_TOPO_FILE / NCCL_TOPO_DUMP_FILE): a <system "
            "version=\"1\"> root whose <cpu> elements hold <pci> trees with <gpu> (and "
            "<nvlink>) and <nic>/<net> elements")

# PCI class codes (PCI-SIG class/subclass as NCCL records them in `class`).
_GPU_CLASSES = ("0x0300", "0x0302")          # VGA, 3D controller
_NIC_CLASSES = ("0x0200", "0x0207", "0x0280")  # Ethernet, InfiniBand, other network
_NVSWITCH_CLASS = "0x0680"                   # "bridge, other": how NVSwitches show up
# NCCL writes this pseudo bus id as the NVLink target when the far end is an NVSwitch whose
# PCI address NVML cannot give (NVLink 5 systems, both B300 and GB300 files here).
_NVSWITCH_PSEUDO_BUSID = "fffffff:ff:ff.0"

# PCI device id -> (marketing name, memory GiB). The XML carries the id, never the name or
# memory; names from the PCI ID Repository (pci-ids.ucw.cz, vendor 10de) and the .md files
# beside the sample dumps, memory from NVIDIA's product pages.
DEVICE_MODELS: dict[str, tuple[str, int]] = {
    "0x1db1": ("Tesla V100-SXM2-16GB", 16),
    "0x1db5": ("Tesla V100-SXM2-32GB", 32),
    "0x20b0": ("NVIDIA A100-SXM4-40GB", 40),
    "0x20b2": ("NVIDIA A100-SXM4-80GB", 80),
    "0x20b5": ("NVIDIA A100 80GB PCIe", 80),
    "0x2330": ("NVIDIA H100 80GB HBM3", 80),      # H100 SXM5 (oci_H100-topology.xml.md)
    "0x2331": ("NVIDIA H100 PCIe", 80),
    "0x2335": ("NVIDIA H200", 141),
    "0x26b9": ("NVIDIA L40S", 48),
    "0x2684": ("NVIDIA GeForce RTX 4090", 24),
    "0x2e12": ("NVIDIA GB10", 128),               # DGX Spark: 128 GB unified LPDDR5X
    "0x3182": ("NVIDIA B300", 288),               # HGX B300 (oci_B300MP.xml.md)
    "0x31c2": ("NVIDIA GB300", 288),              # GB300 NVL72 tray (oci_GB300MP.xml.md)
}
# NVLinks per GPU by compute capability (for --nvswitch on a flattened file): V100 6, A100 12,
# Hopper and Blackwell 18 (NVIDIA datasheets).
_NVLINKS_PER_GPU = {7: 6, 8: 12, 9: 18, 10: 18}


class XmlTopologyError(TopologyError):
    """An NCCL topology XML that cannot be read; names file, place and what is accepted."""


@dataclass(frozen=True)
class XmlGpu:
    """One GPU as the XML places it."""

    host: str                    # host key: the cpu's host_hash, "" for a single-host file
    cpu: int                     # position of its <cpu> (NUMA node) within that host
    path: tuple[str, ...]        # bus ids of the PCI bridges above it, top first
    busid: str
    dev: int | None              # CUDA ordinal on its host (<gpu dev>), None if flattened
    rank: int | None
    sm: int | None
    device_id: str               # PCI device id, "" if not recorded
    gdr: bool | None
    nvlinks: tuple[tuple[str, int, str], ...] = ()   # (target bus id, count, target class)
    c2c: bool = False

    @property
    def where(self) -> str:
        return f"GPU at {self.busid}" + (f" (dev {self.dev})" if self.dev is not None else "")


@dataclass(frozen=True)
class XmlNic:
    host: str
    name: str
    speed_mbps: int | None       # <net speed> in Mb/s; None for a bare PCI NIC
    busid: str


@dataclass(frozen=True)
class XmlTopology:
    source: str
    hosts: tuple[str, ...]                       # host keys in file order
    arch: dict[str, str]                         # host key -> x86_64 | aarch64
    gpus: tuple[XmlGpu, ...]
    nics: tuple[XmlNic, ...]
    nvswitches: frozenset[str] = frozenset()     # bus ids of NVSwitch PCI devices listed
    ignored: tuple[str, ...] = ()                # element names skipped

    def host_gpus(self, host: str) -> list[XmlGpu]:
        return [g for g in self.gpus if g.host == host]

    @property
    def flattened(self) -> bool:
        return all(g.dev is None for g in self.gpus)


# -- parsing ----------------------------------------------------------------------------


def _err(source: str, msg: str) -> XmlTopologyError:
    return XmlTopologyError(f"{source}: {msg}")


def _int(value: str | None, source: str, where: str, attr: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value, 0)
    except ValueError:
        raise _err(source, f"{where}: attribute {attr}={value!r} is not an integer") from None


def _parse_root(text: str, source: str) -> ET.Element:
    # NCCL never writes a DOCTYPE; refusing one keeps entity expansion out entirely.
    if re.search(r"<!(DOCTYPE|ENTITY)", text, re.IGNORECASE):
        raise _err(source, f"DOCTYPE/ENTITY declarations are not accepted; expected {ACCEPTED}")
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        line, col = e.position
        reason = str(e).split(":")[0]
        raise _err(source, f"line {line} column {col + 1}: malformed XML ({reason}); "
                           f"expected {ACCEPTED}") from None
    if root.tag == "graphs":
        raise _err(source, "this is an NCCL graph file (NCCL_GRAPH_FILE / NCCL_GRAPH_DUMP_FILE: "
                           "ring and tree channel orders), not a topology; give the file NCCL "
                           "reads from NCCL_TOPO_FILE or writes with NCCL_TOPO_DUMP_FILE")
    if root.tag != "system":
        raise _err(source, f"root element is <{root.tag}>; expected {ACCEPTED}")
    return root


class _Walker:
    """Collects GPUs, NICs and NVSwitches from the <cpu>/<pci> tree."""

    def __init__(self, source: str):
        self.source = source
        self.gpus: list[XmlGpu] = []
        self.nics: list[XmlNic] = []
        self.nvswitches: set[str] = set()
        self.ignored: set[str] = set()

    def cpu(self, el: ET.Element, host: str, index: int) -> None:
        self._children(el, host, index, ())

    def _children(self, el: ET.Element, host: str, cpu: int, path: tuple[str, ...]) -> None:
        for child in el:
            if child.tag == "pci":
                self._pci(child, host, cpu, path)
            elif child.tag == "nic":
                self._nic(child, host, path[-1] if path else "")
            elif child.tag == "gpu":
                raise _err(self.source, f"<gpu dev={child.get('dev')!r}> is not inside a <pci "
                                        f"busid=...> element; NCCL nests every GPU in its PCI "
                                        f"device")
            else:
                self.ignored.add(child.tag)

    def _pci(self, el: ET.Element, host: str, cpu: int, path: tuple[str, ...]) -> None:
        busid = (el.get("busid") or "").lower()
        if not busid:
            raise _err(self.source, "<pci> element without busid; every NCCL <pci> names its "
                                    "bus id, e.g. busid=\"0000:0f:00.0\"")
        cls = (el.get("class") or "").lower()
        gpu_el = el.find("gpu")
        if gpu_el is not None:
            self.gpus.append(self._gpu(gpu_el, el, host, cpu, path, busid))
        elif cls.startswith(_GPU_CLASSES):
            self.gpus.append(XmlGpu(host, cpu, path, busid, None, None, None,
                                    (el.get("device") or "").lower(), None))
        if cls.startswith(_NVSWITCH_CLASS):
            self.nvswitches.add(busid)
        if el.find("nic") is None and gpu_el is None and cls.startswith(_NIC_CLASSES):
            self.nics.append(XmlNic(host, f"pci {busid}", None, busid))
        for child in el:
            if child.tag == "pci":
                self._pci(child, host, cpu, path + (busid,))
            elif child.tag == "nic":
                self._nic(child, host, busid)
            elif child.tag != "gpu":
                self.ignored.add(child.tag)

    def _gpu(self, g: ET.Element, pci: ET.Element, host: str, cpu: int,
             path: tuple[str, ...], busid: str) -> XmlGpu:
        where = f"<gpu> in <pci busid={busid!r}>"
        links = []
        c2c = False
        for child in g:
            if child.tag == "nvlink":
                target = (child.get("target") or "").lower()
                count = _int(child.get("count"), self.source, f"{where} <nvlink>", "count")
                if not target or not count or count < 1:
                    raise _err(self.source, f"{where}: <nvlink> needs target=<bus id> and "
                                            f"count>=1, got target={target!r} count={count!r}")
                links.append((target, count, (child.get("tclass") or "").lower()))
            elif child.tag == "c2c":
                c2c = True
            else:
                self.ignored.add(child.tag)
        gdr = _int(g.get("gdr"), self.source, where, "gdr")
        return XmlGpu(host, cpu, path, busid, _int(g.get("dev"), self.source, where, "dev"),
                      _int(g.get("rank"), self.source, where, "rank"),
                      _int(g.get("sm"), self.source, where, "sm"),
                      (pci.get("device") or "").lower(), None if gdr is None else bool(gdr),
                      tuple(links), c2c)

    def _nic(self, el: ET.Element, host: str, busid: str) -> None:
        nets = el.findall("net")
        for n in nets:
            speed = _int(n.get("speed"), self.source, f"<net name={n.get('name')!r}>", "speed")
            self.nics.append(XmlNic(host, n.get("name") or "?", speed, busid))
        if not nets:
            self.nics.append(XmlNic(host, f"nic {busid}", None, busid))


def parse_nccl_xml(text: str, source: str = "<xml>") -> XmlTopology:
    """Read an NCCL topology XML. Raises XmlTopologyError on anything NCCL would not write."""
    root = _parse_root(text, source)
    cpus = root.findall("cpu")
    if not cpus:
        raise _err(source, f"<system> has no <cpu> elements; expected {ACCEPTED}")
    hashes = [c.get("host_hash") for c in cpus]
    if any(h is None for h in hashes) and any(h is not None for h in hashes):
        raise _err(source, "some <cpu> elements carry host_hash and some do not; a dump fused "
                           "over several hosts names the host of every <cpu>")
    walker = _Walker(source)
    hosts: list[str] = []
    arch: dict[str, str] = {}
    per_host_cpu: dict[str, int] = {}
    for c in cpus:
        key = (c.get("host_hash") or "").lower()
        if key not in arch:
            hosts.append(key)
            a = (c.get("arch") or "x86_64").lower()
            arch[key] = {"arm64": "aarch64", "aarch64": "aarch64"}.get(a, "x86_64")
        walker.cpu(c, key, per_host_cpu.setdefault(key, 0))
        per_host_cpu[key] += 1
    ignored = set(walker.ignored) | {c.tag for c in root if c.tag != "cpu"}
    if not walker.gpus:
        raise _err(source, "no GPUs: no <gpu> element and no <pci> of class 0x0300xx/0x0302xx; "
                           f"expected {ACCEPTED}")
    topo = XmlTopology(source, tuple(hosts), arch, tuple(walker.gpus), tuple(walker.nics),
                       frozenset(walker.nvswitches), tuple(sorted(ignored)))
    _check_gpus(topo)
    return topo


def _check_gpus(topo: XmlTopology) -> None:
    for h in topo.hosts:
        gs = topo.host_gpus(h)
        if not gs:
            raise _err(topo.source, f"host {h or '(single)'} has <cpu> elements but no GPU")
        devs = [g.dev for g in gs]
        if any(d is None for d in devs) and any(d is not None for d in devs):
            raise _err(topo.source, "some GPUs have <gpu dev=...> and some are bare PCI devices; "
                                    "give every GPU as <pci><gpu dev=N .../></pci>")
        if None not in devs and sorted(devs) != list(range(len(devs))):
            label = f"host_hash {h}" if h else "the file"
            raise _err(topo.source, f"{label}: <gpu dev> values are {sorted(devs)}; expected "
                                    f"each of 0..{len(devs) - 1} once (dev is the CUDA ordinal)")
        busids = [g.busid for g in gs]
        dup = sorted({b for b in busids if busids.count(b) > 1})
        if dup:
            raise _err(topo.source, f"bus id {dup[0]} appears for two GPUs of one host")


# -- building the cluster ---------------------------------------------------------------


def _ordered(topo: XmlTopology, host: str) -> list[XmlGpu]:
    gs = topo.host_gpus(host)
    # CUDA ordinals when given; flattened files are numbered in PCI bus order, as nvidia-smi does.
    return sorted(gs, key=lambda g: (g.dev, g.busid) if g.dev is not None else (0, g.busid))


def _switch_links(g: XmlGpu, nvswitches: frozenset[str]) -> int:
    return sum(c for t, c, cls in g.nvlinks
               if cls.startswith(_NVSWITCH_CLASS) or t in nvswitches or t == _NVSWITCH_PSEUDO_BUSID)


def _pcie_kind(a: XmlGpu, b: XmlGpu) -> str:
    """The `topo -m` name of the PCIe path between two GPUs of one host."""
    if a.cpu != b.cpu:
        return "SYS"                         # crosses the inter-socket link
    k = 0
    while k < min(len(a.path), len(b.path)) and a.path[k] == b.path[k]:
        k += 1
    if k == 0:
        # Different root ports of one NUMA node: nvidia-smi prints NODE (NCCL's PATH_PHB).
        return "NODE"
    bridges = (len(a.path) - k) + (len(b.path) - k) + 1
    return "PIX" if bridges <= 1 else "PXB"


def _link(a: XmlGpu, b: XmlGpu, topo: XmlTopology, nvswitch: int, notes: set[str]) -> Link:
    direct = max(sum(c for t, c, _ in a.nvlinks if t == b.busid),
                 sum(c for t, c, _ in b.nvlinks if t == a.busid))
    if direct:
        return Link("NV", direct)
    sa, sb = _switch_links(a, topo.nvswitches), _switch_links(b, topo.nvswitches)
    if sa and sb:
        return Link("NV", min(sa, sb))
    if nvswitch:
        return Link("NV", nvswitch)
    kind = _pcie_kind(a, b)
    notes.add(kind)
    # cuDeviceCanAccessPeer is not in the XML. Within a socket PCIe P2P usually works; across
    # sockets it often does not (V100 PCIe cross-socket row), as in the presets.
    return Link(kind, p2p=kind != "SYS")


@dataclass
class _Spec:
    model: str
    cc: tuple[int, int]
    mem: int
    multicast_capable: bool      # Hopper and later on NVSwitch


def _spec_for(g: XmlGpu, given: tuple[gpu_models.GpuSpec, str, int] | None,
              warn: dict[str, str]) -> _Spec:
    if given is not None:
        spec, model, mem = given
        return _Spec(model or spec.name_for(True), spec.compute_capability, mem, spec.multicast)
    if g.sm is None:
        u = gpu_models.UNKNOWN
        warn.setdefault("model", f"GPU model, compute capability and memory are not in the file "
                                 f"(bare PCI devices): assumed compute capability "
                                 f"{u.compute_capability[0]}.{u.compute_capability[1]}, "
                                 f"{u.memory_gib} GiB, no multicast; pass --gpu-model NAME "
                                 f"(known: {gpu_models.KNOWN_NAMES})")
        return _Spec(u.model, u.compute_capability, u.memory_gib * gpu_models.GiB, False)
    cc = (g.sm // 10, g.sm % 10)
    known = DEVICE_MODELS.get(g.device_id)
    if known:
        name, mem = known
        warn.setdefault(f"mem:{g.device_id}",
                        f"GPU memory is not in the file: {name} (PCI device {g.device_id}, sm "
                        f"{g.sm}) given {mem} GiB from the product specification")
    else:
        name, mem = f"NVIDIA GPU sm{g.sm}", gpu_models.UNKNOWN.memory_gib
        warn.setdefault(f"model:{g.device_id}:{g.sm}",
                        f"GPU model unknown: sm {g.sm}, PCI device {g.device_id or 'not recorded'}; "
                        f"reported as {name!r} with {mem} GiB; pass --gpu-model NAME to set it")
    return _Spec(name, cc, mem * gpu_models.GiB, cc[0] >= 9)


def build_cluster(topo: XmlTopology, gpu_model: str | None = None, *, nvswitch: bool = False,
                  host_prefix: str = "node", name: str | None = None) -> tuple[Cluster, list[str]]:
    """The Cluster this XML describes, and the assumptions made (warnings).

    `gpu_model` overrides what the file says (or omits) about the GPUs; `nvswitch` declares
    every host an NVSwitch board when the file lists no NVLinks (flattened VM files)."""
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", host_prefix or ""):
        raise TopologyError(f"host prefix {host_prefix!r} is not a hostname start; use letters, "
                            f"digits, '.', '_', '-'")
    per_host = Counter(g.host for g in topo.gpus)
    check_size(len(topo.hosts), max(per_host.values(), default=0), topo.source)
    warnings: list[str] = []
    warn: dict[str, str] = {}
    given = gpu_models.resolve(gpu_model) if gpu_model else None
    any_nvlink = any(g.nvlinks for g in topo.gpus)
    if topo.flattened:
        warnings.append(
            f"{len(topo.gpus)} GPU(s) are bare PCI devices (no <gpu> elements): a flattened, "
            f"hand-written topology as cloud images ship for VMs; NCCL learns GPU details and "
            f"NVLinks from the driver at run time")
    if nvswitch and any_nvlink:
        raise XmlTopologyError(f"{topo.source}: --nvswitch is for files without <nvlink> elements; "
                            f"this file lists NVLinks, which are used as given")
    pcie_notes: set[str] = set()
    self_links: list[str] = []
    hosts: list[Host] = []
    host_names: dict[str, str] = {}
    behind_switch: dict[str, bool] = {}
    for hi, key in enumerate(topo.hosts):
        hn = f"{host_prefix}-{hi}"
        host_names[key] = hn
        gs = _ordered(topo, key)
        specs = [_spec_for(g, given, warn) for g in gs]
        sm = min(s.cc[0] for s in specs)
        per_gpu = _NVLINKS_PER_GPU.get(sm, 0) if nvswitch else 0
        if nvswitch and not per_gpu:
            raise XmlTopologyError(f"{topo.source}: --nvswitch needs an NVLink-capable GPU "
                                f"(compute capability 7.x-10.x); give --gpu-model NAME")
        for g in gs:
            for t, c, _ in g.nvlinks:
                if t == g.busid:
                    self_links.append(f"{g.where} lists <nvlink target=\"{t}\" count=\"{c}\">")
        n = len(gs)
        links = tuple(tuple(None if i == j else _link(gs[i], gs[j], topo, per_gpu, pcie_notes)
                            for j in range(n)) for i in range(n))
        switched = nvswitch or all(_switch_links(g, topo.nvswitches) for g in gs)
        behind_switch[key] = switched
        gpus = []
        for i, (g, s) in enumerate(zip(gs, specs)):
            mc = switched and s.multicast_capable
            gpus.append(Gpu(index=i, model=s.model, compute_capability=s.cc, memory_bytes=s.mem,
                            fabric_handle=mc, multicast=mc,
                            gpu_direct_rdma=True if g.gdr is None else g.gdr, uuid=_uuid(hn, i)))
        hosts.append(Host(name=hn, gpus=tuple(gpus), links=links, arch=topo.arch[key]))
    warnings += list(warn.values())
    if self_links:
        warnings.append(
            f"{len(self_links)} GPU(s) list an NVLink to their own bus id ({self_links[0]}): the "
            f"NVLink peer is not named, so those links are not modelled (an NVLink bridge "
            f"whose partner the file does not say); compare `nvidia-smi topo -m` of the machine")
    if not any_nvlink and not nvswitch and sum(len(h.gpus) for h in hosts) > 1:
        warnings.append(
            "GPU-GPU NVLinks are absent from the file (no <nvlink> elements; NCCL discovers them "
            "through NVML at run time): pairs are modelled over their PCIe paths; pass --nvswitch "
            "if the hosts are NVSwitch boards (HGX/DGX), or import `nvidia-smi topo -m` instead")
    if pcie_notes:
        warnings.append(
            f"P2P is not in the file: assumed allowed on PCIe paths within a CPU socket "
            f"(PIX/PXB/NODE) and not across sockets (SYS); paths seen: "
            f"{', '.join(sorted(pcie_notes))}")
    cluster = _with_domains(topo, hosts, host_names, behind_switch, name, warnings)
    return cluster, warnings


def _with_domains(topo: XmlTopology, hosts: list[Host], host_names: dict[str, str],
                  behind_switch: dict[str, bool], name: str | None,
                  warnings: list[str]) -> Cluster:
    cname = name or Path(topo.source).stem or "imported"
    multi = len(topo.hosts) > 1
    domains: list[NvlinkDomain] = []
    if multi and all(behind_switch.values()):
        # NCCL fuses the XML of several hosts only across one NVLink domain (its MNNVL path),
        # so a fused dump whose every GPU reaches an NVSwitch is one multi-node domain.
        uuid = _cluster_uuid(cname)
        fab = FabricInfo(cluster_uuid=uuid, clique_id=1, state=FabricState.COMPLETED)
        hosts[:] = [_set_fabric(h, fab, imex=(0,)) for h in hosts]
        members = tuple(GpuRef(h.name, g.index) for h in hosts for g in h.gpus)
        domains.append(NvlinkDomain(f"{cname}-domain", members, cluster_uuid=uuid))
        hashes = ", ".join(k for k in topo.hosts)
        warnings.append(
            f"{len(hosts)} hosts (host_hash {hashes}) fused into one dump, every GPU with NVLinks "
            f"to an NVSwitch: one multi-node NVLink domain (MNNVL). NVML fabric info and IMEX "
            f"are not in the file: assumed state COMPLETED, one cluster UUID, clique 1, IMEX "
            f"channel 0 on every host; set the real values with `commsim topo fabric "
            f"{topo.source} --info FILE`")
    else:
        if multi:
            warnings.append(f"{len(hosts)} hosts in one file but not every GPU reaches an "
                            f"NVSwitch: no multi-node NVLink domain")
        for key, h in zip(topo.hosts, list(hosts)):
            if behind_switch[key] and all(l is None or l.is_nvlink for r in h.links for l in r):
                # Single-host NVSwitch board: fabric COMPLETED with a zero cluster UUID (row F2).
                i = hosts.index(h)
                hosts[i] = _set_fabric(h, FabricInfo(state=FabricState.COMPLETED), imex=())
                domains.append(NvlinkDomain(f"{h.name}-nvswitch",
                                            tuple(GpuRef(h.name, g.index) for g in h.gpus)))
    kind = ("multi-node" if any(d.multi_node for d in domains) else
            "single-node" if domains else "none")
    src = (f"imported from {topo.source} (NCCL topology XML): {len(hosts)} host(s), "
           f"{sum(len(h.gpus) for h in hosts)} GPUs, NVLink domain {kind}")
    return Cluster(name=cname, hosts=tuple(hosts), domains=tuple(domains), source=src)


def _set_fabric(h: Host, fab: FabricInfo, imex: tuple[int, ...]) -> Host:
    return dataclasses.replace(h, gpus=tuple(dataclasses.replace(g, fabric=fab) for g in h.gpus),
                               imex_channels=imex)


def import_file(path: str | Path, gpu_model: str | None = None, *, nvswitch: bool = False,
                host_prefix: str = "node", name: str | None = None
                ) -> tuple[Cluster, list[str], XmlTopology]:
    """Read and build in one step: (cluster, warnings, parsed file)."""
    p = Path(path)
    try:
        text = p.read_bytes().decode("utf-8-sig", errors="replace")
    except FileNotFoundError:
        raise XmlTopologyError(f"{p}: no such file; give {ACCEPTED}") from None
    except IsADirectoryError:
        raise XmlTopologyError(f"{p}: is a directory; give an NCCL topology XML file") from None
    topo = parse_nccl_xml(text, str(p))
    cluster, warnings = build_cluster(topo, gpu_model, nvswitch=nvswitch,
                                      host_prefix=host_prefix, name=name)
    return cluster, warnings, topo


def looks_like_xml(text: str) -> bool:
    """Whether pasted input is XML rather than `nvidia-smi topo -m` text."""
    return text.lstrip("\ufeff \t\r\n").startswith("<")
