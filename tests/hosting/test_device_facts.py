"""Every preset's GPUs report their part's facts (commsim/topology/gpu_models.py) through
every surface under `commsim exec`, in both modes: torch.cuda's device properties (every
attribute the installed torch declares), libcudart through ctypes, cuda-python's runtime and
driver, and NVML's name, memory and product PCI id. One rank per preset sees all of its host's
GPUs. A fact missing, or zero where the part's entry is not, fails."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from hosting_helpers import PROGRAMS, hosted
from commsim.topology import gpu_models
from commsim.topology.model import Gpu
from commsim.topology.presets import PRESETS, build

PROG = PROGRAMS / "device_facts.py"
Fact = Callable[[gpu_models.GpuSpec, gpu_models.Limits, Gpu], Any]


def torch_attributes() -> list[str]:
    """The attributes the installed torch declares for _CudaDeviceProperties (its type stub:
    the CPU build has no CUDA class to introspect)."""
    stub = Path(torch.__file__).parent / "_C" / "__init__.pyi"
    for node in ast.walk(ast.parse(stub.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == "_CudaDeviceProperties":
            return [n.target.id for n in node.body if isinstance(n, ast.AnnAssign)]
    raise AssertionError(f"no _CudaDeviceProperties in {stub}")


def _si(field: str) -> Fact:
    return lambda part, lim, g: getattr(part.silicon, field)


def _lim(field: str) -> Fact:
    return lambda part, lim, g: getattr(lim, field)


# What the table says each torch attribute is. An attribute the installed torch declares but
# this map lacks is a fact the table does not give: the test fails naming it.
TORCH: dict[str, Fact] = {
    "name": lambda part, lim, g: g.model,
    "gcnArchName": lambda part, lim, g: g.model,
    "uuid": lambda part, lim, g: g.uuid,
    "major": lambda part, lim, g: g.compute_capability[0],
    "minor": lambda part, lim, g: g.compute_capability[1],
    "total_memory": lambda part, lim, g: g.memory_bytes,
    "multi_processor_count": _si("sms"),
    "is_integrated": lambda part, lim, g: int(part.silicon.integrated),
    "is_multi_gpu_board": lambda part, lim, g: 0,
    "L2_cache_size": _si("l2_cache"),
    "clock_rate": lambda part, lim, g: part.silicon.clock_mhz * 1000,
    "memory_clock_rate": lambda part, lim, g: part.silicon.memory_clock_mhz * 1000,
    "memory_bus_width": _si("memory_bus_bits"),
    "max_threads_per_multi_processor": _lim("max_threads_per_sm"),
    "max_threads_per_block": _lim("max_threads_per_block"),
    "warp_size": _lim("warp_size"),
    "shared_memory_per_block": _lim("shared_memory_per_block"),
    "shared_memory_per_block_optin": _lim("shared_memory_per_block_optin"),
    "shared_memory_per_multiprocessor": _lim("shared_memory_per_sm"),
    "regs_per_multiprocessor": _lim("registers_per_sm"),
}
# Device attributes (cudaDeviceAttr : CUdevice_attribute) and the torch attribute of the same fact.
ATTRS = {
    "cudaDevAttrMultiProcessorCount:MULTIPROCESSOR_COUNT": "multi_processor_count",
    "cudaDevAttrComputeCapabilityMajor:COMPUTE_CAPABILITY_MAJOR": "major",
    "cudaDevAttrComputeCapabilityMinor:COMPUTE_CAPABILITY_MINOR": "minor",
    "cudaDevAttrWarpSize:WARP_SIZE": "warp_size",
    "cudaDevAttrMaxThreadsPerBlock:MAX_THREADS_PER_BLOCK": "max_threads_per_block",
    "cudaDevAttrMaxThreadsPerMultiProcessor:MAX_THREADS_PER_MULTIPROCESSOR":
        "max_threads_per_multi_processor",
    "cudaDevAttrMaxSharedMemoryPerBlock:MAX_SHARED_MEMORY_PER_BLOCK": "shared_memory_per_block",
    "cudaDevAttrMaxSharedMemoryPerBlockOptin:MAX_SHARED_MEMORY_PER_BLOCK_OPTIN":
        "shared_memory_per_block_optin",
    "cudaDevAttrMaxSharedMemoryPerMultiprocessor:MAX_SHARED_MEMORY_PER_MULTIPROCESSOR":
        "shared_memory_per_multiprocessor",
    "cudaDevAttrMaxRegistersPerMultiprocessor:MAX_REGISTERS_PER_MULTIPROCESSOR":
        "regs_per_multiprocessor",
    "cudaDevAttrL2CacheSize:L2_CACHE_SIZE": "L2_cache_size",
    "cudaDevAttrClockRate:CLOCK_RATE": "clock_rate",
    "cudaDevAttrMemoryClockRate:MEMORY_CLOCK_RATE": "memory_clock_rate",
    "cudaDevAttrGlobalMemoryBusWidth:GLOBAL_MEMORY_BUS_WIDTH": "memory_bus_width",
    "cudaDevAttrIntegrated:INTEGRATED": "is_integrated",
}
# cuda-python's cudaDeviceProp fields and the torch attribute of the same fact.
PROPS = {
    "name": "name", "totalGlobalMem": "total_memory", "major": "major", "minor": "minor",
    "multiProcessorCount": "multi_processor_count", "warpSize": "warp_size",
    "maxThreadsPerBlock": "max_threads_per_block",
    "maxThreadsPerMultiProcessor": "max_threads_per_multi_processor",
    "sharedMemPerBlock": "shared_memory_per_block",
    "sharedMemPerBlockOptin": "shared_memory_per_block_optin",
    "sharedMemPerMultiprocessor": "shared_memory_per_multiprocessor",
    "regsPerMultiprocessor": "regs_per_multiprocessor", "l2CacheSize": "L2_cache_size",
    "memoryBusWidth": "memory_bus_width", "integrated": "is_integrated",
}


def test_the_table_gives_every_attribute_the_installed_torch_declares():
    declared = torch_attributes()
    assert "multi_processor_count" in declared and "L2_cache_size" in declared, declared
    assert not set(declared) - set(TORCH), f"no table fact for {sorted(set(declared) - set(TORCH))}"


def test_every_preset_gpu_is_a_part_of_the_table_with_its_figures():
    for name, preset in PRESETS.items():
        for host in preset.build().hosts:
            for g in host.gpus:
                part = gpu_models.part_of(g.model)
                assert part.silicon is not None, f"{name}: {g.model!r} has no part entry"
                assert gpu_models.LIMITS.get(g.compute_capability), f"{name}: {g.compute_capability}"
                assert part.pci_device_id(g.model), f"{name}: {g.model!r} has no product id"


def _check(preset: str, mode: str) -> None:
    attrs = sorted(set(torch_attributes()) | set(TORCH))
    v, res, out = hosted(PROG, f"{preset}:1", ",".join(attrs), ",".join(ATTRS), ",".join(PROPS),
                         mode=mode, nproc_per_host=1)
    assert v.ok, v.format() + out
    host = build(f"{preset}:1").hosts[0]
    seen = res[0]["devices"]
    assert len(seen) == len(host.gpus), out
    for g, dev in zip(host.gpus, seen):
        part = gpu_models.part_of(g.model)
        want = {a: fact(part, gpu_models.LIMITS[g.compute_capability], g) for a, fact in TORCH.items()}
        where = f"{preset} {mode} GPU {g.index} ({g.model})"
        for a in attrs:
            got = dev["torch"][a]
            assert got == want[a], f"{where}: torch {a} = {got!r}, the table says {want[a]!r}"
        for key, a in ATTRS.items():
            name = key.split(":")[0]
            for surface in ("cudart", "rt", "cu"):
                assert dev[surface][name] == want[a], (
                    f"{where}: {surface} {name} = {dev[surface][name]!r}, the table says {want[a]!r}")
        for field, a in PROPS.items():
            assert dev["props"][field] == want[a], (
                f"{where}: cudaDeviceProp.{field} = {dev['props'][field]!r}, the table says {want[a]!r}")
        nvml = dev["nvml"]
        assert nvml["name"] == g.model and nvml["total"] == g.memory_bytes
        assert nvml["cc"] == list(g.compute_capability)
        assert nvml["pciDeviceId"] == (part.pci_device_id(g.model) << 16) | 0x10DE, where


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_reports_its_part_through_every_surface_inproc(preset):
    _check(preset, "inproc")


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_reports_its_part_through_every_surface_procs(preset):
    _check(preset, "procs")
