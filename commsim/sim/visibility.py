"""Which GPUs one process sees: its container's device cgroup, then its CUDA_VISIBLE_DEVICES.

Container (device cgroup): a container is given some of its host's `/dev/nvidiaN` nodes
(`docker --gpus '"device=2,3"'`, a Kubernetes device plugin's allocation). The driver and
NVML inside it enumerate only those, renumbered from 0 in host order: NVML's index, the
count and `cuDeviceGetCount` all follow the container, not the host (row W3,
docs/fidelity-rules.md; rapidsai/dask-cuda#954; NVIDIA Container Toolkit docs, "GPU
Enumeration": `NVIDIA_VISIBLE_DEVICES` / `--gpus` select the device nodes mounted).

CUDA_VISIBLE_DEVICES (CUDA C++ Programming Guide, "CUDA Environment Variables", CUDA 12-13,
https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#cuda-environment-variables):
a comma-separated sequence of integer indices or UUID strings as nvidia-smi prints them
(`GPU-8932f937-...`); an abbreviated UUID, enough leading characters to name one GPU, is
accepted; devices are enumerated in the order of the sequence, and "if one of the indices is
invalid, only the devices whose index precedes the invalid index are visible" (`0,2,-1,1`
shows 0 and 2). Indices and UUIDs are the container's (the process cannot name a GPU its
cgroup hides). MIG entries (`MIG-GPU-<uuid>/<gi>/<ci>`, `MIG-<uuid>`) name MIG instances;
commsim models no GPU in MIG mode, so such an entry names no device and ends the list.
UNCONFIRMED (the guide does not say): a repeated device, and an abbreviated UUID that more
than one GPU shares, are taken as invalid entries.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

_INDEX = re.compile(r"\d+")


def host_uuids(host: Any) -> list[str]:
    """The UUIDs a host's GPUs answer to in CUDA_VISIBLE_DEVICES (their index where unset)."""
    return [g.uuid or str(g.index) for g in host.gpus]


def _resolve_entry(entry: str, uuids: Sequence[str]) -> int | None:
    """The position in `uuids` (the enumerable GPUs, in order) an entry names, or None."""
    entry = entry.strip()
    if _INDEX.fullmatch(entry):
        i = int(entry)
        return i if i < len(uuids) else None
    if entry.startswith("GPU-") and len(entry) > len("GPU-"):
        hits = [i for i, u in enumerate(uuids) if u.lower().startswith(entry.lower())]
        return hits[0] if len(hits) == 1 else None
    return None                      # MIG-..., -1, a name: no device (ends the list)


def cuda_visible(text: str | None, uuids: Sequence[str]) -> tuple[int, ...]:
    """The positions in `uuids` a process with CUDA_VISIBLE_DEVICES=`text` enumerates, in
    ordinal order. None (unset) shows every GPU; an empty string shows none."""
    if text is None:
        return tuple(range(len(uuids)))
    out: list[int] = []
    for entry in text.split(","):
        i = _resolve_entry(entry, uuids)
        if i is None or i in out:
            break                    # this entry and every one after it are hidden
        out.append(i)
    return tuple(out)


def container_devices(text: str | None, gpu_count: int) -> tuple[int, ...]:
    """The host GPU indices a container's device cgroup allows (`"2,3"`), in host order;
    None: every GPU of the host. Raises ValueError naming the entry that is no host GPU."""
    if text is None:
        return tuple(range(gpu_count))
    got: set[int] = set()
    for entry in (e.strip() for e in text.split(",")):
        if not _INDEX.fullmatch(entry) or int(entry) >= gpu_count:
            raise ValueError(f"{entry!r} is not a GPU of the host (0..{gpu_count - 1})")
        got.add(int(entry))
    return tuple(sorted(got))


def process_view(uuids: Sequence[str], devices: str | None, visible: str | None) -> tuple[int, ...]:
    """Host GPU indices a process enumerates, ordinal i -> result[i]: the container's
    devices (host order) filtered and ordered by CUDA_VISIBLE_DEVICES."""
    allowed = container_devices(devices, len(uuids))
    seen = cuda_visible(visible, [uuids[i] for i in allowed])
    return tuple(allowed[i] for i in seen)
