"""torch.cuda.Event, torch.cuda.CUDAGraph / torch.cuda.graph and torch.cuda.stream of hosted
ranks: events on the op clock, captures through the SimDriver (CG1-CG4), replay of the
recorded ops, graph pools; then vLLM-style programs under `commsim exec` in both modes."""

from __future__ import annotations

import gc

import pytest
import torch

from hosting_helpers import PROGRAMS, hosted
from sim_ranks import module_surfaces, ranks, solo  # noqa: F401  (fixture)

pytestmark = pytest.mark.usefixtures("module_surfaces")


def _one(spec: str = "hgx-h100-8", gpu: int = 0):
    _, (r,) = ranks(spec, [(0, gpu)])
    return r


# ---- events --------------------------------------------------------------------------------

def test_event_record_query_synchronize_and_the_op_clock():
    def program():
        x = torch.zeros(8, device="cuda")
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        fresh = (start.query(), start.cuda_event, start.device)       # not created yet
        start.record()
        for _ in range(5):
            x.add_(1)
        end.record(torch.cuda.current_stream())
        end.synchronize()
        end.wait()
        torch.cuda.current_stream().wait_event(end)
        same = torch.cuda.Event(enable_timing=True)
        same.record()
        same2 = torch.cuda.Event(enable_timing=True)
        same2.record()
        return (fresh, start.query(), end.query(), start.device, start.cuda_event != 0,
                start.elapsed_time(end), same.elapsed_time(same2), end.elapsed_time(start),
                isinstance(start, torch.cuda.Event))
    fresh, q1, q2, dev, handle, ms, zero, back, kind = solo(_one(), program)
    assert fresh == (True, 0, None) and q1 and q2 and dev == torch.device("cuda", 0) and handle
    assert ms == pytest.approx(5e-3) and zero == 0.0 and back == pytest.approx(-5e-3) and kind


def test_event_errors_are_torchs():
    def program():
        msgs = []
        timing, plain = torch.cuda.Event(enable_timing=True), torch.cuda.Event()
        for exc, call in (
                (ValueError, lambda: plain.elapsed_time(timing)),       # timing checked first
                (ValueError, lambda: timing.elapsed_time(torch.cuda.Event(enable_timing=True))),
                (RuntimeError, lambda: (timing.record(), timing.record(torch.cuda.Stream(1)))),
                (NotImplementedError, lambda: torch.cuda.Event(interprocess=True).ipc_handle())):
            with pytest.raises(exc) as e:
                call()
            msgs.append(str(e.value))
        return msgs
    msgs = solo(_one(), program)
    assert msgs[0] == "Both events must be created with argument 'enable_timing=True'."
    assert msgs[1] == "Both events must be recorded before calculating elapsed time."
    assert msgs[2] == "Event device 0 does not match recording stream's device 1."
    assert "torch.cuda.Event.ipc_handle" in msgs[3] and "not simulated" in msgs[3]


def test_stream_context_sets_the_current_stream_per_device():
    def program():
        s = torch.cuda.Stream()
        other = torch.cuda.Stream(2)
        with torch.cuda.stream(s):
            inside = torch.cuda.current_stream().cuda_stream
            with torch.cuda.stream(other):
                nested = (torch.cuda.current_device(), torch.cuda.current_stream(2).cuda_stream,
                          torch.cuda.current_stream().cuda_stream)
        return (s.cuda_stream, other.cuda_stream, inside, nested,
                torch.cuda.current_stream().cuda_stream, torch.cuda.current_stream(2).cuda_stream)
    s, other, inside, nested, after0, after2 = solo(_one(), program)
    assert inside == s != 0 and nested == (0, other, s) and (after0, after2) == (0, 0)


# ---- graphs --------------------------------------------------------------------------------

def test_capture_records_writes_and_replay_runs_them():
    """On a GPU captured kernels run at replay, not at capture: the same here."""
    def program():
        x = torch.ones(4, device="cuda")
        y = torch.zeros(4, device="cuda")
        g = torch.cuda.CUDAGraph()
        before = torch.cuda.is_current_stream_capturing()
        with torch.cuda.graph(g):
            during = torch.cuda.is_current_stream_capturing()
            x.mul_(2)                       # in place: recorded, not run
            z = x + 1                       # new tensor in the graph's pool: recomputed at replay
            y.copy_(z)
            y[0] = 100.0
            w = y.to(torch.float64)         # a device-to-device copy
            v = torch.full((4,), 7.0, device="cuda")     # the fill is device work: recorded
            torch.add(v, x, out=v)          # out=: recorded
        after_capture = (x.cpu().tolist(), y.cpu().tolist())
        g.replay()
        once = (x.cpu().tolist(), y.cpu().tolist(), z.cpu().tolist(), w.cpu().tolist(),
                v.cpu().tolist())
        g.replay()
        twice = (x.cpu().tolist(), y.cpu().tolist())
        return before, during, torch.cuda.is_current_stream_capturing(), after_capture, once, twice
    before, during, after, captured, once, twice = solo(_one(), program)
    assert (before, during, after) == (False, True, False)
    assert captured == ([1.0] * 4, [0.0] * 4)
    assert once == ([2.0] * 4, [100.0, 3.0, 3.0, 3.0], [3.0] * 4, [100.0, 3.0, 3.0, 3.0],
                    [9.0] * 4)
    assert twice == ([4.0] * 4, [100.0, 5.0, 5.0, 5.0])


def test_graph_pool_holds_what_the_capture_allocated_until_reset():
    r = _one()

    def program():
        g = torch.cuda.CUDAGraph()
        x = torch.ones(256, device="cuda")
        s = torch.cuda.Stream()
        with torch.cuda.graph(g, stream=s):
            tmp = x * 3
        reserved_in_graph = torch.cuda.memory_reserved()
        pool = g.pool()
        handle = torch.cuda.graph_pool_handle()
        g2 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g2, pool=pool, stream=s):
            tmp2 = x * 4                     # shares g's pool: no new segment
        shared = torch.cuda.memory_reserved() == reserved_in_graph
        del tmp, tmp2
        gc.collect()
        torch.cuda.empty_cache()             # graph pools are not the default pool's cache
        held = torch.cuda.memory_reserved()
        g.reset()
        still = torch.cuda.memory_reserved()     # g2 still holds the pool
        g2.reset()
        gone = torch.cuda.memory_reserved()
        with pytest.raises(RuntimeError, match="replay without a preceding successful capture"):
            g.replay()
        with pytest.raises(RuntimeError, match="pool\\(\\) without a preceding successful capture"):
            g.pool()
        return pool, handle, shared, held, still, gone
    pool, handle, shared, held, still, gone = solo(r, program)
    assert pool[0] > 0 and pool[1] == 0 and handle[0] == 0 and handle[1] > 0
    assert shared and held == still == (2 << 20) * 2 and gone == 2 << 20   # x's segment stays


def test_capture_mode_and_stream_errors():
    def program():
        g = torch.cuda.CUDAGraph()
        msgs = []
        for call in (lambda: g.capture_begin(),                         # the default stream
                     lambda: torch.cuda.graph(g, capture_error_mode="sloppy").__enter__()):
            with pytest.raises(RuntimeError) as e:
                call()
            msgs.append(str(e.value))
        nothing = torch.cuda.is_current_stream_capturing()
        return msgs, nothing, torch.cuda.current_stream().cuda_stream
    msgs, nothing, stream = solo(_one(), program)
    assert msgs[0].startswith("CUDA graphs must be captured on a non-default stream.")
    assert msgs[1].startswith("Unknown capture error mode.") and "sloppy" in msgs[1]
    assert nothing is False and stream == 0       # the failed entry restored the stream


@pytest.mark.parametrize("mode,invalidated", [("global", True), ("thread_local", True),
                                              ("relaxed", False)])
def test_raw_cudamalloc_inside_the_capture_invalidates_it(mode, invalidated):
    """CG1-CG2: the program's own cudaMalloc during a GLOBAL / THREAD_LOCAL capture is
    refused (900) and the graph's exit raises torch's error for 901; RELAXED permits it. The
    allocator's own growth (new tensors in the graph pool) never invalidates."""
    r = _one()

    def program():
        from cuda.bindings import runtime as rt
        x = torch.ones(4, device="cuda")
        g = torch.cuda.CUDAGraph()
        seen = {}
        try:
            with torch.cuda.graph(g, capture_error_mode=mode):
                big = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")   # pool growth
                x.add_(1)
                err, ptr = rt.cudaMalloc(1 << 20)
                seen["malloc"] = int(err)
        except torch.AcceleratorError as e:
            seen["exit"] = str(e).splitlines()[0]
        seen["capturing"] = torch.cuda.is_current_stream_capturing()
        if "exit" not in seen:
            g.replay()
            seen["x"] = x.cpu().tolist()
        del big
        return seen
    seen = solo(r, program)
    assert seen["capturing"] is False
    if invalidated:
        assert seen == {"malloc": 900, "capturing": False,
                        "exit": "CUDA error: operation failed due to a previous error during capture"}
        assert (r.events.first_error.api, r.events.first_error.code) == ("cudaMalloc", 900)
    else:
        assert seen == {"malloc": 0, "capturing": False, "x": [2.0] * 4}


def test_host_reads_inside_a_capture_fail_naming_themselves():
    def program():
        x = torch.ones(4, device="cuda")
        g = torch.cuda.CUDAGraph()
        msgs = []
        with torch.cuda.graph(g):
            for call in (lambda: x.cpu(), lambda: x.sum().item(), lambda: x.tolist(),
                         lambda: x.copy_(torch.ones(4)), lambda: torch.tensor([1.0], device="cuda")):
                with pytest.raises(NotImplementedError) as e:
                    call()
                msgs.append(str(e.value))
        return msgs, x.cpu().tolist()
    msgs, after = solo(_one(), program)
    assert all("inside a CUDA graph capture" in m and "not simulated" in m for m in msgs), msgs
    assert after == [1.0] * 4


# ---- whole programs under `commsim exec` ---------------------------------------------------

@pytest.mark.parametrize("mode,world", [("inproc", 4), ("procs", 2)])
def test_vllm_style_capture_with_eager_ipc_setup(mode, world):
    v, res, out = hosted(PROGRAMS / "torch_graph_capture.py", "hgx-h100-8", mode=mode,
                         nproc_per_host=world)
    assert v.ok and v.exit_code == 0, v.format()
    assert sorted(res) == list(range(world)) and v.residue == 0
    for rank, d in res.items():
        assert d["after_capture"] == [rank] * 4           # the capture ran nothing
        assert d["after_replay"] == [rank + 2 * world] * 4  # two replays of += world
        assert d["peer_seen"] == 200 + (rank - 1) % world   # the left peer's write via IPC
        assert d["graph_ms"] == pytest.approx(4e-3)          # 2 replays x 2 recorded ops, 1 us each


@pytest.mark.parametrize("mode", ["inproc", "procs"])
def test_vllm_style_capture_with_lazy_ipc_setup_fails_at_the_graph_exit(mode):
    v, res, out = hosted(PROGRAMS / "torch_graph_capture.py", "hgx-h100-8", "--lazy",
                         mode=mode, nproc_per_host=2)
    assert v.exit_code == 1 and not res, v.format()
    for p in v.ranks:
        assert p.exception.startswith("torch.AcceleratorError: CUDA error: operation failed "
                                      "due to a previous error during capture"), v.format()
        e = p.first_cuda_error
        assert (e["api"], e["name"], e["code"]) == ("cudaIpcOpenMemHandle",
                                                    "cudaErrorStreamCaptureUnsupported", 900)
        assert e["site"].startswith("torch_graph_capture.py:")


@pytest.mark.parametrize("mode", ["inproc", "procs"])
def test_a_collective_inside_a_capture_fails_naming_itself(mode):
    v, res, out = hosted(PROGRAMS / "torch_graph_capture.py", "hgx-h100-8", "--all-reduce-inside",
                         mode=mode, nproc_per_host=2)
    assert v.exit_code == 1 and not res, v.format()
    for p in v.ranks:
        assert "torch.distributed.all_reduce on a CUDA tensor inside a CUDA graph capture is " \
               "not simulated" in p.exception, v.format()
