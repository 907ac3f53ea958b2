"""`torch.cuda.nvtx` in a hosted rank: NVTX markers with no tool attached.

The CPU build of torch has no NVTX (`torch.cuda.nvtx.range_push` raises "NVTX functions not
installed"), but serving code marks ranges unconditionally (`with torch.cuda.nvtx.range(...)`).
On a GPU machine the markers reach libnvToolsExt, and with no profiler attached each one is a
no-op: push and pop return NVTX_NO_PUSH_POP_TRACKING, -2, and a range start returns the id 0
(NVTX 3 nvToolsExt.h: `#define NVTX_NO_PUSH_POP_TRACKING ((int)-2)`, returned by the
push/pop entry points when no tool installed a callback). Hosted ranks run without a
profiler, so they get exactly that. Outside a hosted rank torch's own stub answers.
"""

from __future__ import annotations

from typing import Any

from commsim.hosting.state.cuda_state import maybe_rank
from commsim.hosting.install.nesting import nested
from commsim.hosting.install.registry import register_surface, when_imported

NO_PUSH_POP_TRACKING = -2
NO_RANGE_ID = 0


class _NoTool:
    """What torch's `_nvtx` binding answers with no NVTX tool attached."""

    @staticmethod
    def rangePushA(msg: str) -> int:
        return NO_PUSH_POP_TRACKING

    @staticmethod
    def rangePop() -> int:
        return NO_PUSH_POP_TRACKING

    @staticmethod
    def rangeStartA(msg: str) -> int:
        return NO_RANGE_ID

    @staticmethod
    def rangeEnd(range_id: int) -> None:
        return None

    @staticmethod
    def markA(msg: str) -> None:
        return None

    @staticmethod
    def deviceRangeStart(msg: str, stream: int = 0) -> Any:
        return None

    @staticmethod
    def deviceRangeEnd(handle: Any, stream: int = 0) -> None:
        return None


class _Dispatch:
    """torch.cuda.nvtx._nvtx while installed: the no-tool answers in a hosted rank, torch's
    own binding (or stub) elsewhere."""

    def __init__(self, real: Any):
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(_NoTool if maybe_rank() is not None else self._real, name)


_saved: list[Any] = []       # (module, real _nvtx) once patched
_active = [False]


def _patch(module: Any) -> None:
    if not _active[0] or _saved:
        return
    _saved.append((module, module._nvtx))
    module._nvtx = _Dispatch(module._nvtx)


def _install() -> None:
    _active[0] = True
    when_imported("torch.cuda.nvtx", _patch)


def _uninstall() -> None:
    _active[0] = False
    for module, real in _saved:
        module._nvtx = real
    _saved.clear()


install, uninstall = nested(_install, _uninstall)
register_surface("torch.cuda.nvtx", install, uninstall)
