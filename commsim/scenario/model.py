"""A scenario as data: topology, faults, placement, groups, workload, expectations.

`commsim.scenario.schema.load(path)` parses and validates a TOML file into a `Scenario`;
the runner consumes only this model. Field meanings are documented in docs/scenario-format.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from commsim.topology.model import Cluster, GpuRef

# Lifecycle steps at which an expected error may occur, in the order a run goes through them.
STEPS = ("discover", "init", "op", "capture", "register", "release_capture", "close")
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_reduce_rmsnorm")
DTYPES = ("float32", "float16", "bfloat16")
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class Fault:
    """One `[[fault]]`: `kind` names a registered fault kind (commsim/scenario/faults.py),
    which says which of the other fields it takes and how it applies."""

    kind: str
    host: str | None = None
    gpu: GpuRef | None = None
    gpus: tuple[int, int] | None = None
    state: str | None = None          # FabricState name for fabric_state
    rank: int | None = None
    at_allocation: int | None = None  # 1-based: the k-th allocation of that rank fails
    api: str | None = None            # Driver method name, e.g. "cudaIpcOpenMemHandle"
    code: str | None = None           # cudaError_t / CUresult name, e.g. "cudaErrorInvalidValue"
    nth: int = 1                      # which call of `api` fails (1-based)
    cause: str | None = None          # issue 17 kinds: how P2P fails (acs, iommu, dropped, corrupt)
    hosts: tuple[str, ...] | None = None  # imex_split: the hosts of the new IMEX domain
    version: str | None = None        # driver_version: the kernel driver, e.g. "450.80.02"


@dataclass(frozen=True)
class Group:
    name: str
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class Workload:
    ops: tuple[str, ...] = ("all_reduce",)
    sizes: tuple[int, ...] = (4096,)          # message sizes in bytes
    dtypes: tuple[str, ...] = ("bfloat16",)
    graph_capture: bool = False               # also run each op inside `comm.capture()`
    discard_capture: bool = False             # capture then discard (the profiling pattern)
    iterations: int = 1
    # The process's caching allocator (PyTorch's PYTORCH_CUDA_ALLOC_CONF): "caching" (cudaMalloc
    # segments) or "expandable_segments" (cuMem-backed, no legacy IPC handle; rule AL4).
    allocator: str = "caching"
    # When the communicator sets its backends up: "init" (eager) or "lazy" (at the first op,
    # inside a capture when the first op is captured; rules LC1-LC2).
    setup: str = "init"
    # NCCL_* environment variables of every rank (commsim/libmodels/nccl_rules.py ENV_VARS), as
    # (name, value) pairs: what NCCL may use, and what `commsim explain` reports.
    nccl_env: tuple[tuple[str, str], ...] = ()
    # How POSIX fds travel between the ranks of one host (commsim/libmodels/fd_exchange.py): "" keeps
    # the policy's choice; "pytorch_ring" or "flashinfer_mesh" says which library does it.
    fd_transport: str = ""


ALLOCATORS = ("caching", "expandable_segments")
SETUPS = ("init", "lazy")


@dataclass(frozen=True)
class Expectation:
    """Either a backend (`backend` for `group`, optionally per `op` and `size`), or an error
    (`error` by CUDA name or run outcome, at lifecycle `step`, optionally on `rank` and with
    `message` text in its diagnosis)."""

    group: str | None = None
    op: str | None = None
    size: int | None = None
    backend: str | None = None
    error: str | None = None
    step: str | None = None
    rank: int | None = None
    leak: bool = False                        # a leak is expected (shortcut-policy regressions)
    message: str | None = None                # text the error's message / diagnosis contains


@dataclass(frozen=True)
class Scenario:
    name: str
    cluster: Cluster                          # after topology faults were applied
    placement: tuple[GpuRef, ...]             # placement[rank] = the GPU that rank drives
    groups: tuple[Group, ...]
    workload: Workload = field(default_factory=Workload)
    faults: tuple[Fault, ...] = ()            # all faults, topology ones included (for the record)
    policy: str = "default"                   # preset name or "module:object"
    expectations: tuple[Expectation, ...] = ()
    seed: int = 0
    description: str = ""
    topology_spec: str = ""                   # e.g. "preset gb200-nvl72:2", for summaries
    path: Path | None = None                  # the file it came from, if any
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return len(self.placement)

    def group(self, name: str) -> Group:
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(name)

    @property
    def driver_faults(self) -> tuple[Fault, ...]:
        from commsim.scenario.faults import is_driver_fault   # the registry builds on this module
        return tuple(f for f in self.faults if is_driver_fault(f))
