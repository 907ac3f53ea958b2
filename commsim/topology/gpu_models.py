"""GPU attributes by model name, for topologies imported from `nvidia-smi topo -m`.

A pasted matrix says how GPUs are linked, not what they are. These are the attributes the
presets use for the same parts (presets.py), so an imported machine answers device queries
like the preset of that machine. `multicast` and `fabric` say what the *part* can do; the
importer turns them on only where the host also has an NVSwitch fabric.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from commsim.topology.model import TopologyError

GiB = 1 << 30


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

    def name_for(self, nvswitch: bool) -> str:
        return self.sxm_model if nvswitch and self.sxm_model else self.model


# Order matters: a name is matched against each key in turn, so GB200 precedes B200, GH200 and
# H200NVL precede H200 (each contains the shorter key). Sources: docs/fidelity-rules.md §9.
KNOWN: tuple[GpuSpec, ...] = (
    # Blackwell Ultra: CC 10.3 (vllm-project/vllm#42324 SM 10.3 tables). GB300 before B300.
    GpuSpec("GB300", "NVIDIA GB300", (10, 3), 288, True, True, arch="aarch64"),
    GpuSpec("GB200", "NVIDIA GB200", (10, 0), 186, True, True, arch="aarch64"),
    # DGX Spark: SM 12.1, aarch64, no NVLink (NVIDIA/dgx-spark-playbooks#22). Before B*00 keys.
    GpuSpec("GB10", "NVIDIA GB10", (12, 1), 128, arch="aarch64", nvlinks=0,
            aliases=("DGXSPARK", "SPARK")),
    GpuSpec("GH200", "NVIDIA GH200 144G HBM3e", (9, 0), 144, True, True, arch="aarch64"),
    GpuSpec("B300", "NVIDIA B300", (10, 3), 288, True, True),
    GpuSpec("B200", "NVIDIA B200", (10, 0), 180, True, True),
    # H200 NVL is a PCIe card with NVLink bridges: never an NVSwitch board (row T2).
    GpuSpec("H200NVL", "NVIDIA H200 NVL", (9, 0), 141),
    GpuSpec("H200", "NVIDIA H200", (9, 0), 141, True, True),
    GpuSpec("H100", "NVIDIA H100 80GB HBM3", (9, 0), 80, True, True),
    # A100 has NVSwitch boards (HGX A100) but no multicast objects (Hopper+ only).
    GpuSpec("A100", "NVIDIA A100 80GB PCIe", (8, 0), 80, sxm_model="NVIDIA A100-SXM4-80GB",
            nvlinks=12),
    GpuSpec("L40S", "NVIDIA L40S", (8, 9), 48, nvlinks=0),
    GpuSpec("RTXPRO6000", "NVIDIA RTX PRO 6000 Blackwell Server Edition", (12, 0), 96,
            nvlinks=0, aliases=("PRO6000",)),
    GpuSpec("RTX5090", "NVIDIA GeForce RTX 5090", (12, 0), 32, gpu_direct_rdma=False,
            pcie_p2p=False, aliases=("5090",), nvlinks=0),
    GpuSpec("RTX4090", "NVIDIA GeForce RTX 4090", (8, 9), 24, gpu_direct_rdma=False,
            pcie_p2p=False, aliases=("4090",), nvlinks=0),
    # The last GeForce with an NVLink bridge (NV4 pairs); no PCIe P2P on GeForce.
    GpuSpec("RTX3090", "NVIDIA GeForce RTX 3090", (8, 6), 24, gpu_direct_rdma=False,
            pcie_p2p=False, aliases=("3090",), nvlinks=4),
    GpuSpec("V100", "Tesla V100-SXM2-32GB", (7, 0), 32, nvlinks=6),
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


def resolve(name: str) -> tuple[GpuSpec, str, int]:
    """(spec, model name to report or "" for the canonical one, memory in bytes).

    A short name ("h100", "RTX 4090") reports the canonical marketing name (resolved later,
    since A100 boards and cards differ); a full name as `nvidia-smi -L` prints it is kept
    verbatim, and its "<n>GB" part, if any, sets the memory.
    """
    norm = _norm(name)
    bare = re.sub(r"^(NVIDIA)?(GEFORCE)?", "", norm)
    for spec in KNOWN:
        keys = (spec.key, *spec.aliases)
        if not any(k in norm for k in keys):
            continue
        if bare in keys:
            return spec, "", spec.memory_gib * GiB
        m = re.search(r"(\d+)\s*GB?\b", name.upper().replace(spec.key, ""))
        mem = int(m.group(1)) if m else spec.memory_gib
        return spec, name.strip(), mem * GiB
    raise TopologyError(
        f"unknown GPU model {name!r}; known: {KNOWN_NAMES} (a full name such as "
        f"'NVIDIA H100 80GB HBM3' works too); leave the model out to infer it from the matrix")
