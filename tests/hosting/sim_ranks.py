"""Test harness for the module surfaces: hosted ranks built by hand on a preset machine.

`ranks(spec, placement)` spawns one simulated process per (host index, GPU index), either
seeing every GPU of its host (current device = its GPU, how vLLM / sglang workers run) or,
with one_visible=True, only its own GPU (CUDA_VISIBLE_DEVICES=<gpu>, how Ray places ranks).
`run(ranks, body)` runs body(group) for every rank as a greenlet of the group scheduler,
inside `session.bound(rank)`. The programs under test import cuda-python, ctypes, pynvml and
torch themselves; the group is only their handle-exchange transport.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any, Callable

import pytest

from commsim.group.local import LocalWorld
from commsim.hosting.surfaces.cuda import bindings as cuda_bindings
from commsim.hosting.surfaces.cuda import cudart
from commsim.hosting.surfaces.nccl import libnccl as nccl
from commsim.hosting.surfaces import nvml
from commsim.hosting.state import session
from commsim.hosting.surfaces.table import TABLE as SURFACE_TABLE
from commsim.hosting.surfaces.torch import accelerator as torch_accelerator
from commsim.hosting.surfaces.torch import cuda as torch_cuda
from commsim.hosting.surfaces.torch import factories as torch_factories
from commsim.hosting.surfaces.torch import ipc as torch_ipc
from commsim.hosting.surfaces.torch import nvtx as torch_nvtx
from commsim.hosting.surfaces.torch_distributed import symm_mem as torch_symm_mem
from commsim.sim.ledger import call_site
from commsim.sim import SimFabric
from commsim.sim.driver import SimDriver
from commsim.topology.model import GpuRef
from commsim.topology.presets import build


# The surfaces that answer from the bound rank alone, in the surface table's order (the rest
# need a launched run: host identity, torch.distributed, mpi4py).
MODULE_SURFACES = tuple(importlib.import_module(e.module) for e in SURFACE_TABLE if not e.needs_launcher)


@pytest.fixture(scope="module")
def module_surfaces():
    """The module surfaces installed for the tests of one module, then the real modules back
    (each surface's install/uninstall nest, so this composes with a bootstrap's install)."""
    for m in MODULE_SURFACES:
        m.install()
    yield
    for m in reversed(MODULE_SURFACES):
        m.uninstall()


@dataclass
class CudaErrorSeen:
    api: str
    code: int
    name: str
    text: str
    site: str


class Recorder:
    """The rank's events (the `cuda_error` / `note` interface of the hosting contract),
    keeping the first CUDA error with the user's call site."""

    def __init__(self) -> None:
        self.first_error: CudaErrorSeen | None = None
        self.notes: list[str] = []

    def cuda_error(self, api: str, code: int, name: str, text: str, why: Any = None) -> None:
        if self.first_error is None:
            self.first_error = CudaErrorSeen(api, int(code), name, text, call_site(3))

    def note(self, text: str) -> None:
        self.notes.append(text)


def ranks(spec: str, placement: list[tuple[int, int]], one_visible: bool = False,
          seed: int = 0, mutate: Callable[[Any], Any] | None = None
          ) -> tuple[SimFabric, list[session.HostedRank]]:
    cluster = build(spec)
    if mutate is not None:
        cluster = mutate(cluster)
    fabric = SimFabric(cluster, seed=seed)
    out = []
    local: dict[str, int] = {}
    for r, (h, g) in enumerate(placement):
        host = cluster.hosts[h]
        ref = GpuRef(host.name, g)
        gpus = (ref,) if one_visible else tuple(GpuRef(host.name, x.index) for x in host.gpus)
        proc = fabric.spawn(host.name, gpus)
        proc.current = gpus.index(ref)
        lr = local.get(host.name, 0)
        local[host.name] = lr + 1
        out.append(session.HostedRank(
            rank=r, world_size=len(placement), local_rank=lr,
            local_world_size=sum(1 for hh, _ in placement if hh == h), host=host.name,
            driver=SimDriver(fabric, proc), cluster=cluster, visible=gpus, shm_dir="",
            events=Recorder()))
    return fabric, out


def run(hosted_ranks: list[session.HostedRank], body: Callable[[Any], Any], seed: int = 0) -> list:
    world = LocalWorld(len(hosted_ranks), seed=seed)
    for r in hosted_ranks:
        r.world = world      # where in-process rendezvous (libnccl's unique ids) meet

    def one(group: Any) -> Any:
        with session.bound(hosted_ranks[group.rank]):
            return body(group)

    return world.run(one)


def solo(rank: session.HostedRank, body: Callable[[], Any]) -> Any:
    with session.bound(rank):
        return body()


def spawned_worker(spec: str, host: int, gpu: int, out: Any) -> None:
    """Entry of a process started with multiprocessing 'spawn': install the surfaces as the
    hosting bootstrap does at interpreter start, bind this process to a rank (process-wide,
    as in procs mode) and run a wrapper-style program; put its observations on `out`."""
    import ctypes

    for m in MODULE_SURFACES:
        m.install()
    _, (r,) = ranks(spec, [(host, gpu)])
    session.set_process_rank(r)                 # procs mode: the whole process is the rank
    path = next(line[line.index("/"):].strip() for line in open("/proc/self/maps")
                if "libcudart" in line)
    lib = ctypes.CDLL(path)
    lib.cudaGetErrorString.restype = ctypes.c_char_p
    p = ctypes.c_void_p()
    lib.cudaMalloc(ctypes.byref(p), 1 << 20)
    handle = (ctypes.c_byte * 64)()
    lib.cudaIpcGetMemHandle(ctypes.byref(handle), p)
    own = ctypes.c_void_p()
    code = lib.cudaIpcOpenMemHandle(ctypes.byref(own), handle, 1)   # its own handle
    import pynvml
    pynvml.nvmlInit()
    import torch
    out.put((os.path.basename(path), code, lib.cudaGetErrorString(code).decode(),
             pynvml.nvmlDeviceGetCount(), torch.cuda.is_available(), torch.cuda.current_device()))
