"""torch.cuda's control plane on the CPU build of torch (and a CUDA build without a driver), for hosted ranks."""

from __future__ import annotations

import threading

import pytest
import torch

from sim_ranks import module_surfaces, ranks, run, solo  # noqa: F401  (fixture)

pytestmark = pytest.mark.usefixtures("module_surfaces")


def test_outside_a_rank_torch_is_the_build_on_a_machine_without_a_driver():
    assert torch.cuda.is_available() is False and torch.cuda.device_count() == 0
    # The CPU build refuses at its lazy init; a CUDA build finds no driver there.
    refusal = ((RuntimeError, "Found no NVIDIA driver") if torch.version.cuda
               else (AssertionError, "Torch not compiled with CUDA enabled"))
    with pytest.raises(refusal[0], match=refusal[1]):
        torch.cuda.current_device()


def test_worker_setup_as_serving_stacks_do_it():
    """all GPUs visible, set_device(local_rank), then probe the device."""
    _, rs = ranks("hgx-h100-8", [(0, 0), (0, 1), (0, 2), (0, 3)])

    def program(g):
        assert torch.cuda.is_available()
        torch.cuda.set_device(g.rank)
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return (torch.cuda.device_count(), torch.cuda.current_device(),
                torch.cuda.get_device_name(), torch.cuda.get_device_capability(),
                props.total_memory, props.multi_processor_count,
                torch.cuda.can_device_access_peer(g.rank, (g.rank + 1) % 4))
    for i, o in enumerate(run(rs, program)):
        assert o.unwrap() == (8, i, "NVIDIA H100 80GB HBM3", (9, 0), 80 << 30, 132, True)


def test_one_visible_gpu_per_process_on_two_trays():
    _, rs = ranks("gb200-nvl72:2", [(0, 2), (1, 3)], one_visible=True)

    def program(g):
        torch.cuda.set_device(0)
        with pytest.raises(torch.AcceleratorError, match="^CUDA error: invalid device ordinal"):
            torch.cuda.set_device(1)
        with pytest.raises(AssertionError, match="Invalid peer device id"):
            torch.cuda.can_device_access_peer(0, 1)
        return torch.cuda.device_count(), torch.cuda.get_device_properties(0).uuid
    outs = [o.unwrap() for o in run(rs, program)]
    assert outs[0][0] == outs[1][0] == 1
    assert f"GPU-{outs[0][1]}" == rs[0].cluster.host(rs[0].host).gpus[2].uuid
    assert f"GPU-{outs[1][1]}" == rs[1].cluster.host(rs[1].host).gpus[3].uuid


def test_device_uuid_is_torchs_cuuuid_and_names_the_device_to_nvml():
    """torch's `_CUuuid`: str() without NVML's `GPU-` prefix, `.bytes` a list of 16 ints
    (torch/csrc/cuda/Module.cpp, registerCudaDeviceProperties). FlashInfer's PCIe probe asks
    NVML for `f"GPU-{props.uuid}"`: a served str with the prefix made that NotFound."""
    import re

    import pynvml
    from cuda.bindings import runtime as rt
    _, rs = ranks("hgx-h100-8", [(0, 5)], one_visible=True)

    def program(g):
        props = torch.cuda.get_device_properties(0)
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{props.uuid}")
            bus = pynvml.nvmlDeviceGetPciInfo(handle).bus
        finally:
            pynvml.nvmlShutdown()
        _, p = rt.cudaGetDeviceProperties(0)
        return props, bus, bytes(p.uuid.bytes)
    props, bus, runtime_bytes = solo(rs[0], lambda: program(None))
    uuid = props.uuid
    assert type(uuid).__name__ == "_CUuuid" and type(uuid).__module__ == "torch._C"
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", str(uuid))
    assert f"GPU-{uuid}" == rs[0].cluster.host(rs[0].host).gpus[5].uuid
    assert uuid.bytes == list(runtime_bytes) and len(uuid.bytes) == 16
    assert f"uuid={uuid}," in repr(props)
    assert bus == props.pci_bus_id        # NVML's handle is the GPU torch calls device 0


@pytest.mark.parametrize("spec,peer", [("rtx4090-8", False), ("l40s-8-pcie", False),
                                       ("hgx-h100-8", True)])
def test_peer_access_follows_the_machine(spec, peer):
    _, (r,) = ranks(spec, [(0, 0)])
    assert solo(r, lambda: torch.cuda.can_device_access_peer(0, 1)) is peer


def test_device_context_streams_synchronize_and_mem_get_info():
    _, (r,) = ranks("gb200-nvl72:1", [(0, 0)])

    def program():
        from cuda.bindings import runtime as rt
        from cuda.bindings import driver as cu
        assert torch.cuda.is_available() and torch.cuda.device_count() == 4
        cu.cuInit(0)
        # device queries initialise neither torch nor a CUDA context (programming guide)
        assert torch.cuda.is_initialized() is False
        assert cu.cuCtxGetDevice()[0] == cu.CUresult.CUDA_ERROR_INVALID_CONTEXT
        torch.cuda.init()
        assert torch.cuda.is_initialized() and int(cu.cuCtxGetDevice()[1]) == 0
        with torch.cuda.device(3):
            inside = torch.cuda.current_device()
            s = torch.cuda.Stream()
            torch.cuda.synchronize()
        after = torch.cuda.current_device()
        default = torch.cuda.current_stream()
        s.synchronize()
        free0, total = torch.cuda.mem_get_info(3)
        rt.cudaSetDevice(3)
        rt.cudaMalloc(1 << 30)
        free1, _ = torch.cuda.mem_get_info("cuda:3")
        destroyed = rt.cudaStreamDestroy(s.cuda_stream)[0]
        return (inside, after, s.device_index, s.cuda_stream != 0, default.cuda_stream,
                isinstance(s, torch.cuda.Stream), total, free0 - free1, int(destroyed))
    out = solo(r, program)
    assert out == (3, 0, 3, True, 0, True, 186 << 30, 1 << 30, 0)


def test_other_threads_keep_cpu_torch():
    _, (r,) = ranks("hgx-h100-8", [(0, 0)])
    seen = {}

    def program():
        t = threading.Thread(target=lambda: seen.setdefault("avail", torch.cuda.is_available()))
        t.start()
        t.join()
        return torch.cuda.is_available()
    assert solo(r, program) is True and seen["avail"] is False


def test_cuda_tensors_only_inside_a_rank():
    """Outside a hosted rank the CPU build makes no CUDA tensor; inside, it is the rank's."""
    _, (r,) = ranks("hgx-h100-8", [(0, 0)])
    with pytest.raises((AssertionError, RuntimeError)):
        torch.empty(4, device="cuda")
    t = solo(r, lambda: torch.empty(4, device="cuda"))
    assert t.is_cuda and t.device == torch.device("cuda", 0)


def test_unsimulated_torch_cuda_fails_loudly_and_seeding_still_works():
    _, (r,) = ranks("hgx-h100-8", [(0, 1)])

    def program():
        torch.cuda.set_device(1)
        torch.manual_seed(1234)            # calls torch.cuda.manual_seed_all: harmless
        for call in (torch.cuda.utilization, torch.cuda.set_sync_debug_mode, torch.cuda.MemPool,
                     lambda: torch.cuda.make_graphed_callables(lambda x: x, (torch.ones(1),))):
            with pytest.raises(NotImplementedError, match=r"commsim hosting: torch\.cuda\.\w+ is not simulated"):
                call()
        return torch.rand(1).item()
    torch.manual_seed(1234)
    expected = torch.rand(1).item()
    assert solo(r, program) == expected
    assert torch.cuda.memory_allocated() == 0        # outside a rank: CPU torch's answer
