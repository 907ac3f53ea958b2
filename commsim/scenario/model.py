"""A scenario as data: topology, faults, placement, groups, workload, expectations.

`commsim.scenario.schema.load(path)` parses and validates a TOML file into a `Scenario`;
the runner consumes only this model. Field meanings are documented in docs/scenario-format.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from commsim.topology.model import Cluster, FabricState, GpuRef
from commsim.scenario import fault_keys as K
from commsim.scenario.fault_keys import key

# Lifecycle steps at which an expected error may occur, in the order a run goes through them.
STEPS = ("discover", "init", "op", "capture", "register", "release_capture", "close")
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_reduce_rmsnorm")
DTYPES = ("float32", "float16", "bfloat16")
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class Fault:
    """One `[[fault]]`: `kind` names a registered fault kind (commsim/scenario/faults.py),
    which says which of the other fields it takes and how it applies. Each other field is a
    key of the table, declared with its example and parser (commsim/scenario/fault_keys.py);
    the loader reads them in this order."""

    kind: str
    host: str | None = key('host = "<host name>"', K.host)
    gpu: GpuRef | None = key('gpu = "<host>/0"', K.gpu)
    gpus: tuple[int, int] | None = key("gpus = [0, 1]", K.gpu_pair)     # two GPUs of `host`
    state: str | None = key(f'state = "IN_PROGRESS" (one of {", ".join(s.name for s in FabricState)})',
                            K.fabric_state)                           # a FabricState name
    rank: int | None = key("rank = 0", K.rank)
    # 1-based: the k-th allocation of that rank fails
    at_allocation: int | None = key("at_allocation = 1", K.allocation)
    # Driver method name, e.g. "cudaIpcOpenMemHandle"
    api: str | None = key('api = "cudaIpcOpenMemHandle"', K.api)
    # cudaError_t / CUresult name, e.g. "cudaErrorInvalidValue"
    code: str | None = key('code = "cudaErrorInvalidValue"', K.error_code)
    nth: int = key("nth = 1", K.call_number, default=1)               # which call of `api` fails
    # How P2P fails, one of the kind's `causes` (acs, iommu, dropped, corrupt)
    cause: str | None = key('cause = "acs"', K.cause)
    hosts: tuple[str, ...] | None = key('hosts = ["<host name>"]', K.host_list)   # imex_split
    # driver_version: the kernel driver, e.g. "450.80.02"
    version: str | None = key('version = "450.80.02"', K.driver_version)


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
    """One expected outcome (docs/scenario-format.md, `[[expect]]`): a backend (`backend` for
    `group`, optionally per `op` and `size`); an error (`error` by CUDA name or run outcome,
    at lifecycle `step`, optionally on `rank` and with `message` text in its diagnosis); or an
    outcome that is not an error (commsim/scenario/outcomes.py): wrong data (`wrong_data`,
    with `max_error`), NCCL's transport between a `pair` of ranks (`transport`), a fallback
    to a legal but slower backend (`fallback`), undefined behaviour (`undefined`)."""

    group: str | None = None
    op: str | None = None
    size: int | None = None
    backend: str | None = None
    error: str | None = None
    step: str | None = None
    rank: int | None = None
    leak: bool = False                        # a leak is expected (shortcut-policy regressions)
    message: str | None = None                # text the error's message / diagnosis contains
    wrong_data: bool = False                  # the result check finds wrong data
    max_error: float | None = None            # ... whose largest absolute error is this (1 %)
    transport: str | None = None              # NCCL's transport for `pair`: "P2P", "SHM", "NET" ...
    pair: tuple[int, int] | None = None       # two world ranks of one group
    fallback: str | None = None               # the legal, slower backend the group runs
    undefined: bool = False                   # the run hits undefined behaviour (a fabric flag)

    @property
    def failure(self) -> bool:
        """Whether this expects the file's own policy to fail (an error, a leak, wrong data,
        undefined behaviour): such a file runs with `--expect-failure`."""
        return bool(self.error or self.leak or self.wrong_data or self.undefined)


@dataclass(frozen=True)
class RankView:
    """What one rank's process is given to see (rows W1, W3; sim/visibility.py): its
    container's device cgroup (host GPU indices, "2,3"; None: the whole host) and its
    CUDA_VISIBLE_DEVICES as written (None: unset)."""

    devices: str | None = None
    visible: str | None = None


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
    views: tuple[RankView, ...] = ()          # per rank; () or a default view: the whole host

    @property
    def world_size(self) -> int:
        return len(self.placement)

    def view(self, rank: int) -> RankView:
        return self.views[rank] if rank < len(self.views) else RankView()

    def group(self, name: str) -> Group:
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(name)

