"""The fault registry: each fault kind a scenario may name is declared once, here or by a
`register_fault` call from outside, with everything the rest of commsim reads about it:

* its keys (required and optional fields of `Fault`), checked by the scenario loader;
* how it applies: a machine fault edits the ground truth (`commsim.topology.modify`) when
  the scenario loads; a driver fault arms the rank's `ProcessFaults` (`commsim.sim.faults`);
* the CUDA error names it injects, which the oracle then expects rather than blames;
* its weight in the sweep generator and how it picks a target among the scenario's GPUs;
* its line in the docs table (docs/scenario-format.md, checked by a test).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from typing import TYPE_CHECKING

from commsim.errors import UserError
from commsim.topology import modify
from commsim.topology.model import Cluster, FabricState, GpuRef
from commsim.scenario.model import Fault

if TYPE_CHECKING:
    from commsim.sim.faults import ProcessFaults

MACHINE, DRIVER = "machine", "driver"
OOM_ERRORS = ("cudaErrorMemoryAllocation", "CUDA_ERROR_OUT_OF_MEMORY")
# Set-up calls of the collective allocation paths whose failure on one rank the ranks must
# agree on before the next exchange (reference §7.4): the rendezvous hangs of issue 7 under a
# rank-local policy, a voted fall-back under the default one.
SETUP_CALLS = (("cuMemCreate", "CUDA_ERROR_OUT_OF_MEMORY"),
               ("cuMemImportFromShareableHandle", "CUDA_ERROR_INVALID_VALUE"),
               ("cuMemMap", "CUDA_ERROR_OUT_OF_MEMORY"),
               ("cuMulticastAddDevice", "CUDA_ERROR_INVALID_VALUE"),
               ("cuMulticastBindMem", "CUDA_ERROR_SYSTEM_NOT_READY"),
               ("cudaIpcOpenMemHandle", "cudaErrorTooManyPeers"))

Draw = Callable[[Cluster, Sequence[GpuRef], random.Random, GpuRef], Fault]


@dataclass(frozen=True)
class FaultKind:
    name: str
    fields: tuple[str, ...]                 # required keys (fields of Fault)
    target: str                             # MACHINE or DRIVER
    models: str                             # docs: what it models
    row: str = "–"                          # docs: reference §9 row(s)
    optional: tuple[str, ...] = ()          # optional keys, default from Fault
    # MACHINE: (cluster, fault) -> the degraded cluster; DRIVER: (faults, fault) -> None
    apply: Callable = None                  # type: ignore[assignment]
    injects: Callable[[Fault], tuple[str, ...]] | None = None   # error names it causes
    weight: float = 0.0                     # sweep generator weight; 0: never drawn
    # How the generator aims it (the GPU drawn from the placement is given); default: at it.
    draw: Draw | None = None
    label: Callable[[Fault], str] | None = None

    def describe(self, f: Fault) -> str:
        return self.label(f) if self.label else f"{f.kind}({f.gpu})"

    def make(self, cluster: Cluster, placement: Sequence[GpuRef], rng: random.Random,
             gpu: GpuRef) -> Fault:
        return self.draw(cluster, placement, rng, gpu) if self.draw else Fault(self.name, gpu=gpu)

    def doc_line(self) -> str:
        defaults = {f.name: f.default for f in dataclasses.fields(Fault)}
        keys = ", ".join(f"`{k}`" for k in self.fields)
        keys += "".join(f", optional `{k}` (default {defaults[k]})" for k in self.optional)
        return f"| `{self.name}` | {keys} | {self.models} | {self.row} |"


_kinds: dict[str, FaultKind] = {}
_FIELDS = {f.name for f in dataclasses.fields(Fault)} - {"kind"}


def register_fault(kind: FaultKind) -> FaultKind:
    """Declare a fault kind; a second kind under a taken name is refused."""
    bad = [k for k in kind.fields + kind.optional if k not in _FIELDS]
    if bad or kind.target not in (MACHINE, DRIVER) or kind.apply is None:
        raise UserError(f"fault kind {kind.name!r}: keys must be fields of Fault ({', '.join(sorted(_FIELDS))})"
                        f"{'; unknown: ' + ', '.join(bad) if bad else ''}; target one of "
                        f"{MACHINE}, {DRIVER}; and an apply function")
    old = _kinds.get(kind.name)
    if old is not None and old is not kind:
        raise UserError(f"fault kind {kind.name!r} is already registered")
    _kinds[kind.name] = kind
    return kind


def fault_kinds() -> dict[str, FaultKind]:
    return dict(_kinds)


def get_fault(name: str) -> FaultKind:
    return _kinds[name]


def kind_names() -> tuple[str, ...]:
    return tuple(_kinds)


def drawn_kinds() -> tuple[FaultKind, ...]:
    """The kinds the sweep generator draws, in registration order."""
    return tuple(k for k in _kinds.values() if k.weight > 0)


def is_driver_fault(f: Fault) -> bool:
    return _kinds[f.kind].target == DRIVER


def apply_machine_fault(cluster: Cluster, f: Fault) -> Cluster:
    k = _kinds[f.kind]
    if k.target != MACHINE:
        raise ValueError(f"not a machine fault: {f.kind}")
    return k.apply(cluster, f)


def arm_driver_faults(faults: Sequence[Fault], rank: int) -> "ProcessFaults":
    """The ProcessFaults of rank `rank`: every driver fault aimed at it, armed."""
    from commsim.sim.faults import ProcessFaults   # the simulator only when a run arms them
    pf = ProcessFaults()
    for f in faults:
        k = _kinds[f.kind]
        if k.target == DRIVER and f.rank == rank:
            k.apply(pf, f)
    return pf


def injected_errors(faults: Sequence[Fault]) -> set[str]:
    out: set[str] = set()
    for f in faults:
        k = _kinds[f.kind]
        if k.injects is not None:
            out.update(k.injects(f))
    return out


def docs_table() -> Iterator[str]:
    yield "| `kind` | Keys | Models | Row |"
    yield "|---|---|---|---|"
    for k in _kinds.values():
        yield k.doc_line()


# -- the built-in kinds ------------------------------------------------------------------------
def _fabric_status_error(cluster: Cluster, f: Fault) -> Cluster:
    # NVML keeps reporting the state it had; only the status turns non-success (row F4).
    return modify.with_fabric_state(cluster, f.gpu, cluster.gpu(f.gpu).fabric.state, status_ok=False)


def _draw_p2p_pair(cluster: Cluster, placement: Sequence[GpuRef], rng: random.Random,
                   gpu: GpuRef) -> Fault:
    """Two GPUs of one host the scenario uses; on a host with one GPU, its NVLinks instead."""
    by_host: dict[str, list[int]] = {}
    for g in placement:
        by_host.setdefault(g.host, []).append(g.index)
    multi = [h for h, ix in by_host.items() if len(ix) >= 2]
    if multi:
        h = rng.choice(sorted(multi))
        i, j = rng.sample(sorted(by_host[h]), 2)
    else:
        h = gpu.host
        n = len(cluster.host(h).gpus)
        if n < 2:
            return Fault("nvlinks_down", gpu=GpuRef(gpu.host, gpu.index))
        i, j = rng.sample(range(n), 2)
    return Fault("p2p_disabled", host=h, gpus=(min(i, j), max(i, j)))


def _arm_oom(pf: "ProcessFaults", f: Fault) -> None:
    pf.oom_at = f.at_allocation


def _arm_call(pf: "ProcessFaults", f: Fault) -> None:
    from commsim.sim.faults import CallFault, code_by_name
    pf.calls.append(CallFault(f.api, code_by_name(f.code), f.nth))


def _draw_call(cluster: Cluster, placement: Sequence[GpuRef], rng: random.Random, gpu: GpuRef) -> Fault:
    api, code = rng.choice(SETUP_CALLS)
    return Fault("call_fails", rank=rng.randrange(len(placement)), api=api, code=code,
                 nth=rng.randint(1, 2))


for _k in (
    FaultKind("imex_missing", ("host",), MACHINE,
              "no usable IMEX channel on that host (channel not created, wrong major/minor, not "
              "mounted in the container): `cuMemCreate` / import with FABRIC answer "
              "`CUDA_ERROR_NOT_PERMITTED` there. Its `imex_channels` become empty.", "V3, V5",
              apply=lambda c, f: modify.without_imex(c, f.host), weight=10,
              draw=lambda c, p, rng, g: Fault("imex_missing", host=g.host),
              label=lambda f: f"imex_missing({f.host})"),
    FaultKind("fabric_state", ("gpu", "state"), MACHINE,
              "NVML reports that fabric state for the GPU, e.g. `IN_PROGRESS` (Fabric Manager not "
              "done): not MNNVL. `state` is one of `NOT_SUPPORTED`, `NOT_STARTED`, `IN_PROGRESS`, "
              "`COMPLETED` (any case).", "F1",
              apply=lambda c, f: modify.with_fabric_state(c, f.gpu, FabricState[f.state]), weight=12,
              draw=lambda c, p, rng, g: Fault("fabric_state", gpu=GpuRef(g.host, g.index),
                                              state=rng.choice(("IN_PROGRESS", "IN_PROGRESS", "NOT_STARTED"))),
              label=lambda f: f"fabric_state({f.gpu} {f.state})"),
    FaultKind("fabric_status_error", ("gpu",), MACHINE,
              "NVML keeps the GPU's state but reports a non-success status (TRT-LLM then says not "
              "MNNVL).", "F4", apply=_fabric_status_error, weight=6),
    FaultKind("zero_cluster_uuid", ("gpu",), MACHINE,
              "NVML reports an all-zero cluster UUID: \"no MNNVL\" for NCCL / NVSHMEM.", "F2",
              apply=lambda c, f: modify.with_zero_cluster_uuid(c, f.gpu), weight=10),
    FaultKind("p2p_disabled", ("host", "gpus"), MACHINE,
              "`cuDeviceCanAccessPeer` answers 0 between two GPUs of the host; `gpus = [i, j]`, two "
              "distinct local indices. Legacy IPC opens fail `cudaErrorPeerAccessUnsupported`. "
              "NVLinks stay up: NVML's NVLink state and P2P-over-NVLink status keep following the "
              "links.", "L10, N1",
              apply=lambda c, f: modify.without_p2p(c, f.host, *f.gpus), weight=10, draw=_draw_p2p_pair,
              label=lambda f: f"p2p_disabled({f.host} {f.gpus[0]}-{f.gpus[1]})"),
    FaultKind("no_multicast", ("gpu",), MACHINE,
              "`MULTICAST_SUPPORTED` = 0 on the GPU (e.g. unified memory off under vGPU): "
              "`cuMulticastCreate` fails.", "M1",
              apply=lambda c, f: modify.without_multicast(c, f.gpu), weight=10),
    FaultKind("nvlinks_down", ("gpu",), MACHINE,
              "some P2P-capable NVLink of the GPU is inactive (what FlashInfer / TRT-LLM check before "
              "MNNVL); NVML's NVLink P2P status to its peers reads not supported, while "
              "`cuDeviceCanAccessPeer` keeps the P2P fact (PCIe P2P).", "§4.2, B22, N2",
              apply=lambda c, f: modify.with_nvlinks_down(c, f.gpu), weight=8),
    FaultKind("oom", ("rank", "at_allocation"), DRIVER,
              "driver fault: the rank's `at_allocation`-th allocation (1 = the first) fails out of "
              "memory.", apply=_arm_oom, injects=lambda f: OOM_ERRORS, weight=10,
              draw=lambda c, p, rng, g: Fault("oom", rank=rng.randrange(len(p)), at_allocation=rng.randint(1, 4)),
              label=lambda f: f"oom(rank {f.rank}, alloc {f.at_allocation})"),
    FaultKind("call_fails", ("rank", "api", "code"), DRIVER,
              "driver fault: the `nth` call of driver function `api` (e.g. `\"cudaIpcOpenMemHandle\"`) "
              "on that rank returns `code`.", optional=("nth",), apply=_arm_call,
              injects=lambda f: (f.code,), weight=10, draw=_draw_call,
              label=lambda f: f"call_fails(rank {f.rank}, {f.api} #{f.nth} -> {f.code})"),
):
    register_fault(_k)

# Issue 17's kinds (docs/fidelity-rules.md) are declared in their own module and register
# themselves here, after the built-in ones (they build on this module).
from commsim.scenario import fidelity_faults  # noqa: E402,F401
