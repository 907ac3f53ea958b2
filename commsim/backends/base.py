"""Backend interface, eligibility verdicts, and the shared data path over peer pointers.

A backend states what it requires (`eligibility`, from the group-agreed discovery view only),
sets up its buffers and signal flags through the Driver only, runs its kernels, registers
graph buffers when it needs to, and closes in the documented order. Set-up is collective:
after each local step the ranks vote, so a failure on one rank makes every rank roll back
together instead of leaving peers blocked in the next exchange (reference §7.4).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch

from ..discovery import GroupView
from ..driver import CudaError, Driver, check
from ..kernels import collectives as K, workspace as W

if TYPE_CHECKING:
    from ..topology.truth import GroupFacts

Mi = 1 << 20
Ki = 1 << 10


@dataclass(frozen=True)
class Eligibility:
    ok: bool
    reasons: tuple[str, ...] = ()

    @staticmethod
    def check(conds: Sequence[tuple[bool, str]]) -> "Eligibility":
        """`conds` = (holds, reason-if-not); eligible when every condition holds."""
        bad = tuple(reason for holds, reason in conds if not holds)
        return Eligibility(not bad, bad)


class SetupFailed(Exception):
    """A collective set-up step failed on some rank; every rank raises it together."""

    def __init__(self, backend: str, step: str, rank: int, error: CudaError | str):
        self.backend, self.step, self.rank, self.error = backend, step, rank, error
        ctx = getattr(error, "context", "")
        super().__init__(f"{backend} {step}: rank {rank}: {error}" + (f" [{ctx}]" if ctx else ""))


@dataclass
class Capture:
    """Buffers one `comm.capture()` recorded, per backend that needs registration."""

    buffers: list[int] = field(default_factory=list)       # graph-pool pointers (cudaMalloc)
    # ops recorded into the graph, replayed after registration: (backend, op, input, output)
    pending: list[tuple["Backend", str, Any, Any]] = field(default_factory=list)
    opened: list[int] = field(default_factory=list)        # peer IPC mappings from registration
    registered: bool = False
    released: bool = False
    error: Exception | None = None      # a rank-local failure while recording, voted at exit


class Backend(ABC):
    """A way to run collectives. A subclass declares, once, everything the rest of commsim
    reads about it (commsim/backends/registry.py), and is registered with
    `@register_backend`."""

    name = "?"
    ops: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_reduce_rmsnorm")
    needs_graph_registration = False
    # -- declarations the registry checks and the rest of commsim reads ---------------------
    order: int | None = None           # place in the default policy order, lower first
    colour: str | None = None          # plots and the sweep report
    plot_style = "-"                   # matplotlib line style in `explain --plot`
    algorithms: tuple[str, ...] = ()   # what the cost model predicts for it ...
    cost_family: str | None = None     # ... with which formulas (registry.COST_FAMILIES)
    fallback = False                   # legal on every topology (the oracle's last resort)
    # Per-call limits, read by the oracle and by `accepts`: bytes must be a multiple of
    # `alignment`, and (the gathered total for all_gather) below params[limit_param].
    limit_param: str | None = None
    default_limit = 0
    alignment = 1

    @classmethod
    def truth(cls, facts: "GroupFacts") -> str | None:
        """The oracle's rule: why the topology does not allow this backend for the group
        (commsim.topology.truth.GroupFacts), or None when it does. Restated from the sources,
        never derived from `eligibility`, so that a wrong eligibility rule shows."""
        return "declares no oracle rule"

    @classmethod
    def limit(cls, params: dict[str, Any]) -> int | None:
        """The workspace limit in bytes under `params`, or None when unlimited."""
        if cls.limit_param is None:
            return None
        return int(params.get(cls.limit_param, cls.default_limit))

    @classmethod
    def within_limits(cls, op: str, nbytes: int, ws: int, params: dict[str, Any]) -> bool:
        """The declared per-call limits (row B5 for the peer backends), as the oracle reads them."""
        if op not in cls.ops or nbytes % cls.alignment:
            return False
        cap = cls.limit(params)
        total = nbytes * ws if op == "all_gather" else nbytes
        return cap is None or total < cap

    def __init__(self, driver: Driver, group: Any, view: GroupView, params: dict[str, Any]):
        self.driver, self.group, self.view, self.params = driver, group, view, params
        self.rank, self.ws = group.rank, group.size
        self.round = 0
        self.closed = False

    # -- what it requires ------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def eligibility(cls, view: GroupView, params: dict[str, Any]) -> Eligibility:
        """Whether every rank meets the requirements, from the group-agreed view only."""

    def accepts(self, op: str, nbytes: int, dtype: str) -> tuple[bool, str]:
        """Per-call admission (size limits, alignment); (False, reason) hands over."""
        if op not in self.ops:
            return False, f"{self.name} does not implement {op}"
        return True, ""

    def algorithm(self, op: str, nbytes: int) -> str:
        return "ring"

    # -- collective set-up helpers ---------------------------------------------------------
    def vote(self, step: str, error: Exception | None) -> None:
        """All ranks learn whether `step` failed anywhere; the first failure is raised on all.
        A policy with `agree=False` reproduces libraries that decide rank-locally (before the
        AND/MAX votes of reference §7.4): the failure stops only its own rank, and the peers
        go on to the next exchange without it."""
        if not self.params.get("agree", True):
            if error is not None:
                raise SetupFailed(self.name, step, self.rank, error)
            return
        mine = None if error is None else (self.rank, error)
        errs = self.group.all_gather_object(mine, tag=f"{self.name}.{step}: vote")
        for e in errs:
            if e is not None:
                raise SetupFailed(self.name, step, e[0], e[1])

    def setup(self) -> None:
        pass

    def describe(self) -> str:
        """What set-up chose, for explanations (handle type, addresses); '' when nothing."""
        return ""

    def close(self) -> None:
        self.closed = True

    def close_barrier(self, tag: str) -> bool:
        """The barrier of a collective teardown. When the group is already broken (a peer died,
        a hang was diagnosed) nobody else will arrive: release what this rank holds anyway,
        so the ledger still returns to zero; a peer still mapping our memory is what the
        simulator then flags (row L15), which is the truth of a teardown without agreement."""
        from ..runtime.diagnosis import GroupError
        try:
            self.group.barrier(tag=tag)
            return True
        except GroupError:
            return False

    # -- the op ----------------------------------------------------------------------------
    @abstractmethod
    def run(self, op: str, x: torch.Tensor) -> torch.Tensor:
        """Run `op` on this rank's input; collective over the group."""

    def register_graph_buffers(self, cap: Capture) -> None:
        cap.registered = True

    def release_capture(self, cap: Capture) -> None:
        cap.released = True


def as_bytes(x: torch.Tensor) -> np.ndarray:
    return x.contiguous().view(torch.uint8).numpy()


class PeerBackend(Backend):
    """Data path for backends whose ranks map every peer's workspace (ipc, fabric)."""

    one_shot_limit = 0          # bytes below which all_reduce is one-shot (per subclass rule)
    limit_param, default_limit, alignment = "max_size", 8 * Mi, 16   # packed 16-byte kernels

    def __init__(self, *a: Any, **k: Any):
        super().__init__(*a, **k)
        self.capacity = self.limit(self.params)
        self.ptrs: list[int] = []         # ptrs[j] = rank j's workspace in this process's VA

    def accepts(self, op: str, nbytes: int, dtype: str) -> tuple[bool, str]:
        ok, why = super().accepts(op, nbytes, dtype)
        if not ok:
            return ok, why
        total = nbytes * self.ws if op == "all_gather" else nbytes
        if nbytes % self.alignment:
            return False, f"{nbytes} B is not a multiple of {self.alignment} (packed 16-byte kernels)"
        if total >= self.capacity:
            return False, f"{total} B >= workspace {self.capacity} B"
        return True, ""

    def _launch(self, kernel: Any, *args: Any) -> None:
        self.round += 1
        check(kernel.__name__, self.driver.launch_kernel(kernel, *args))

    def _stage(self, x: torch.Tensor) -> None:
        check("cudaMemcpy", self.driver.memcpy_htod(self.ptrs[self.rank] + W.DATA, as_bytes(x)))

    def _result(self, nbytes: int, like: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        raw = check("cudaMemcpy", self.driver.memcpy_dtoh(self.ptrs[self.rank] + W.DATA + self.capacity, nbytes))
        return torch.from_numpy(raw).view(like.dtype).reshape(shape).clone()

    def run(self, op: str, x: torch.Tensor) -> torch.Tensor:
        dtype = str(x.dtype).removeprefix("torch.")
        n, nbytes, me = x.numel(), x.numel() * x.element_size(), self.rank
        self._stage(x)
        if op == "all_gather":
            self._launch(K.all_gather, self.ptrs, me, nbytes, self.capacity, self.round + 1)
            return self._result(nbytes * self.ws, x, (self.ws * x.shape[0],) + tuple(x.shape[1:]))
        if op == "reduce_scatter":
            self._launch(K.reduce_scatter, self.ptrs, me, n, dtype, self.capacity, self.round + 1)
            per = n // self.ws
            return self._result(per * x.element_size(), x, (per,))
        kern = K.one_shot_all_reduce if self.algorithm(op, nbytes) == "one-shot" else K.two_shot_all_reduce
        self._launch(kern, self.ptrs, me, n, dtype, self.capacity, self.round + 1)
        return self._result(nbytes, x, tuple(x.shape))
