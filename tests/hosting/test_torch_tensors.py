"""CUDA tensors of hosted ranks on the CPU build of torch: factories, the simulated device
memory behind them, ops, device errors, what is refused; then whole programs under
`commsim exec` in both modes."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from commsim.hosting.surfaces.torch.tensors import HostedCudaTensor, inner_of
from commsim.sim.pointers import pointer_info
from hosting_helpers import PROGRAMS, hosted
from sim_ranks import module_surfaces, ranks, solo  # noqa: F401  (fixture)

pytestmark = pytest.mark.usefixtures("module_surfaces")


def _one(spec: str = "hgx-h100-8", gpu: int = 0):
    _, (r,) = ranks(spec, [(0, gpu)])
    return r


@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda", 0), 0, "current"])
def test_every_factory_makes_a_tensor_on_the_device(device):
    def program():
        d = torch.cuda.current_device() if device == "current" else device
        made = [torch.empty(3, device=d), torch.zeros(3, device=d), torch.ones(3, device=d),
                torch.full((3,), 2.5, device=d), torch.rand(3, device=d), torch.randn(3, device=d),
                torch.randint(0, 9, (3,), device=d), torch.arange(3, device=d),
                torch.tensor([1.0, 2.0, 3.0], device=d), torch.empty_strided((3,), (1,), device=d),
                torch.empty_like(torch.ones(3), device=d), torch.zeros_like(torch.ones(3), device=d),
                torch.ones_like(torch.ones(3), device=d), torch.full_like(torch.ones(3), 7, device=d),
                torch.ones(3).cuda(), torch.ones(3).to("cuda"), torch.ones(3).to(device=d)]
        return [(t.device, t.is_cuda, type(t) is HostedCudaTensor) for t in made], \
            made[1].tolist(), made[3].cpu().tolist(), made[7].cpu().tolist()
    kinds, zeros, full, ar = solo(_one(), program)
    assert set(kinds) == {(torch.device("cuda", 0), True, True)}
    assert zeros == [0.0] * 3 and full == [2.5] * 3 and ar == [0, 1, 2]


def test_current_device_and_explicit_index():
    def program():
        torch.cuda.set_device(2)
        a = torch.zeros(2, device="cuda")
        b = torch.zeros(2, device="cuda:5")
        c = a.to("cuda:1")
        with torch.device("cuda"):
            d = torch.ones(2)
        return a.device, b.device, c.device, d.device, torch.ones(1).cuda(3).get_device()
    assert solo(_one(), program) == (torch.device("cuda", 2), torch.device("cuda", 5),
                                     torch.device("cuda", 1), torch.device("cuda", 2), 3)


def test_storage_is_the_simulated_device_memory():
    """data_ptr is a device address of a cudaMalloc segment; torch writes what the driver
    reads there and reads what the driver writes, with no copy in between."""
    r = _one()

    def program():
        from cuda.bindings import runtime as rt
        t = torch.zeros(1024, dtype=torch.float32, device="cuda")
        info = pointer_info(r.driver, t.data_ptr())
        t.copy_(torch.arange(1024, dtype=torch.float32))
        err, raw = r.driver.memcpy_dtoh(t.data_ptr(), t.nbytes)
        seen_by_driver = np.frombuffer(raw.tobytes(), np.float32).copy()
        rt.cudaMemset(t.data_ptr() + 4 * 10, 0, 4 * 5)        # through cuda-python
        return info, seen_by_driver, t[8:16].cpu().tolist()
    info, by_driver, after = solo(r, program)
    assert info is not None and info.kind == "malloc" and info.ordinal == 0
    assert (by_driver == np.arange(1024)).all()
    assert after == [8.0, 9.0, 0.0, 0.0, 0.0, 0.0, 0.0, 15.0]


def test_data_ptr_arithmetic_follows_storage_offsets():
    def program():
        base = torch.zeros(64, dtype=torch.float64, device="cuda")
        s, g = base[10:], base.view(8, 8)[2:, 3:]
        u8 = base.view(torch.uint8)[5:]
        return (s.data_ptr() - base.data_ptr(), s.storage_offset(),
                g.data_ptr() - base.data_ptr(), g.storage_offset(),
                u8.data_ptr() - base.data_ptr(), torch.empty(0, device="cuda").data_ptr())
    assert solo(_one(), program) == (80, 10, 19 * 8, 19, 5, 0)


def test_storage_and_copies():
    def program():
        import copy
        x = torch.arange(8, dtype=torch.int32, device="cuda")
        st, sub = x.untyped_storage(), x[3:].untyped_storage()
        y = copy.deepcopy(x)
        x.fill_(1)
        return (st.data_ptr() == x.data_ptr() == sub.data_ptr(), st.nbytes(), sub.device,
                y.device, y.cpu().tolist(), y.data_ptr() != x.data_ptr(), x.is_shared())
    assert solo(_one(), program) == (True, 32, torch.device("cuda", 0), torch.device("cuda", 0),
                                     list(range(8)), True, True)


def test_ops_run_on_the_same_bytes_and_stay_on_the_device():
    def program():
        x = torch.arange(6, dtype=torch.float32, device="cuda:1")
        view = x.view(2, 3)
        view.mul_(2)                                   # in place through a view
        y = torch.where(x > 4, x, 0.0) + 1             # a composite op making a scalar tensor
        z = x.view(2, 3).t().contiguous()
        m = x[x > 2]
        return (x.cpu().tolist(), y.device, y.cpu().tolist(), z.cpu().tolist(), m.tolist(),
                float(x.sum()), f"{x.max():.1f}", repr(x))
    xs, ydev, ys, zs, ms, total, mx, text = solo(_one(), program)
    assert xs == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0] and ydev == torch.device("cuda", 1)
    assert ys == [1.0, 1.0, 1.0, 7.0, 9.0, 11.0] and zs == [[0.0, 6.0], [2.0, 8.0], [4.0, 10.0]]
    assert ms == [4.0, 6.0, 8.0, 10.0] and total == 30.0 and mx == "10.0"
    assert text == "tensor([ 0.,  2.,  4.,  6.,  8., 10.], device='cuda:1')"


def test_mixed_devices_raise_torchs_error():
    def program():
        x = torch.ones(4, device="cuda")
        out = []
        for call in (lambda: x + torch.ones(4), lambda: torch.ones(4) * x,
                     lambda: x + x.to("cuda:1")):
            with pytest.raises(RuntimeError) as e:
                call()
            out.append(str(e.value))
        ok = (x + torch.tensor(2.0)).cpu().tolist()    # a CPU scalar tensor mixes, as in torch
        x[torch.tensor([0, 1])] = torch.zeros(2)       # CPU indices and values: a copy
        return out, ok, x.cpu().tolist()
    msgs, ok, after = solo(_one(), program)
    head = "Expected all tensors to be on the same device, but found at least two devices, "
    assert msgs == [head + "cuda:0 and cpu!", head + "cpu and cuda:0!", head + "cuda:0 and cuda:1!"]
    assert ok == [3.0] * 4 and after == [0.0, 0.0, 1.0, 1.0]


def test_what_is_not_simulated_fails_naming_itself():
    lib = torch.library.Library("commsim_test_ext", "DEF")      # a compiled extension's op
    lib.define("scale(Tensor x) -> Tensor")
    lib.impl("scale", lambda x: x * 2, "CPU")

    def program():
        x = torch.ones(2, device="cuda")
        msgs = []
        for exc, call in ((NotImplementedError, lambda: torch.ops.commsim_test_ext.scale(x)),
                          (NotImplementedError, lambda: torch.ones(2).pin_memory()),
                          (NotImplementedError, lambda: x.requires_grad_() * 2),
                          (TypeError, lambda: x.numpy()),
                          (NotImplementedError, lambda: torch.utils.dlpack.to_dlpack(x)),
                          (torch.AcceleratorError, lambda: torch.zeros(1, device="cuda:8")),
                          (torch.AcceleratorError, lambda: x.to("cuda:9")),
                          (torch.AcceleratorError, lambda: x.new_zeros(1, device="cuda:8"))):
            with pytest.raises(exc) as e:
                call()
            msgs.append(str(e.value).splitlines()[0])
        return msgs, torch.ops.commsim_test_ext.scale(torch.ones(1)).tolist()
    msgs, cpu_ok = solo(_one(), program)
    assert "commsim_test_ext.scale" in msgs[0] and "not simulated" in msgs[0]
    assert "pinned host memory" in msgs[1] and "autograd" in msgs[2] and "aten.mul" in msgs[2]
    assert msgs[3] == ("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() "
                       "to copy the tensor to host memory first.")
    assert "DLPack" in msgs[4]
    assert msgs[5:] == ["CUDA error: invalid device ordinal"] * 3 and cpu_ok == [2.0]


def test_blocks_return_to_the_caching_allocator_and_empty_cache_frees_segments():
    r = _one()

    def program():
        used0 = r.driver.bytes_used(r.driver.device)
        a = torch.empty(1000, dtype=torch.uint8, device="cuda")
        p, held = a.data_ptr(), torch.cuda.memory_allocated()
        reserved = torch.cuda.memory_reserved()
        del a
        gc.collect()
        freed = torch.cuda.memory_allocated()
        b = torch.empty(1000, dtype=torch.uint8, device="cuda")      # the same block again
        again = b.data_ptr() == p
        del b
        gc.collect()
        torch.cuda.empty_cache()
        return (held, reserved, freed, again, torch.cuda.memory_reserved(),
                torch.cuda.max_memory_allocated(), r.driver.bytes_used(r.driver.device) - used0)
    held, reserved, freed, again, after, peak, used = solo(r, program)
    assert (held, reserved, freed, again) == (1024, 2 << 20, 0, True)
    assert after == 0 and peak == 1024 and used == 0


def test_out_of_memory_is_torchs_error():
    def program():
        with pytest.raises(torch.OutOfMemoryError, match="CUDA out of memory. Tried to allocate 100.00 GiB"):
            torch.empty(100 << 30, dtype=torch.uint8, device="cuda")
        return True
    assert solo(_one(), program)


def test_outside_a_rank_nothing_changes():
    with pytest.raises((AssertionError, RuntimeError), match="not compiled with CUDA|CUDA|no NVIDIA driver"):
        torch.zeros(2, device="cuda")
    t = torch.zeros(2)
    assert type(t) is torch.Tensor and t.device.type == "cpu"
    assert (t + 1).numpy().tolist() == [1.0, 1.0]
    assert type(inner_of(t)) is torch.Tensor


# ---- whole programs under `commsim exec` ---------------------------------------------------

@pytest.mark.parametrize("mode,world", [("inproc", 4), ("procs", 2)])
def test_vllm_style_ipc_of_torch_buffers_on_one_node(mode, world):
    v, res, out = hosted(PROGRAMS / "torch_ipc_buffer.py", "hgx-h100-8", mode=mode,
                         nproc_per_host=world)
    assert v.ok and v.exit_code == 0, v.format()
    assert sorted(res) == list(range(world)) and v.residue == 0
    for rank, d in res.items():
        assert d["peers_agree"], d                       # peers' torch writes read via IPC
        assert d["seen"] == [200 + (rank - 1) % world] * 16   # the left peer's IPC write, via torch
        assert d["offset"] == d["ptr"] - d["pad"] == 512  # inside a caching-allocator segment


@pytest.mark.parametrize("mode", ["inproc", "procs"])
def test_vllm_style_ipc_of_torch_buffers_dies_across_two_trays(mode):
    v, res, out = hosted(PROGRAMS / "torch_ipc_buffer.py", "gb200-nvl72:2", mode=mode,
                         nproc_per_host=1, visible="one")
    assert v.exit_code == 1 and not res
    for p in v.ranks:
        assert p.exception == "RuntimeError: CUDART error: invalid resource handle", v.format()
        e = p.first_cuda_error
        assert (e["api"], e["name"], e["code"]) == ("cudaIpcOpenMemHandle",
                                                    "cudaErrorInvalidResourceHandle", 400)
        assert e["site"].startswith("torch_ipc_buffer.py:")


@pytest.mark.parametrize("mode", ["inproc", "procs"])
def test_collectives_on_cuda_tensors_in_place(mode):
    v, res, out = hosted(PROGRAMS / "torch_cuda_tensors.py", "hgx-h100-8", mode=mode,
                         nproc_per_host=2)
    assert v.ok, v.format()
    head = "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, "
    for rank, d in res.items():
        assert d["device"] == f"cuda:{rank}" and d["is_cuda"]
        assert d["errors"]["mixed"] == head + f"cuda:{rank} and cpu!"
        assert d["errors"]["numpy"].startswith(f"TypeError: can't convert cuda:{rank} device type")
        assert (d["slice_delta"], d["slice_offset"]) == (40, 10)
        assert (d["grid_delta"], d["grid_offset"]) == (76, 19)
        assert d["repr"] == f"tensor([6., 6., 6.], device='cuda:{rank}', dtype=torch.float16)"
        assert d["allocated"] > 0


def test_a_thread_of_a_process_rank_allocates_through_torchs_own_path():
    """A thread has no torch function mode of its own: torch's C++ factory path reaches the
    CUDA kernels this surface registers (procs mode: the process is the rank)."""
    import threading

    from commsim.hosting.state import session
    r = _one()
    seen = {}

    def body():
        t = torch.zeros(3, device="cuda:1")
        seen["t"] = (type(t) is HostedCudaTensor, t.device, t.cpu().tolist(),
                     pointer_info(r.driver, t.data_ptr()) is not None)
    session.set_process_rank(r)
    try:
        th = threading.Thread(target=body)
        th.start()
        th.join()
    finally:
        session.set_process_rank(None)
    assert seen["t"] == (True, torch.device("cuda", 1), [0.0, 0.0, 0.0], True)
