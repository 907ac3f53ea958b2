"""The built-in fault kinds, registered in the fault registry (commsim/scenario/fault_registry.py)
before those of fidelity_faults.py, and the registry's queries: import the registry from here,
so every built-in kind is there.
"""

from __future__ import annotations

import dataclasses

import random
from typing import TYPE_CHECKING, Sequence

from commsim.topology import modify
from commsim.topology.model import Cluster, FabricState, GpuRef
from commsim.scenario import fidelity_faults
from commsim.scenario.fault_registry import (
    DRIVER, MACHINE, Draw, FaultKind, apply_machine_fault, arm_driver_faults, docs_table, drawn_kinds,
    fault_kinds, get_fault, injected_errors, is_driver_fault, kind_names, register_fault,
)
from commsim.scenario.model import Fault

if TYPE_CHECKING:
    from commsim.sim.faults import ProcessFaults

__all__ = ["DRIVER", "MACHINE", "Draw", "FaultKind", "OOM_ERRORS", "SETUP_CALLS", "apply_machine_fault",
           "arm_driver_faults", "docs_table", "drawn_kinds", "fault_kinds", "get_fault",
           "injected_errors", "is_driver_fault", "kind_names", "register_fault"]

OOM_ERRORS = ("cudaErrorMemoryAllocation", "CUDA_ERROR_OUT_OF_MEMORY")
# Set-up calls of the collective allocation paths whose failure on one rank the ranks must
# agree on before the next exchange: under a rank-local policy the others wait in a rendezvous
# the failed rank never joins (a hang, tests/scenarios/test_rendezvous_hangs.py), under the
# default one they vote and fall back together.
SETUP_CALLS = (("cuMemCreate", "CUDA_ERROR_OUT_OF_MEMORY"),
               ("cuMemImportFromShareableHandle", "CUDA_ERROR_INVALID_VALUE"),
               ("cuMemMap", "CUDA_ERROR_OUT_OF_MEMORY"),
               ("cuMulticastAddDevice", "CUDA_ERROR_INVALID_VALUE"),
               ("cuMulticastBindMem", "CUDA_ERROR_SYSTEM_NOT_READY"),
               ("cudaIpcOpenMemHandle", "cudaErrorTooManyPeers"))


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


BUILT_IN: tuple[FaultKind, ...] = (
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
              "`cuDeviceCanAccessPeer` keeps the P2P fact (PCIe P2P).", "B22, N2",
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
)
# The built-in kinds, then the fidelity rules' kinds: the registry's order is the docs
# table's and the sweep generator's (drawn_kinds), so it stays as it was.
for _k in BUILT_IN + fidelity_faults.KINDS:
    register_fault(_k)

# Not drawn by the sweep generator (weight 0): it matters to NCCL's SHM transport (the
# sweep's nccl backend runs NCCL on the machine, docs/lifecycle-rules.md NC13).
register_fault(FaultKind(
    "small_dev_shm", ("host",), MACHINE,
    "the host's processes see a 64 MiB `/dev/shm` (a container's default, Docker's "
    "`--shm-size`): NCCL's SHM segments that do not fit fail with ENOSPC (NCCL's "
    "\"Error while creating shared memory segment\", NVIDIA/nccl#342).", "NC17",
    apply=lambda c, f: c.replace_host(f.host, container=dataclasses.replace(
        c.host(f.host).container, shm_bytes=64 << 20)),
    label=lambda f: f"small_dev_shm({f.host})"))
