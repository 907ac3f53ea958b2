"""SimDriver and CudaDriver satisfy one Driver protocol, and CudaDriver keeps its conventions
(error codes for values that convert, the binding's exceptions for values that do not, plain
handle values) where that needs no GPU."""

from __future__ import annotations

import inspect
import os

import pytest

from commsim.driver import (Driver, FABRIC_HANDLE_SIZE, IPC_HANDLE_SIZE, access_desc, alloc_prop,
                            multicast_prop)
from commsim.sim import SimFabric, spawn_driver
from commsim.sim.driver import SimDriver
from commsim.topology.model import GpuRef
from commsim.topology.presets import build
from cuda.bindings import driver as cu
from cuda.bindings import runtime as cudart
from device import handles
from device.driver import CudaDriver
from device.nvml import Nvml

# Beyond the Protocol class: what backends, discovery and the conformance rig also call.
HELPERS = ("memcpy_htod", "memcpy_dtoh", "launch_kernel", "close_fd")
PROTOCOL = tuple(n for n, v in vars(Driver).items() if callable(v) and not n.startswith("_"))


def _params(fn) -> list[tuple[str, inspect._ParameterKind]]:
    return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()]


def test_protocol_lists_the_cuda_and_nvml_surface():
    assert len(PROTOCOL) >= 36
    for name in ("cudaIpcOpenMemHandle", "cuMemImportFromShareableHandle", "cuMulticastBindMem",
                 "nvmlDeviceGetGpuFabricInfo", "imex_channels", "shm_namespace"):
        assert name in PROTOCOL


@pytest.mark.parametrize("name", PROTOCOL + HELPERS)
def test_both_drivers_have_the_method_with_the_same_signature(name):
    sim, cuda = getattr(SimDriver, name, None), getattr(CudaDriver, name, None)
    assert sim is not None, f"SimDriver lacks {name}"
    assert cuda is not None, f"CudaDriver lacks {name}"
    want = _params(getattr(Driver, name)) if name in PROTOCOL else _params(sim)
    assert _params(sim) == want, f"SimDriver.{name}{inspect.signature(sim)}"
    assert _params(cuda) == want, f"CudaDriver.{name}{inspect.signature(cuda)}"


def test_sim_instance_and_cuda_class_are_drivers():
    cluster = build("hgx-h100-8")
    d = spawn_driver(SimFabric(cluster, seed=0), GpuRef(cluster.hosts[0].name, 0))
    assert isinstance(d, Driver)
    assert issubclass(CudaDriver, Driver)


# ---- CudaDriver's conventions, on an instance that never touched a GPU ---------------------

@pytest.fixture
def bare() -> CudaDriver:
    """A CudaDriver without __init__ (no GPU here): only calls that fail before reaching the
    CUDA driver can be made, which is exactly the argument checking under test."""
    d = object.__new__(CudaDriver)
    d.device, d.nvml, d._modules, d._functions, d._sm_counts = 0, Nvml(), {}, {}, {0: 132}
    return d


E, R = cudart.cudaError_t, cu.CUresult


@pytest.mark.parametrize("call, args, exc", [
    ("cudaMalloc", (-1,), OverflowError),
    ("cudaMalloc", (1 << 70,), OverflowError),
    ("cudaMalloc", (float("nan"),), ValueError),
    ("cudaMalloc", ("4096",), TypeError),
    ("cudaMemcpy", (1, 2, -5, 3), OverflowError),
    ("cudaMemset", (4096, 0, -1), OverflowError),
    ("memcpy_dtoh", (4096, -1), OverflowError),
    ("cuMemCreate", (-4096, None, 0), OverflowError),
    ("cuMemAddressReserve", (-1, 0, 0, 0), OverflowError),
])
def test_values_the_binding_cannot_convert_raise_as_in_the_simulator(bare, call, args, exc):
    with pytest.raises(exc):
        getattr(bare, call)(*args)
    cluster = build("hgx-h100-8")
    sim = spawn_driver(SimFabric(cluster, seed=0), GpuRef(cluster.hosts[0].name, 0))
    with pytest.raises(exc):
        getattr(sim, call)(*args)


@pytest.mark.parametrize("call, args, code", [
    ("cudaMemcpy", (1, 2, 16, 99), E.cudaErrorInvalidValue),        # no such cudaMemcpyKind
    ("cudaIpcOpenMemHandle", (12345, 1), E.cudaErrorInvalidResourceHandle),   # a number is no handle
    ("cuMemExportToShareableHandle", (1, 3, 0), R.CUDA_ERROR_INVALID_VALUE),  # 3: no handle type
    ("cuMemImportFromShareableHandle", (b"x" * 64, 1), R.CUDA_ERROR_INVALID_VALUE),  # bytes as fd
    ("cuMemImportFromShareableHandle", (7, 8), R.CUDA_ERROR_INVALID_VALUE),  # int as fabric blob
    ("cuDeviceGetAttribute", (-7, 0), R.CUDA_ERROR_INVALID_VALUE),
    ("launch_kernel", ("no_such_kernel",), E.cudaErrorInvalidDeviceFunction),
    ("launch_kernel", ("one_shot_all_reduce", [1, 2], 5, 16, "float32", 1 << 20, 1),
     E.cudaErrorInvalidValue),                                     # rank 5 of 2
    ("launch_kernel", ("one_shot_all_reduce", [1, 2], 0, 16, "int8", 1 << 20, 1),
     E.cudaErrorInvalidValue),
])
def test_bad_values_that_convert_answer_codes_not_exceptions(bare, call, args, code):
    res = getattr(bare, call)(*args)
    assert isinstance(res, tuple) and int(res[0]) == int(code), res
    assert all(v is None for v in res[1:])


def test_close_fd_is_os_close(bare):
    r, w = os.pipe()
    assert bare.close_fd(r) == 0 and bare.close_fd(w) == 0
    assert bare.close_fd(r) == -1          # EBADF, as the syscall
    assert bare.close_fd(-3) == -1


def test_nvml_without_library_answers_a_code(bare):
    if bare.nvml.init() == 0:
        pytest.skip("NVML is present here")
    rc, info = bare.nvml.fabric_info(None)
    assert rc != 0 and info is None
    assert bare.nvml.nvlinks_up(None)[0] != 0
    assert bare.nvml.link_cell(None, None) == "SYS"


def test_host_identity(bare, tmp_path):
    ns = bare.shm_namespace()
    assert ns == bare.shm_namespace() and "/shm:" in ns
    assert bare.getpid() == os.getpid() and bare.gethostname()
    from device.host import imex_channels
    for name in ("channel0", "channel7", "channelx", "other"):
        (tmp_path / name).write_text("")
    assert imex_channels(str(tmp_path)) == (0, 7)
    assert imex_channels(str(tmp_path / "missing")) == ()


# ---- handle conversions ---------------------------------------------------------------------

def test_ipc_handle_bytes_round_trip():
    data = bytes(range(64))
    h = handles.ipc_handle(data)
    assert isinstance(h, cudart.cudaIpcMemHandle_t)
    assert handles.ipc_bytes(h) == data and len(data) == IPC_HANDLE_SIZE
    assert handles.blob(h) == data and handles.blob(data) == data
    assert handles.blob(5) is None and handles.blob(None) is None and handles.blob(b"short") is None


def test_fabric_handle_bytes_round_trip():
    data = bytes(reversed(range(64)))
    h = handles.fabric_handle(data)
    assert isinstance(h, cu.CUmemFabricHandle)
    assert handles.fabric_bytes(h) == data and len(data) == FABRIC_HANDLE_SIZE
    assert handles.blob(h) == data


def test_struct_arguments_survive_pickling():
    import pickle
    fd_fabric = 0x1 | 0x8            # NVSHMEM's ANY mode: no single enum member
    args = [alloc_prop(3, fd_fabric), [access_desc(1), access_desc(2)], multicast_prop(4, 1 << 21, 1), 7]
    back = handles.rebuild(pickle.loads(pickle.dumps(handles.describe(args))))
    assert back[0].location.id == 3 and handles._raw_u32(back[0], 4) == fd_fabric
    assert [d.location.id for d in back[1]] == [1, 2]
    assert (back[2].numDevices, back[2].size, int(back[2].handleTypes)) == (4, 1 << 21, 1)
    assert back[3] == 7
