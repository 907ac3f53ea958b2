"""torch.cuda's memory API, torch.accelerator, NVTX markers and the smaller torch.cuda calls
in hosted ranks: each answers from the rank's simulated allocator and devices, and each is
torch's own outside a hosted rank."""

from __future__ import annotations

import pytest
import torch

from commsim.libmodels.caching_allocator import LARGE_BUFFER, SMALL_BUFFER
from hosting_helpers import PROGRAMS, hosted
from sim_ranks import module_surfaces, ranks, solo  # noqa: F401  (fixture)

pytestmark = pytest.mark.usefixtures("module_surfaces")
MiB = 1 << 20


def _one(preset: str = "hgx-h100-8", gpu: int = 0):
    _, (r,) = ranks(preset, [(0, gpu)])
    return r


def test_memory_stats_follow_the_tensors():
    def program():
        torch.cuda.set_device(1)
        a = torch.empty(1000, dtype=torch.uint8, device="cuda")
        b = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
        s = torch.cuda.memory_stats()
        del b
        after = (torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated(),
                 torch.cuda.memory_reserved(), torch.cuda.max_memory_reserved())
        torch.cuda.reset_peak_memory_stats()
        peak = torch.cuda.max_memory_allocated()
        free, total = torch.cuda.mem_get_info()
        other = torch.cuda.memory_stats(0)
        summary = torch.cuda.memory_summary()
        snap = torch.cuda.memory_snapshot()
        del a
        return s, after, peak, free, total, other, summary, snap
    s, after, peak, free, total, other, summary, snap = solo(_one(), program)
    assert s["allocated_bytes.all.current"] == 1024 + 3 * MiB
    assert s["requested_bytes.small_pool.current"] == 1000
    assert s["reserved_bytes.all.current"] == SMALL_BUFFER + LARGE_BUFFER
    assert s["num_alloc_retries"] == 0 and s["num_ooms"] == 0 and s["segment.all.current"] == 2
    assert list(s) == sorted(s)                                   # torch sorts the flat keys
    assert after == (1024, 1024 + 3 * MiB, SMALL_BUFFER + LARGE_BUFFER, SMALL_BUFFER + LARGE_BUFFER)
    assert peak == 1024
    assert total - free >= SMALL_BUFFER + LARGE_BUFFER           # the driver saw the segments
    assert other["allocated_bytes.all.current"] == 0               # device 0 untouched
    assert "PyTorch CUDA memory summary, device ID 1" in summary
    assert sorted((x["device"], x["segment_type"], x["allocated_size"]) for x in snap) == \
        [(1, "large", 0), (1, "small", 1024)]


def test_memory_fraction_caps_the_allocator_with_torchs_checks():
    def program():
        with pytest.raises(TypeError, match="must be `float`"):
            torch.cuda.set_per_process_memory_fraction(1)
        with pytest.raises(ValueError, match="Allowed range: 0~1"):
            torch.cuda.set_per_process_memory_fraction(1.5)
        torch.cuda.set_per_process_memory_fraction(0.0005)        # 40 MiB of 80 GiB
        x = torch.empty(16 * MiB, dtype=torch.uint8, device="cuda")
        with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate 64.00 MiB"):
            torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
        del x
        return torch.cuda.get_per_process_memory_fraction(), torch.cuda.memory_stats()
    fraction, s = solo(_one(), program)
    assert fraction == 0.0005
    assert s["num_ooms"] == 1 and s["reserved_bytes.all.peak"] <= int(0.0005 * 80 * (1 << 30))


def test_raw_allocator_blocks():
    def program():
        p = torch.cuda.caching_allocator_alloc(4096)
        inside = torch.cuda.memory_allocated()
        torch.cuda.caching_allocator_delete(p)
        with pytest.raises(RuntimeError, match=f"invalid device pointer: {p:#x}"):
            torch.cuda.caching_allocator_delete(p)
        with pytest.raises(TypeError, match="Invalid type for stream"):
            torch.cuda.caching_allocator_alloc(16, stream="s")
        return p, inside, torch.cuda.memory_allocated(), torch.cuda.get_allocator_backend()
    p, inside, after, backend = solo(_one(), program)
    assert p > 0 and inside == 4096 and after == 0 and backend == "native"


def test_accelerator_answers_as_a_cuda_host():
    def program():
        acc = torch.accelerator
        out = (acc.current_accelerator(), acc.device_count(), acc.is_available())
        acc.set_device_index(3)
        with acc.device_index(5):
            inner = acc.current_device_index()
        t = torch.empty(2048, dtype=torch.uint8, device="cuda")
        stats = (acc.memory_allocated(), acc.memory_stats()["allocated_bytes.all.current"],
                 acc.get_memory_info()[1])
        del t
        return out, acc.current_device_index(), inner, stats
    out, idx, inner, stats = solo(_one(), program)
    assert out == (torch.device("cuda"), 8, True)
    assert idx == 3 and inner == 5
    assert stats == (2048, 2048, 80 * (1 << 30))


def test_small_torch_cuda_calls():
    def program():
        t = torch.empty(4, device="cuda:2")
        with torch.cuda.device_of(t):
            inside = torch.cuda.current_device()
        with torch.cuda.device_of(torch.empty(1)):               # a CPU tensor: no change
            cpu_inside = torch.cuda.current_device()
        err, s = __import__("cuda.bindings.runtime", fromlist=["x"]).cudaStreamCreate()
        ext = torch.cuda.ExternalStream(int(s))
        t.record_stream(ext)
        with pytest.raises(TypeError, match="must be Stream, not int"):
            t.record_stream(5)
        marks = (torch.cuda.nvtx.range_push("x"), torch.cuda.nvtx.range_pop(),
                 torch.cuda.nvtx.range_start("y"))
        with torch.cuda.nvtx.range("z"):
            pass
        torch.cuda.ipc_collect()
        return (inside, cpu_inside, int(err), ext.cuda_stream == int(s), marks,
                torch.cuda.is_bf16_supported(), torch.cuda.is_tf32_supported(),
                torch.cuda.get_arch_list())
    inside, cpu_inside, err, same, marks, bf16, tf32, archs = solo(_one(), program)
    assert (inside, cpu_inside, err, same) == (2, 0, 0, True)
    assert marks == (-2, -2, 0)                  # NVTX with no tool attached
    assert bf16 and tf32 and "sm_90" in archs


def test_bf16_follows_the_device_generation():
    def program():
        return (torch.cuda.is_bf16_supported(including_emulation=False),
                torch.cuda.is_bf16_supported(), torch.cuda.is_tf32_supported())
    # V100 (sm_70): no native bfloat16 or TF32; emulated bfloat16 (a tensor can be made).
    assert solo(_one("dgx1-v100"), program) == (False, True, False)


@pytest.mark.skipif(torch.version.cuda is not None, reason="the CPU build's own answers; a CUDA "
                    "build's differ outside a rank (docs/hosting.md, 'CPU and CUDA builds of torch')")
def test_outside_a_hosted_rank_torch_answers():
    assert torch.accelerator.current_accelerator() is None
    assert torch.cuda.get_arch_list() == [] and torch.cuda.is_bf16_supported() is False
    with pytest.raises(RuntimeError, match="NVTX functions not installed"):
        torch.cuda.nvtx.range_push("x")


@pytest.mark.parametrize("mode", ["inproc", "procs"])
def test_a_memory_profiling_program_runs_in_both_modes(mode):
    v, res, _ = hosted(PROGRAMS / "memory_profile.py", "hgx-h100-8", mode=mode, nproc_per_host=2)
    assert v.ok, v.format()
    assert sorted(res) == [0, 1]
    for r in res.values():
        assert r["peak"] >= r["weights"] + r["activations"] > 0
        assert r["kv_blocks"] > 0 and r["oom_caught"]
