"""GPU attributes by model name, for topologies imported from `nvidia-smi topo -m`.

A pasted matrix says how GPUs are linked, not what they are. These are the attributes the
presets use for the same parts (presets.py), so an imported machine answers device queries
like the preset of that machine. `multicast` and `fabric` say what the *part* can do; the
importer turns them on only where the host also has an NVSwitch fabric (reference §3.2).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .model import TopologyError

GiB = 1 << 30


@dataclass(frozen=True)
class GpuSpec:
    key: str                        # short name matched against what the user gives
    model: str                      # marketing name reported by the device
    compute_capability: tuple[int, int]
    memory_gib: int
    multicast: bool = False         # MULTICAST_SUPPORTED on an NVSwitch board (SM90+, §3.2)
    fabric: bool = False            # HANDLE_TYPE_FABRIC_SUPPORTED on an NVSwitch board (§2.4)
    gpu_direct_rdma: bool = True
    arch: str = "x86_64"            # CPU of the host the part ships in
    pcie_p2p: bool | None = None    # None: platform-dependent; False: never (GeForce, §5)
    sxm_model: str = ""             # name to report when the matrix is an NVSwitch board
    aliases: tuple[str, ...] = ()

    def name_for(self, nvswitch: bool) -> str:
        return self.sxm_model if nvswitch and self.sxm_model else self.model


# Order matters: a name is matched against each key in turn, so GB200 precedes B200 and GH200
# precedes H200 (both contain the shorter key).
KNOWN: tuple[GpuSpec, ...] = (
    GpuSpec("GB200", "NVIDIA GB200", (10, 0), 186, True, True, arch="aarch64"),
    GpuSpec("GH200", "NVIDIA GH200 144G HBM3e", (9, 0), 144, True, True, arch="aarch64"),
    GpuSpec("B200", "NVIDIA B200", (10, 0), 180, True, True),
    GpuSpec("H200", "NVIDIA H200", (9, 0), 141, True, True),
    GpuSpec("H100", "NVIDIA H100 80GB HBM3", (9, 0), 80, True, True),
    # A100 has NVSwitch boards (HGX A100) but no multicast objects (Hopper+ only, §3.2).
    GpuSpec("A100", "NVIDIA A100 80GB PCIe", (8, 0), 80, sxm_model="NVIDIA A100-SXM4-80GB"),
    GpuSpec("L40S", "NVIDIA L40S", (8, 9), 48),
    GpuSpec("RTX4090", "NVIDIA GeForce RTX 4090", (8, 9), 24, gpu_direct_rdma=False,
            pcie_p2p=False, aliases=("4090",)),
    GpuSpec("V100", "Tesla V100-SXM2-32GB", (7, 0), 32),
)
KNOWN_NAMES = "GB200, GH200, B200, H200, H100, A100, L40S, RTX 4090, V100"

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
