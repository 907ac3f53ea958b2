"""One table of GPU parts: every fact a simulated GPU reports comes from here.

The topology importers read it to turn a model name into a GPU (a pasted `nvidia-smi topo -m`
says how GPUs are linked, not what they are); the hosted surfaces read it for what the device
reports about itself (SM count, caches, clocks, product PCI id) through NVML, cudart,
cuda-python and torch. `multicast` and `fabric` say what the *part* can do; the importer turns
them on only where the host also has an NVSwitch fabric.

A part's own figures (`Silicon`) cite their public source beside the entry; a figure no source
pins down is listed in `unconfirmed`. What follows from the compute capability alone (warp
size, threads and shared memory per SM and per block, registers) is in `LIMITS`, once per
capability. Where the GPU sits on its host's PCI bus is the host's, not the part's
(commsim/hosting/state/host_layout.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from commsim.topology.model import TopologyError

GiB = 1 << 30
KiB = 1 << 10
MiB = 1 << 20


@dataclass(frozen=True)
class Limits:
    """What the CUDA C++ Programming Guide's "Technical Specifications per Compute Capability"
    table (CUDA 13.0) gives for one capability, in the units cudaDeviceProp reports."""

    max_threads_per_sm: int
    shared_memory_per_sm: int          # bytes; cudaDeviceProp.sharedMemPerMultiprocessor
    shared_memory_per_block_optin: int  # bytes; cudaDeviceProp.sharedMemPerBlockOptin
    warp_size: int = 32
    max_threads_per_block: int = 1024
    shared_memory_per_block: int = 48 * KiB   # without opt-in, every capability
    registers_per_sm: int = 64 * 1024         # 32-bit registers
    registers_per_block: int = 64 * 1024


# CUDA C++ Programming Guide (CUDA 13.0), "Compute Capabilities", table "Technical
# Specifications per Compute Capability": threads per SM, shared memory per SM and the opt-in
# maximum per block.
LIMITS: dict[tuple[int, int], Limits] = {
    (7, 0): Limits(2048, 96 * KiB, 96 * KiB),
    (8, 0): Limits(2048, 164 * KiB, 163 * KiB),
    (8, 6): Limits(1536, 100 * KiB, 99 * KiB),
    (8, 9): Limits(1536, 100 * KiB, 99 * KiB),
    (9, 0): Limits(2048, 228 * KiB, 227 * KiB),
    (10, 0): Limits(2048, 228 * KiB, 227 * KiB),
    (10, 3): Limits(2048, 228 * KiB, 227 * KiB),
    (12, 0): Limits(1536, 100 * KiB, 99 * KiB),
    (12, 1): Limits(1536, 100 * KiB, 99 * KiB),
}


@dataclass(frozen=True)
class Silicon:
    """What one part reports about itself beyond its name, capability and memory."""

    sms: int                   # multiprocessors (cudaDevAttrMultiProcessorCount)
    l2_cache: int              # bytes (cudaDeviceProp.l2CacheSize)
    clock_mhz: int             # peak SM clock (cudaDevAttrClockRate reports kHz)
    memory_clock_mhz: int      # cudaDevAttrMemoryClockRate reports kHz
    memory_bus_bits: int       # cudaDeviceProp.memoryBusWidth
    pci_device_id: int         # PCI product id: NVML's pciDeviceId is (id << 16) | 0x10DE
    source: str                # where the figures come from
    unconfirmed: tuple[str, ...] = ()   # fields no public source pins down
    integrated: bool = False   # shares the CPU's memory (cudaDeviceProp.integrated)
    sxm_pci_device_id: int = 0  # product id of the part's NVSwitch-board variant, if it has one


@dataclass(frozen=True)
class GpuSpec:
    key: str                        # short name matched against what the user gives
    model: str                      # marketing name reported by the device
    compute_capability: tuple[int, int]
    memory_gib: int
    multicast: bool = False         # MULTICAST_SUPPORTED on an NVSwitch board (SM90+)
    fabric: bool = False            # HANDLE_TYPE_FABRIC_SUPPORTED on an NVSwitch board
    gpu_direct_rdma: bool = True
    arch: str = "x86_64"            # CPU of the host the part ships in
    pcie_p2p: bool | None = None    # None: platform-dependent; False: never (GeForce)
    sxm_model: str = ""             # name to report when the matrix is an NVSwitch board
    aliases: tuple[str, ...] = ()
    nvlinks: int = 18               # NVLink links per GPU: decides switch vs mesh (row T1/T2)
    silicon: Silicon | None = None  # None: a part commsim has no figures for

    def name_for(self, nvswitch: bool) -> str:
        return self.sxm_model if nvswitch and self.sxm_model else self.model

    @property
    def limits(self) -> Limits | None:
        return LIMITS.get(self.compute_capability)

    def pci_device_id(self, reported_name: str) -> int:
        """The product id of the variant that reports `reported_name` (0: unknown)."""
        s = self.silicon
        if s is None:
            return 0
        if self.sxm_model and reported_name == self.sxm_model and s.sxm_pci_device_id:
            return s.sxm_pci_device_id
        return s.pci_device_id


# Sources of the Silicon figures, named once. PCI product ids: the PCI ID Repository
# (pci-ids.ucw.cz, vendor 10de), the id `lspci -nn` prints beside the name.
_PCI_IDS = "PCI ID Repository, vendor 10de"
_VOLTA = "NVIDIA Tesla V100 GPU Architecture whitepaper (2017); V100 datasheet"
_AMPERE = "NVIDIA A100 Tensor Core GPU Architecture whitepaper; A100 80GB datasheet"
_GA102 = "NVIDIA Ampere GA102 GPU Architecture whitepaper (RTX 3090)"
_HOPPER = "NVIDIA H100 Tensor Core GPU Architecture whitepaper (SXM5)"
_ADA = "NVIDIA Ada GPU Architecture whitepaper (RTX 4090); L40S datasheet"
_BLACKWELL = "NVIDIA Blackwell Architecture technical brief; DGX B200 datasheet"
_BLACKWELL_ULTRA = "NVIDIA technical blog 'Inside NVIDIA Blackwell Ultra' (2025): 160 SMs"
_RTX_BLACKWELL = "NVIDIA RTX Blackwell GPU Architecture whitepaper (GB202)"
_SPARK = "NVIDIA DGX Spark datasheet (GB10: 6144 CUDA cores, 256-bit LPDDR5x)"

# Order matters: a name is matched against each key in turn, so GB200 precedes B200, GH200 and
# H200NVL precede H200 (each contains the shorter key). Sources: docs/fidelity-rules.md §9 and
# the Silicon sources above.
KNOWN: tuple[GpuSpec, ...] = (
    # Blackwell Ultra: CC 10.3 (vllm-project/vllm#42324 SM 10.3 tables). GB300 before B300.
    GpuSpec("GB300", "NVIDIA GB300", (10, 3), 288, True, True, arch="aarch64", silicon=Silicon(
        160, 126 * MiB, 2032, 3996, 8192, 0x31C2, f"{_BLACKWELL_ULTRA}; {_PCI_IDS}",
        unconfirmed=("l2_cache", "clock_mhz", "memory_clock_mhz", "pci_device_id"))),
    GpuSpec("GB200", "NVIDIA GB200", (10, 0), 186, True, True, arch="aarch64", silicon=Silicon(
        148, 126 * MiB, 1965, 3996, 8192, 0x2941, f"{_BLACKWELL}; {_PCI_IDS} (GB100 [GB200])",
        unconfirmed=("l2_cache", "clock_mhz", "memory_clock_mhz"))),
    # DGX Spark: SM 12.1, aarch64, no NVLink (NVIDIA/dgx-spark-playbooks#22). Before B*00 keys.
    GpuSpec("GB10", "NVIDIA GB10", (12, 1), 128, arch="aarch64", nvlinks=0,
            aliases=("DGXSPARK", "SPARK"), silicon=Silicon(
                48, 24 * MiB, 2418, 4266, 256, 0x2E12, _SPARK, integrated=True,
                unconfirmed=("l2_cache", "clock_mhz", "memory_clock_mhz", "pci_device_id",
                             "integrated"))),
    GpuSpec("GH200", "NVIDIA GH200 144G HBM3e", (9, 0), 144, True, True, arch="aarch64",
            silicon=Silicon(132, 50 * MiB, 1980, 2619, 6144, 0x2348,
                            f"NVIDIA GH200 Grace Hopper Superchip datasheet; {_HOPPER}; {_PCI_IDS}",
                            unconfirmed=("l2_cache", "memory_clock_mhz", "pci_device_id"))),
    GpuSpec("B300", "NVIDIA B300", (10, 3), 288, True, True, silicon=Silicon(
        160, 126 * MiB, 2032, 3996, 8192, 0x3182,
        f"{_BLACKWELL_ULTRA}; {_PCI_IDS} (GB110 [B300 SXM6 AC])",
        unconfirmed=("l2_cache", "clock_mhz", "memory_clock_mhz"))),
    GpuSpec("B200", "NVIDIA B200", (10, 0), 180, True, True, silicon=Silicon(
        148, 126 * MiB, 1965, 3996, 8192, 0x2901, f"{_BLACKWELL}; {_PCI_IDS} (GB100 [B200])",
        unconfirmed=("l2_cache", "clock_mhz", "memory_clock_mhz"))),
    # H200 NVL is a PCIe card with NVLink bridges: never an NVSwitch board (row T2).
    GpuSpec("H200NVL", "NVIDIA H200 NVL", (9, 0), 141, silicon=Silicon(
        132, 50 * MiB, 1785, 3201, 6144, 0x233B, f"NVIDIA H200 NVL datasheet; {_PCI_IDS}",
        unconfirmed=("clock_mhz", "memory_clock_mhz"))),
    GpuSpec("H200", "NVIDIA H200", (9, 0), 141, True, True, silicon=Silicon(
        132, 50 * MiB, 1980, 3201, 6144, 0x2335, f"NVIDIA H200 datasheet; {_HOPPER}; {_PCI_IDS}",
        unconfirmed=("memory_clock_mhz",))),
    GpuSpec("H100", "NVIDIA H100 80GB HBM3", (9, 0), 80, True, True, silicon=Silicon(
        132, 50 * MiB, 1980, 2619, 5120, 0x2330, f"{_HOPPER}; {_PCI_IDS} (GH100 [H100 SXM5 80GB])")),
    # A100 has NVSwitch boards (HGX A100) but no multicast objects (Hopper+ only).
    GpuSpec("A100", "NVIDIA A100 80GB PCIe", (8, 0), 80, sxm_model="NVIDIA A100-SXM4-80GB",
            nvlinks=12, silicon=Silicon(
                108, 40 * MiB, 1410, 1512, 5120, 0x20B5,
                f"{_AMPERE}; {_PCI_IDS} (GA100 [A100 PCIe 80GB], [A100 SXM4 80GB])",
                sxm_pci_device_id=0x20B2)),
    GpuSpec("L40S", "NVIDIA L40S", (8, 9), 48, nvlinks=0, silicon=Silicon(
        142, 96 * MiB, 2520, 9001, 384, 0x26B9, f"{_ADA}; {_PCI_IDS} (AD102GL [L40S])")),
    GpuSpec("RTXPRO6000", "NVIDIA RTX PRO 6000 Blackwell Server Edition", (12, 0), 96,
            nvlinks=0, aliases=("PRO6000",), silicon=Silicon(
                188, 128 * MiB, 2617, 14001, 512, 0x2BB5,
                f"NVIDIA RTX PRO 6000 Blackwell Server Edition datasheet; {_RTX_BLACKWELL}; "
                f"{_PCI_IDS} (GB202GL [RTX PRO 6000 Blackwell Server Edition])",
                unconfirmed=("clock_mhz", "memory_clock_mhz"))),
    GpuSpec("RTX5090", "NVIDIA GeForce RTX 5090", (12, 0), 32, gpu_direct_rdma=False,
            pcie_p2p=False, aliases=("5090",), nvlinks=0, silicon=Silicon(
                170, 96 * MiB, 2407, 14001, 512, 0x2B85,
                f"{_RTX_BLACKWELL}; {_PCI_IDS} (GB202 [GeForce RTX 5090])",
                unconfirmed=("memory_clock_mhz",))),
    GpuSpec("RTX4090", "NVIDIA GeForce RTX 4090", (8, 9), 24, gpu_direct_rdma=False,
            pcie_p2p=False, aliases=("4090",), nvlinks=0, silicon=Silicon(
                128, 72 * MiB, 2520, 10501, 384, 0x2684,
                f"{_ADA}; {_PCI_IDS} (AD102 [GeForce RTX 4090])")),
    # The last GeForce with an NVLink bridge (NV4 pairs); no PCIe P2P on GeForce.
    GpuSpec("RTX3090", "NVIDIA GeForce RTX 3090", (8, 6), 24, gpu_direct_rdma=False,
            pcie_p2p=False, aliases=("3090",), nvlinks=4, silicon=Silicon(
                82, 6 * MiB, 1695, 9751, 384, 0x2204,
                f"{_GA102}; {_PCI_IDS} (GA102 [GeForce RTX 3090])")),
    GpuSpec("V100", "Tesla V100-SXM2-32GB", (7, 0), 32, nvlinks=6, silicon=Silicon(
        80, 6 * MiB, 1530, 877, 4096, 0x1DB5, f"{_VOLTA}; {_PCI_IDS} (GV100GL [Tesla V100 SXM2 32GB])")),
)
KNOWN_NAMES = ("GB300, GB200, GB10 (DGX Spark), GH200, B300, B200, H200 NVL, H200, H100, A100, "
               "L40S, RTX PRO 6000, RTX 5090, RTX 4090, RTX 3090, V100")
MAX_NVLINKS = max(s.nvlinks for s in KNOWN)  # links per GPU when the part is unknown

# What an import assumes when neither a model is given nor the matrix says which part it is.
NVSWITCH_DEFAULT = next(s for s in KNOWN if s.key == "H100")   # NV18 boards: Hopper HGX
NV12_NVSWITCH_DEFAULT = next(s for s in KNOWN if s.key == "A100")  # NV12 boards: HGX A100
GB200 = next(s for s in KNOWN if s.key == "GB200")
UNKNOWN = GpuSpec("unknown", "unknown GPU (imported)", (8, 0), 80)


def _norm(text: str) -> str:
    return re.sub(r"[^A-Z0-9]", "", text.upper())


def _match(norm: str) -> GpuSpec | None:
    return next((s for s in KNOWN if any(k in norm for k in (s.key, *s.aliases))), None)


def part_of(model: str) -> GpuSpec:
    """The part a GPU reporting `model` is (a preset's name, or one an importer kept
    verbatim); UNKNOWN, which has no Silicon figures, for a name no entry matches."""
    return _match(_norm(model)) or UNKNOWN


def resolve(name: str) -> tuple[GpuSpec, str, int]:
    """(spec, model name to report or "" for the canonical one, memory in bytes).

    A short name ("h100", "RTX 4090") reports the canonical marketing name (resolved later,
    since A100 boards and cards differ); a full name as `nvidia-smi -L` prints it is kept
    verbatim, and its "<n>GB" part, if any, sets the memory.
    """
    norm = _norm(name)
    bare = re.sub(r"^(NVIDIA)?(GEFORCE)?", "", norm)
    spec = _match(norm)
    if spec is not None:
        keys = (spec.key, *spec.aliases)
        if bare in keys:
            return spec, "", spec.memory_gib * GiB
        m = re.search(r"(\d+)\s*GB?\b", name.upper().replace(spec.key, ""))
        mem = int(m.group(1)) if m else spec.memory_gib
        return spec, name.strip(), mem * GiB
    raise TopologyError(
        f"unknown GPU model {name!r}; known: {KNOWN_NAMES} (a full name such as "
        f"'NVIDIA H100 80GB HBM3' works too); leave the model out to infer it from the matrix")
