"""Stream capture as the CUDA runtime polices it (docs/lifecycle-rules.md CG1-CG4).

One simulated process holds one capture sequence at a time: the workload's CUDA-graph capture
(`torch.cuda.graph` in the user's code, `[workload] graph_capture` in a scenario), begun and
ended on the rank's stream by the scenario runner. While it runs, the runtime refuses the
"potentially unsafe" calls of the capturing thread, and the refusal invalidates the capture:

    CG1  cudaStreamBeginCapture(mode GLOBAL or THREAD_LOCAL), then cudaMalloc on the same
         thread (whose own capture-interaction mode, cudaThreadExchangeStreamCaptureMode, is
         not RELAXED): cudaErrorStreamCaptureUnsupported (900, "operation not permitted when
         stream is capturing"). Source: CUDA runtime API, cudaThreadExchangeStreamCaptureMode
         ("During stream capture ... some actions, such as a call to cudaMalloc, may be
         unsafe"; mode GLOBAL / THREAD_LOCAL: "this thread is prohibited from potentially
         unsafe API calls"; RELAXED: not prohibited) and cudaStreamBeginCapture. PyTorch's
         caching allocator shows it: `cudaMallocMaybeCapturing` switches the thread to RELAXED
         around its own cudaMalloc while a capture is underway, and its uncached path calls
         cudaMalloc directly "to force an error if someone tries to use forceUncachedAllocator
         while capturing" (c10/cuda/CUDACachingAllocator.cpp).
    CG2  The refused call invalidates the capture sequence: cudaStreamEndCapture returns no
         graph and cudaErrorStreamCaptureInvalidated (901, "operation failed due to a
         previous error during capture"). Source: cudaStreamEndCapture ("If capture was
         invalidated, due to a violation of the rules of stream capture, then a NULL graph
         will be returned"); the 901 code: cudaError_t docs ("The current capture sequence on
         the stream has been invalidated due to a previous error"); vllm-project/vllm#48053
         (vLLM captures in the default GLOBAL mode, under which unsafe work invalidates the
         capture). Work enqueued into the invalidated capture also answers 901 on real CUDA;
         commsim's captured ops are recorded, not enqueued, so the invalidation surfaces at the
         capture's end.
    CG3  Legacy IPC calls (cudaIpcGetMemHandle, cudaIpcOpenMemHandle) are treated as unsafe
         the same way: **UNCONFIRMED** (no source lists them; they create or export mappings
         outside any stream, as cudaMalloc does). Their code is in unconfirmed.UNCONFIRMED.
    CG4  cudaStreamBeginCapture while a capture is underway, or cudaStreamEndCapture without
         one: cudaErrorIllegalState. **UNCONFIRMED** (the docs say capture "may only be
         initiated if the stream is not already in capture mode" and "must have been
         initiated", without the code).

The VMM calls (cuMemCreate, cuMemMap, ...) are not refused: no source says whether they are
unsafe during capture, and commsim does not guess a failure where none is documented.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cuda.bindings import runtime as cudart

from commsim.sim import unconfirmed

E = cudart.cudaError_t
MODE = cudart.cudaStreamCaptureMode
GLOBAL = MODE.cudaStreamCaptureModeGlobal
THREAD_LOCAL = MODE.cudaStreamCaptureModeThreadLocal
RELAXED = MODE.cudaStreamCaptureModeRelaxed

# The calls refused during a capture that is not RELAXED, with the rule that says so.
UNSAFE = {"cudaMalloc": "CG1", "cudaIpcGetMemHandle": "CG3", "cudaIpcOpenMemHandle": "CG3"}


def as_mode(mode: Any) -> Any:
    """A cudaStreamCaptureMode from the enum or its int; None for anything else."""
    try:
        return MODE(int(mode))
    except (TypeError, ValueError):
        return None


@dataclass
class StreamCapture:
    """The capture state of one simulated process (its one capturing thread)."""

    mode: Any = None            # the ongoing capture's mode; None: no capture underway
    thread_mode: Any = GLOBAL   # the thread's capture-interaction mode (default GLOBAL)
    invalidated_by: str = ""    # the refused call that invalidated the ongoing capture

    def refused(self, api: str) -> Any:
        """The code `api` answers now, or None when it may run (CG1, CG3). A refusal
        invalidates the ongoing capture (CG2)."""
        if api not in UNSAFE or self.mode is None or RELAXED in (self.mode, self.thread_mode):
            return None
        self.invalidated_by = self.invalidated_by or api
        if UNSAFE[api] == "CG3":
            return unconfirmed.code("CG3")
        return E.cudaErrorStreamCaptureUnsupported

    def begin(self, mode: Any) -> Any:
        """cudaStreamBeginCapture's answer (None: success)."""
        m = as_mode(mode)
        if m is None:
            return E.cudaErrorInvalidValue
        if self.mode is not None:
            return unconfirmed.code("CG4")
        self.mode, self.invalidated_by = m, ""
        return None

    def end(self) -> Any:
        """cudaStreamEndCapture's answer (None: success, a graph comes back)."""
        if self.mode is None:
            return unconfirmed.code("CG4")
        self.mode = None
        return E.cudaErrorStreamCaptureInvalidated if self.invalidated_by else None

    def exchange(self, mode: Any) -> Any:
        """cudaThreadExchangeStreamCaptureMode: set the thread's mode, return the old one
        (None for a value that is no mode: cudaErrorInvalidValue)."""
        m = as_mode(mode)
        if m is None:
            return None
        old, self.thread_mode = self.thread_mode, m
        return old

