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

from commsim.hosting.state.session import hosted
from commsim.hosting.install.patches import Patches
from commsim.hosting.install.dispatch import PerRankObject
from commsim.hosting.install.registry import register_surface

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


def _install(patches: Patches) -> None:
    # torch.cuda.nvtx._nvtx: the no-tool answers in a hosted rank, torch's own binding (or
    # stub) elsewhere.
    patches.on_import("torch.cuda.nvtx", lambda module: patches.attr(
        module, "_nvtx", PerRankObject(_NoTool, module._nvtx, hosted)))


SURFACE = register_surface("torch.cuda.nvtx", _install)
install, uninstall = SURFACE.install, SURFACE.uninstall
