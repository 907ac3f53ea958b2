"""SimDriver rejects exactly what cuda-python's bindings reject, the way they reject it
: for every parameter in commsim.sim.binding_args.SIGNATURES and every
kind of adversarial value, the real binding is called (its argument conversion runs without a
GPU: a value that converts goes on to load the driver library, which is absent here) and the
simulator's conversion must raise the same exception type, or accept it too."""

from __future__ import annotations

import math

import numpy as np
import pytest
from cuda.bindings import driver as cu
from cuda.bindings import runtime as rt

from commsim.sim import binding_args

VALUES = ["1", "abc", 1.5, math.inf, -math.inf, math.nan, -1, -(2 ** 31) - 1, 2 ** 31, 2 ** 32,
          2 ** 63, 2 ** 64, None, True, np.int64(5), np.float64(2.0), [1], b"ab"]

# A value every binding accepts for each parameter, so that one parameter at a time is probed.
NEUTRAL = {
    binding_args.size_t: 0, binding_args.c_int: 0, binding_args.c_uint: 0,
    binding_args.cu_device: 0, binding_args.cu_value: 0, binding_args.enum32: 0,
    binding_args.dev_ptr: 0, binding_args.os_handle: 0,
}
STRUCTS = {   # the passthrough parameters, per function: a real object of the right type
    ("cudaIpcOpenMemHandle", 0): lambda: rt.cudaIpcMemHandle_t(),
    ("cuMemGetAllocationGranularity", 0): lambda: cu.CUmemAllocationProp(),
    ("cuMemCreate", 1): lambda: cu.CUmemAllocationProp(),
    ("cuMemExportToShareableHandle", 1):
        lambda: cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
    ("cuMemImportFromShareableHandle", 1):
        lambda: cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
    ("cuMemSetAccess", 2): lambda: None,
    ("cuMulticastGetGranularity", 0): lambda: cu.CUmulticastObjectProp(),
    ("cuMulticastCreate", 0): lambda: cu.CUmulticastObjectProp(),
}
NOT_BINDINGS = {"memcpy_htod", "memcpy_dtoh"}   # the protocol's own helpers (cudaMemcpy's kinds)
# RuntimeError: a count past its list ("List is too small", binding_args.LIST_COUNTS)
REJECTIONS = (TypeError, ValueError, OverflowError, RuntimeError)


def _driver_present() -> bool:
    try:
        return int(cu.cuInit(0)[0]) == 0
    except Exception:
        return False


pytestmark = pytest.mark.skipif(_driver_present(), reason="a CUDA driver is loaded here: the "
                                "accepted calls would reach a real GPU")


def _real(name: str, args: list) -> str:
    fn = getattr(rt, name, None) or getattr(cu, name)
    try:
        fn(*args)
    except REJECTIONS as e:
        if type(e).__module__.startswith("cuda.pathfinder"):
            return "accepted"         # it got as far as loading the driver library
        return type(e).__name__
    except Exception:
        return "accepted"
    return "accepted"


def _sim(name: str, args: list) -> str:
    try:
        binding_args.convert(name, tuple(args))
    except REJECTIONS as e:
        return type(e).__name__
    return "accepted"


CASES = [(name, i) for name, sig in binding_args.SIGNATURES.items() if name not in NOT_BINDINGS
         for i, conv in enumerate(sig) if conv is not binding_args.passthrough]


@pytest.mark.parametrize("name, index", CASES, ids=[f"{n}-arg{i}" for n, i in CASES])
def test_the_simulator_converts_each_argument_as_the_binding_does(name, index):
    sig = binding_args.SIGNATURES[name]
    base = [STRUCTS[(name, j)]() if c is binding_args.passthrough else NEUTRAL[c]
            for j, c in enumerate(sig)]
    differ = []
    for v in VALUES:
        args = list(base)
        args[index] = v
        real, sim = _real(name, args), _sim(name, args)
        if real != sim:
            differ.append(f"{v!r}: binding {real}, simulator {sim}")
    assert not differ, f"{name} argument {index}:\n  " + "\n  ".join(differ)


def test_every_signature_matches_the_bindings_arity():
    for name, sig in binding_args.SIGNATURES.items():
        if name in NOT_BINDINGS:
            continue
        fn = getattr(rt, name, None) or getattr(cu, name)
        head = fn.__doc__.strip().split("\n")[0]
        params = head[head.index("(") + 1:head.rindex(")")]
        n = 0 if not params.strip() else len(params.split(","))
        assert n == len(sig), (name, head)
