"""Stream capture as the runtime polices it (docs/lifecycle-rules.md CG1-CG4,
commsim/sim/stream_capture.py): a cudaMalloc or legacy-IPC call during a GLOBAL or
THREAD_LOCAL capture is refused and invalidates the capture; RELAXED allows it; the caching
allocator grows a graph pool in RELAXED mode as PyTorch's does; a lazy set-up inside the
workload's capture loses the graph, and one at the capture hook does not."""

from __future__ import annotations

from pathlib import Path

import pytest
from cuda.bindings import driver as cu
from cuda.bindings import runtime as cudart

from commsim.libmodels.caching_allocator import CachingAllocator
from commsim.driver import FD, alloc_prop, check
from commsim.scenario.runner import run_scenario
from commsim.scenario.schema import load
from commsim.sim import SimFabric, spawn_driver
from commsim.sim import stream_capture as SC
from commsim.topology.model import GpuRef
from commsim.topology.presets import build

E = cudart.cudaError_t
REG = Path(__file__).resolve().parents[2] / "scenarios" / "regressions" / "lazy-setup-inside-capture.toml"


@pytest.fixture
def drv():
    c = build("hgx-h100-8")
    return spawn_driver(SimFabric(c, seed=0), GpuRef(c.hosts[0].name, 0))


@pytest.mark.parametrize("mode", [SC.GLOBAL, SC.THREAD_LOCAL, int(SC.GLOBAL)])
def test_cudamalloc_during_capture_is_refused_and_invalidates_it(drv, mode):
    assert drv.cudaStreamBeginCapture(0, mode) == (E.cudaSuccess,)
    assert drv.cudaMalloc(4096) == (E.cudaErrorStreamCaptureUnsupported, None)
    assert not drv.ledger.count("allocation")            # nothing was allocated
    assert drv.cudaStreamEndCapture(0) == (E.cudaErrorStreamCaptureInvalidated, None)
    # The next capture starts clean.
    drv.cudaStreamBeginCapture(0, mode)
    err, graph = drv.cudaStreamEndCapture(0)
    assert err == E.cudaSuccess and graph


def test_relaxed_capture_or_thread_allows_cudamalloc(drv):
    drv.cudaStreamBeginCapture(0, SC.RELAXED)
    assert drv.cudaMalloc(4096)[0] == E.cudaSuccess
    assert drv.cudaStreamEndCapture(0)[0] == E.cudaSuccess
    drv.cudaStreamBeginCapture(0, SC.GLOBAL)
    assert drv.cudaThreadExchangeStreamCaptureMode(SC.RELAXED) == (E.cudaSuccess, SC.GLOBAL)
    assert drv.cudaMalloc(4096)[0] == E.cudaSuccess
    assert drv.cudaThreadExchangeStreamCaptureMode(SC.GLOBAL) == (E.cudaSuccess, SC.RELAXED)
    assert drv.cudaStreamEndCapture(0)[0] == E.cudaSuccess


def test_legacy_ipc_during_capture_is_refused_unconfirmed_code(drv):
    p = check("cudaMalloc", drv.cudaMalloc(4096))
    drv.cudaStreamBeginCapture(0, SC.GLOBAL)
    assert drv.cudaIpcGetMemHandle(p) == (E.cudaErrorStreamCaptureUnsupported, None)   # CG3
    assert drv.cudaStreamEndCapture(0)[0] == E.cudaErrorStreamCaptureInvalidated


def test_vmm_calls_are_not_refused_during_capture(drv):
    """No source says cuMem* calls are unsafe during capture: commsim does not guess one."""
    drv.cudaStreamBeginCapture(0, SC.GLOBAL)
    err, h = drv.cuMemCreate(2 << 20, alloc_prop(0, FD), 0)
    assert err == cu.CUresult.CUDA_SUCCESS
    assert drv.cudaStreamEndCapture(0)[0] == E.cudaSuccess
    drv.cuMemRelease(h)


def test_capture_misuse_answers_codes(drv):
    assert drv.cudaStreamEndCapture(0) == (E.cudaErrorIllegalState, None)      # CG4, UNCONFIRMED
    assert drv.cudaStreamBeginCapture(0, 9) == (E.cudaErrorInvalidValue,)
    drv.cudaStreamBeginCapture(0, SC.GLOBAL)
    assert drv.cudaStreamBeginCapture(0, SC.GLOBAL) == (E.cudaErrorIllegalState,)
    assert drv.cudaThreadExchangeStreamCaptureMode("relaxed") == (E.cudaErrorInvalidValue, None)


def test_the_caching_allocator_grows_a_graph_pool_in_relaxed_mode(drv):
    alloc = CachingAllocator(drv)
    pool = alloc.new_graph_pool()
    drv.cudaStreamBeginCapture(0, SC.GLOBAL)
    p = alloc.malloc(1 << 20, pool)
    assert p and drv.capture.thread_mode == SC.GLOBAL     # restored after its cudaMalloc
    assert drv.cudaStreamEndCapture(0)[0] == E.cudaSuccess
    # The same cudaMalloc made directly, as an uncached path would, loses the capture.
    drv.cudaStreamBeginCapture(0, SC.GLOBAL)
    assert drv.cudaMalloc(1 << 20)[0] == E.cudaErrorStreamCaptureUnsupported
    assert drv.cudaStreamEndCapture(0)[0] == E.cudaErrorStreamCaptureInvalidated


def test_lazy_set_up_inside_the_capture_loses_the_graph_on_every_rank():
    res = run_scenario(load(REG))
    assert res.ok, res.failures                              # as the file expects
    assert {(e.name, e.step) for e in res.errors} == {("cudaErrorStreamCaptureInvalidated", "capture")}
    assert sorted(e.rank for e in res.errors) == list(range(8))


def test_without_the_capture_rule_the_same_run_keeps_its_graph(monkeypatch: pytest.MonkeyPatch):
    """The failure comes from rule CG1: switched off, the set-up inside the capture succeeds."""
    monkeypatch.setattr(SC.StreamCapture, "refused", lambda self, api: None)
    res = run_scenario(load(REG))
    assert not res.errors and set(res.backends.values()) == {"ipc"}
