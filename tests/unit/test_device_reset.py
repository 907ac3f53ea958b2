"""cudaDeviceReset and cuDevicePrimaryCtxReset in the simulated driver, one test per rule
(CUDA Runtime API, cuda_runtime_api.h, and Driver API, cuda.h, CUDA 13.0): the reset destroys
this process's allocations and IPC mappings of the reset device only, the device works again
after it, an exporter's reset frees memory a peer still maps (as cudaFree does, row L15), and
the driver form takes a device ordinal and refuses a bad one."""

from __future__ import annotations

from commsim.driver import check
from commsim.sim import SimFabric, spawn_driver
from commsim.sim.driver import E, R
from commsim.topology import build_preset

LAZY = 1      # cudaIpcMemLazyEnablePeerAccess


def pair():
    c = build_preset("hgx-h100-8")
    refs = list(c.gpu_refs())
    fab = SimFabric(c, 0)
    return fab, spawn_driver(fab, refs[0]), spawn_driver(fab, refs[1])


def test_reset_frees_the_current_devices_allocations_and_no_others():
    _, d, _ = pair()
    on0 = check("cudaMalloc", d.cudaMalloc(4096))
    check("cudaSetDevice", d.cudaSetDevice(1))
    on1 = check("cudaMalloc", d.cudaMalloc(4096))
    check("cudaSetDevice", d.cudaSetDevice(0))
    assert d.cudaDeviceReset() == (E.cudaSuccess,)
    assert d.cudaFree(on0)[0] == E.cudaErrorInvalidValue       # gone with the context
    assert d.ledger.count("allocation") == 1                     # device 1's is left
    check("cudaFree", d.cudaFree(on1))
    assert d.ledger.count() == 0


def test_the_device_works_again_after_a_reset():
    _, d, _ = pair()
    check("cudaMalloc", d.cudaMalloc(1 << 20))
    check("cudaDeviceReset", d.cudaDeviceReset())
    p = check("cudaMalloc", d.cudaMalloc(1 << 20))   # "any subsequent API call ... reinitialize"
    check("cudaMemset", d.cudaMemset(p, 3, 16))
    assert bytes(d.memcpy_dtoh(p, 4)[1]) == b"\x03" * 4


def test_reset_closes_the_ipc_mappings_opened_in_the_context_every_reference():
    fab, exp, imp = pair()
    p = check("cudaMalloc", exp.cudaMalloc(4096))
    h = check("cudaIpcGetMemHandle", exp.cudaIpcGetMemHandle(p))
    q = check("cudaIpcOpenMemHandle", imp.cudaIpcOpenMemHandle(h, LAZY))
    check("cudaIpcOpenMemHandle", imp.cudaIpcOpenMemHandle(h, LAZY))    # refcount 2
    check("cudaDeviceReset", imp.cudaDeviceReset())
    assert imp.cudaIpcCloseMemHandle(q)[0] == E.cudaErrorInvalidValue
    assert imp.ledger.count() == 0
    check("cudaFree", exp.cudaFree(p))
    assert fab.flags == []                 # the importer closed first: no free-while-mapped


def test_an_exporters_reset_under_a_mapping_peer_is_flagged_as_cudafree_is():
    fab, exp, imp = pair()
    p = check("cudaMalloc", exp.cudaMalloc(4096))
    h = check("cudaIpcGetMemHandle", exp.cudaIpcGetMemHandle(p))
    check("cudaIpcOpenMemHandle", imp.cudaIpcOpenMemHandle(h, LAZY))
    check("cudaDeviceReset", exp.cudaDeviceReset())
    assert len(fab.flags) == 1 and "row L15" in fab.flags[0]


def test_the_driver_form_resets_the_named_device_and_refuses_a_bad_one():
    _, d, _ = pair()
    on0 = check("cudaMalloc", d.cudaMalloc(4096))
    check("cudaSetDevice", d.cudaSetDevice(1))
    on1 = check("cudaMalloc", d.cudaMalloc(4096))
    assert d.cuDevicePrimaryCtxReset(0) == (R.CUDA_SUCCESS,)     # not the current device
    assert d.cudaFree(on0)[0] == E.cudaErrorInvalidValue
    check("cudaFree", d.cudaFree(on1))
    assert d.cuDevicePrimaryCtxReset(8) == (R.CUDA_ERROR_INVALID_DEVICE,)
