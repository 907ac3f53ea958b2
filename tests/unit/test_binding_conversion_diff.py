"""A differential fuzz of argument conversion against the installed cuda-bindings: for every
function the hosted `cuda.bindings` stand-ins serve (commsim/hosting/surfaces/cuda), every
method of the simulator's and the real-GPU driver's protocol that is a binding call
(commsim/sim/driver.py, device/driver.py), every parameter and every kind of value (ints at
the C types' edges, 4096.7, nan, inf, negatives, huge ints, bool, None, str, bytes, numpy
scalars, a list), the call is accepted or rejected with the same exception type as the real
binding's. The real binding converts its arguments before it needs a driver, so on a machine
without one a value that converts reaches the driver library load and fails there
(cuda.pathfinder) or returns a code such as cudaErrorInsufficientDriver: that is "accepted".

Found once: the stand-ins rejected every float with TypeError where the binding takes
cudaMalloc(4096.7) as 4096 (about 2,300 mismatches), checked cuInit before converting (a str
got CUDA_ERROR_NOT_INITIALIZED instead of TypeError), and device/driver.py answered
INVALID_VALUE for what the binding and the simulator raise on."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
from cuda.bindings import driver as cu
from cuda.bindings import runtime as rt

from commsim.hosting.state import session
from commsim.hosting.surfaces.cuda import bindings as cuda_bindings
from commsim.sim import SimFabric, binding_args, spawn_driver
from commsim.sim.driver import SimDriver
from commsim.topology.model import GpuRef
from commsim.topology.presets import build
from device.driver import CudaDriver, unavailable_reason
from device.nvml import Nvml

VALUES = {"0": 0, "5": 5, "4096.7": 4096.7, "nan": math.nan, "inf": math.inf, "-inf": -math.inf,
          "-1": -1, "-2**31-1": -(2 ** 31) - 1, "2**31-1": 2 ** 31 - 1, "2**31": 2 ** 31,
          "2**32": 2 ** 32, "2**63": 2 ** 63, "2**64": 2 ** 64, "2**70": 2 ** 70, "True": True,
          "None": None, "'1'": "1", "'abc'": "abc", "np.int64": np.int64(5),
          "np.uint8": np.uint8(3), "np.float64": np.float64(2.5), "b'ab'": b"ab", "[1]": [1]}
CLUSTER = build("hgx-h100-8")
GPU = GpuRef(CLUSTER.hosts[0].name, 0)


# Where a driver works, the accepted calls would reach a real GPU.
pytestmark = pytest.mark.skipif(not unavailable_reason(), reason="a CUDA driver works here")


def real_outcome(fn, args: list) -> str:
    try:
        fn(*args)                      # a value that converts returns a code without a driver,
    except Exception as e:
        if type(e).__module__.startswith("cuda.pathfinder"):
            return "accepted"          # or got as far as loading the driver library
        return type(e).__name__
    return "accepted"


def our_outcome(fn, args: list) -> str:
    try:
        fn(*args)
    except NotImplementedError as e:
        if "is not simulated" in str(e):
            return "accepted"          # converted; the hosting then names what it lacks
        raise
    except Exception as e:
        if type(e).__module__.startswith("cuda.pathfinder"):
            return "accepted"          # device/driver.py went on to the real binding
        return type(e).__name__
    return "accepted"


def neutral(conv, pname: str):
    """A value every binding accepts for a parameter, so one parameter at a time is probed."""
    cls = getattr(conv, "cls", None)
    if getattr(conv, "late", False):
        return next(iter(cls))                   # an enum member
    if cls is not None:
        return cls()
    if conv.__name__.startswith("list_"):
        return []
    # cudaMemcpyDeviceToDevice: a copy between null device pointers, never host memory
    return 3 if pname == "kind" else 0


class Events:
    def cuda_error(self, *args, **kwargs) -> None:
        pass

    def note(self, text: str) -> None:
        pass


def hosted_rank() -> session.HostedRank:
    fabric = SimFabric(CLUSTER, seed=0)
    gpus = tuple(GpuRef(GPU.host, i) for i in range(len(CLUSTER.hosts[0].gpus)))
    proc = fabric.spawn(GPU.host, gpus)
    return session.HostedRank(rank=0, world_size=1, local_rank=0, local_world_size=1,
                              host=GPU.host, driver=SimDriver(fabric, proc), cluster=CLUSTER,
                              visible=gpus, shm_dir="", events=Events())


def mismatches(real_fn, ours, convs, names) -> list[str]:
    """Every (parameter, value) where one of `ours` (label -> callable) disagrees with the
    real binding."""
    out = []
    for i, conv in enumerate(convs):
        for label, value in VALUES.items():
            if names[i] == "length" and label == "2**31-1":
                continue     # the binding allocates a name buffer of that many bytes (2 GiB)
            args = [neutral(c, n) for c, n in zip(convs, names)]
            args[i] = value
            want = real_outcome(real_fn, args)
            for who, fn in ours.items():
                got = our_outcome(fn, args)
                if got != want:
                    out.append(f"{who} {real_fn.__name__}({names[i]}={label}): binding {want}, "
                               f"ours {got}")
    return out


def test_the_hosted_standins_convert_every_argument_as_the_binding_does():
    bad, calls = [], 0
    for module, names in cuda_bindings.simulated_functions().items():
        real = cuda_bindings._REAL[module]
        impl = cuda_bindings.standin(module).__dict__["_impl"]
        for name in names:
            convs = binding_args.BINDINGS[name]
            params = list(inspect.signature(impl[name]).parameters)
            r = hosted_rank()          # one fresh process per function: no state carries over

            def ours(*args, _fn=impl[name], _r=r):
                with session.bound(_r):
                    return _fn(*args)
            bad += mismatches(getattr(real, name), {"hosted": ours}, convs, params)
            calls += len(convs) * len(VALUES)
    assert calls > 2900
    assert not bad, f"{len(bad)} of {calls} differ:\n" + "\n".join(bad[:40])


def bare_cuda_driver() -> CudaDriver:
    """A CudaDriver that never touched a GPU: only argument handling can be exercised."""
    d = object.__new__(CudaDriver)
    d.device, d.nvml, d._modules, d._functions, d._sm_counts = 0, Nvml(), {}, {}, {0: 132}
    return d


# The protocol's own helpers are not binding calls; struct parameters take the simulator's own
# values (handle bytes, prop objects) by design, so only the numeric ones are compared.
PROTOCOL_ONLY = {"memcpy_htod", "memcpy_dtoh"}


def test_the_simulator_and_the_gpu_driver_convert_as_the_binding_does():
    bad, calls = [], 0
    for name, sig in binding_args.SIGNATURES.items():
        if name in PROTOCOL_ONLY or not sig:
            continue
        real = getattr(rt, name, None) or getattr(cu, name)
        params = list(inspect.signature(getattr(SimDriver, name)).parameters)[1:]
        sim = spawn_driver(SimFabric(CLUSTER, seed=0), GPU)
        gpu = bare_cuda_driver()
        for i, conv in enumerate(sig):
            if conv is binding_args.passthrough:
                continue
            base = [neutral(c, n) if c is not binding_args.passthrough else _struct(name, j)
                    for j, (c, n) in enumerate(zip(sig, params))]
            for label, value in VALUES.items():
                args = list(base)
                args[i] = value
                want = real_outcome(real, args)
                for who, fn in (("sim", getattr(sim, name)), ("device", getattr(gpu, name))):
                    got = our_outcome(fn, args)
                    calls += 1
                    if got != want:
                        bad.append(f"{who} {name}({params[i]}={label}): binding {want}, ours {got}")
    assert calls > 1500
    assert not bad, f"{len(bad)} of {calls} differ:\n" + "\n".join(bad[:40])


def _struct(name: str, index: int):
    """A real binding object for a passthrough parameter, which both the binding and the
    simulator take."""
    return {("cudaIpcOpenMemHandle", 0): rt.cudaIpcMemHandle_t,
            ("cuMemGetAllocationGranularity", 0): cu.CUmemAllocationProp,
            ("cuMemCreate", 1): cu.CUmemAllocationProp,
            ("cuMulticastGetGranularity", 0): cu.CUmulticastObjectProp,
            ("cuMulticastCreate", 0): cu.CUmulticastObjectProp,
            ("cuMemSetAccess", 2): list,
            }.get((name, index), lambda: cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)()
