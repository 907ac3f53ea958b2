"""pynvml (nvidia-ml-py, unmodified) over the simulated libnvidia-ml of the rank's host."""

from __future__ import annotations

import ctypes

import pytest

from commsim.topology.model import GpuRef
from sim_ranks import module_surfaces, ranks, run, solo  # noqa: F401  (fixture)

pytestmark = pytest.mark.usefixtures("module_surfaces")


def nvlink_summary(handle):
    """The FlashInfer/TRT-LLM "all P2P NVLinks up" probe, in our words."""
    import pynvml
    available = active = 0
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            if pynvml.nvmlDeviceGetNvLinkCapability(handle, link, pynvml.NVML_NVLINK_CAP_P2P_SUPPORTED):
                available += 1
                active += pynvml.nvmlDeviceGetNvLinkState(handle, link)
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
            continue
    return available, active


def fabric_v(handle, version_cls=None):
    import pynvml
    info = (version_cls or pynvml.c_nvmlGpuFabricInfoV_t)()
    pynvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
    return info.state, bytes(info.clusterUuid), info.cliqueId


def test_init_shutdown_and_uninitialized_errors():
    _, (r,) = ranks("hgx-h100-8", [(0, 0)])

    def program():
        import pynvml
        with pytest.raises(pynvml.NVMLError_Uninitialized) as e:
            pynvml.nvmlDeviceGetCount()
        assert e.value.value == pynvml.NVML_ERROR_UNINITIALIZED and str(e.value) == "Uninitialized"
        pynvml.nvmlInit()
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        n = pynvml.nvmlDeviceGetCount()              # still initialised once
        pynvml.nvmlShutdown()
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlShutdown()
        return n
    assert solo(r, program) == 8


def test_nvml_sees_every_gpu_of_the_host_whatever_cuda_sees():
    _, rs = ranks("gb200-nvl72:2", [(0, 1), (1, 2)], one_visible=True)

    def program(g):
        import pynvml
        from cuda.bindings import runtime as rt
        pynvml.nvmlInit()
        try:
            n = pynvml.nvmlDeviceGetCount()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
            uuids = [pynvml.nvmlDeviceGetUUID(h) for h in handles]
            names = {pynvml.nvmlDeviceGetName(h) for h in handles}
            cc = pynvml.nvmlDeviceGetCudaComputeCapability(handles[0])
            back = [pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(u)) for u in uuids]
            bus = [pynvml.nvmlDeviceGetPciInfo(h).busId for h in handles]
            by_bus = [pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByPciBusId(b)) for b in bus]
            fabric = [fabric_v(h) for h in handles]
            return n, rt.cudaGetDeviceCount()[1], uuids, names, cc, back, by_bus, fabric
        finally:
            pynvml.nvmlShutdown()

    outs = [o.unwrap() for o in run(rs, program)]
    for r, (n, cuda_n, uuids, names, cc, back, by_bus, fabric) in zip(rs, outs):
        host = r.cluster.host(r.host)
        assert (n, cuda_n) == (4, 1)
        assert uuids == [g.uuid for g in host.gpus]
        assert names == {"NVIDIA GB200"} and cc == (10, 0)
        assert back == by_bus == [0, 1, 2, 3]
        assert {f[0] for f in fabric} == {3}                     # COMPLETED
    # one NVLink domain: both trays report the same non-zero cluster UUID and clique
    assert outs[0][7][0][1:] == outs[1][7][0][1:] and outs[0][7][0][1] != bytes(16)
    assert outs[0][2] != outs[1][2]


@pytest.mark.parametrize("spec,state,zero_uuid", [
    ("gb200-nvl72:2", 3, False), ("hgx-h100-8", 3, True), ("l40s-8-pcie", 0, True)])
def test_fabric_info_v1_and_versioned(spec, state, zero_uuid):
    _, (r,) = ranks(spec, [(0, 0)])

    def program():
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        v1 = pynvml.c_nvmlGpuFabricInfo_t()
        pynvml.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(v1))
        v2 = fabric_v(h)
        v3 = fabric_v(h, pynvml.c_nvmlGpuFabricInfo_v3_t)
        bad = pynvml.c_nvmlGpuFabricInfoV_t()
        bad.version = 7
        with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
            pynvml.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(bad))
        pynvml.nvmlShutdown()
        return (v1.state, bytes(v1.clusterUuid), v1.cliqueId), v2, v3
    v1, v2, v3 = solo(r, program)
    assert v1 == v2 == v3
    assert v1[0] == state and (v1[1] == bytes(16)) == zero_uuid


@pytest.mark.parametrize("spec,links", [("gb200-nvl72:2", 18), ("hgx-h100-8", 18),
                                        ("a100-pcie-bridge-8", 12), ("rtx4090-8", 0),
                                        ("l40s-8-pcie", 0), ("dgx1-v100", 6)])
def test_nvlink_links_state_and_remote_ends(spec, links):
    _, (r,) = ranks(spec, [(0, 0)])

    def program():
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        summary = nvlink_summary(h)
        remote = None
        if summary[0]:
            remote = (pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(h, 0),
                      pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h, 0).busId)
            with pytest.raises(pynvml.NVMLError_InvalidArgument):
                pynvml.nvmlDeviceGetNvLinkState(h, summary[0])        # one past the last link
        else:
            with pytest.raises(pynvml.NVMLError_NotSupported):
                pynvml.nvmlDeviceGetNvLinkState(h, 0)
        peer1 = pynvml.nvmlDeviceGetPciInfo(pynvml.nvmlDeviceGetHandleByIndex(1)).busId
        pynvml.nvmlShutdown()
        return summary, remote, peer1
    (available, active), remote, peer1 = solo(r, program)
    assert available == active == links
    import pynvml
    if spec in ("gb200-nvl72:2", "hgx-h100-8"):
        assert remote[0] == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
    elif spec == "a100-pcie-bridge-8":
        assert remote == (pynvml.NVML_NVLINK_DEVICE_TYPE_GPU, peer1)    # the bridged pair


def test_a_link_down_shows_in_the_probe():
    _, (r,) = ranks("gb200-nvl72:2", [(1, 0)],
                    mutate=lambda c: c.replace_gpu(GpuRef(c.hosts[1].name, 0), nvlinks_up=False))

    def program():
        import pynvml
        pynvml.nvmlInit()
        return nvlink_summary(pynvml.nvmlDeviceGetHandleByIndex(0))
    available, active = solo(r, program)
    assert available == 18 and active == 17


@pytest.mark.parametrize("spec,nvlink,write,levels", [
    ("hgx-h100-8", 0, 0, (40, 40, 50)),
    ("rtx4090-8", 5, 5, (10, 40, 50)),
    ("l40s-8-pcie", 5, 5, (10, 40, 50)),
])
def test_p2p_status_and_common_ancestor(spec, nvlink, write, levels):
    _, (r,) = ranks(spec, [(0, 0)])

    def program():
        import pynvml
        pynvml.nvmlInit()
        h = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
        out = (pynvml.nvmlDeviceGetP2PStatus(h[0], h[1], pynvml.NVML_P2P_CAPS_INDEX_NVLINK),
               pynvml.nvmlDeviceGetP2PStatus(h[0], h[1], pynvml.NVML_P2P_CAPS_INDEX_WRITE),
               tuple(pynvml.nvmlDeviceGetTopologyCommonAncestor(h[0], h[j]) for j in (1, 2, 4)),
               pynvml.nvmlDeviceGetTopologyCommonAncestor(h[3], h[3]))
        # pynvml defines NVML_P2P_CAPS_INDEX_READ as a tuple `(0,)`: ctypes cannot pass it,
        # with the real library as here.
        with pytest.raises(ctypes.ArgumentError):
            pynvml.nvmlDeviceGetP2PStatus(h[0], h[1], pynvml.NVML_P2P_CAPS_INDEX_READ)
        return out
    assert solo(r, program) == (nvlink, write, levels, 0)


def test_memory_info_is_device_wide():
    _, rs = ranks("hgx-h100-8", [(0, 4), (0, 4)])

    def program(g):
        import pynvml
        from cuda.bindings import runtime as rt
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(4)
        before = pynvml.nvmlDeviceGetMemoryInfo(h).used
        g.barrier(tag="measured")
        if g.rank == 0:
            rt.cudaMalloc(1 << 30)
        g.barrier(tag="allocated")
        m = pynvml.nvmlDeviceGetMemoryInfo(h)
        v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        return before, m.used, m.free + m.used == m.total, v2.used
    for o in run(rs, program):
        before, used, consistent, used2 = o.unwrap()
        assert (before, used, used2) == (0, 1 << 30, 1 << 30) and consistent


def test_bad_arguments_and_unsimulated_calls():
    _, rs = ranks("gb200-nvl72:2", [(0, 0), (1, 0)])

    def program(g):
        import pynvml
        pynvml.nvmlInit()
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetHandleByIndex(4)
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(NotImplementedError, match=r"libnvidia-ml\.nvmlDeviceGetPowerUsage is not simulated"):
            pynvml.nvmlDeviceGetPowerUsage(h)
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetHandleByUUID(b"GPU-00000000-0000-0000-0000-000000000000")
        return ctypes.cast(h, ctypes.c_void_p).value
    outs = [o.unwrap() for o in run(rs, program)]
    # a handle is per host: tray 1 cannot use tray 0's
    import pynvml

    def foreign():
        h = ctypes.cast(ctypes.c_void_p(outs[0]), pynvml.c_nvmlDevice_t)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetName(h)
    solo(rs[1], foreign)
