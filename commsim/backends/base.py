"""Backend interface, eligibility verdicts, and the shared data path over peer pointers.

A backend states what it requires (`eligibility`, from the group-agreed discovery view only),
sets up its buffers and signal flags through the Driver only, runs its kernels, registers
graph buffers when it needs to, and closes in the documented order. Set-up is collective:
after each local step the ranks vote, so a failure on one rank makes every rank roll back
together instead of leaving peers blocked in the next exchange.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from commsim.discovery import GroupView
from commsim.driver import CudaError, Driver, check
from commsim.kernels import collectives as K, workspace as W
from commsim.runtime.diagnosis import GroupError

# torch only where a tensor is handled (run, staging): the launcher of `exec` imports the
# backends (the registry, the policy) and never runs one.
if TYPE_CHECKING:
    import torch

    from commsim.topology.truth import GroupFacts

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


def kernel_width(view: GroupView) -> tuple[bool, str]:
    """Every backend with commsim's own kernels (ipc, fabric, multicast, symm) takes at most
    W.MAX_RANKS ranks: a flag slot per rank in each flag array of the workspace, and the peer
    table the CUDA kernels take by value (device/kernels/commsim_common.cuh). A larger group
    falls back to nccl; before this condition, ranks past 128 wrote into the next flag array
    and a 576-rank barrier hung."""
    return (view.size <= W.MAX_RANKS,
            f"{view.size} ranks > {W.MAX_RANKS}: the kernels hold one flag slot per rank for "
            f"{W.MAX_RANKS} ranks")


class SetupFailed(Exception):
    """A collective set-up step failed on some rank; every rank raises it together."""

    def __init__(self, backend: str, step: str, rank: int, error: CudaError | str):
        self.backend, self.step, self.rank, self.error = backend, step, rank, error
        ctx = getattr(error, "context", "")
        super().__init__(f"{backend} {step}: rank {rank}: {error}" + (f" [{ctx}]" if ctx else ""))


class WorkspaceTooSmall(RuntimeError):
    """The library's refusal of a forced algorithm whose workspace was sized for its own
    choice (rule AW1 of docs/lifecycle-rules.md; the exact text is UNCONFIRMED)."""


@dataclass
class Capture:
    """Buffers one `comm.capture()` recorded, per backend that needs registration."""

    buffers: list[int] = field(default_factory=list)       # graph-pool pointers (caching allocator)
    pool: Any = None                                       # the graph's private allocator pool
    # ops recorded into the graph, replayed after registration: (backend, op, input, output)
    pending: list[tuple["Backend", str, Any, Any]] = field(default_factory=list)
    opened: list[int] = field(default_factory=list)        # peer IPC mappings from registration
    peer_ptrs: list[int] = field(default_factory=list)     # peers' buffers: mapped base + offset
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
    # The most ranks the backend's kernels take (None: any); see kernel_width.
    max_ranks: int | None = None

    @classmethod
    def truth(cls, facts: "GroupFacts") -> str | None:
        """The oracle's rule: why the topology does not allow this backend for the group
        (commsim.topology.truth.GroupFacts), or None when it does. Restated from the sources,
        never derived from `eligibility`, so that a wrong eligibility rule shows."""
        return "declares no oracle rule"

    @classmethod
    def setup_fails(cls, facts: "GroupFacts") -> str | None:
        """Why this backend's set-up must fail on this machine although every query a process
        can make says it is fine (a container without /dev/nvidia-caps, hosts in different
        IMEX domains), or None. The oracle then accepts admitting it and falling back."""
        return None

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
        if cls.max_ranks is not None and ws > cls.max_ranks:
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
        """Whether every rank meets the requirements, from the group-agreed view only: a pure
        function of the view and the params' values (`admitted` reuses its verdict)."""

    @classmethod
    def admitted(cls, view: GroupView, params: dict[str, Any]) -> Eligibility:
        """`eligibility`, computed once per view and params value: every rank of the group
        asks with the same view (GroupView.of), and symm asks again for multicast's."""
        seen: list[tuple[dict[str, Any], Eligibility]] = view.derived(("eligibility", cls), list)
        for p, verdict in seen:
            if p == params:
                return verdict
        verdict = cls.eligibility(view, params)
        seen.append((dict(params), verdict))
        return verdict

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
        A policy with `agree=False` reproduces libraries that decide rank-locally (as they did
        before adding AND/MAX votes over the ranks): the failure stops only its own rank, and the peers
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

    def vote_and_share(self, step: str, error: Exception | None, value: Any,
                       share: Callable[[Any], list[Any]]) -> list[Any]:
        """The vote on `step` and the exchange that follows it, in one collective: each rank
        posts its value (a handle, a pid), or its failure in its place, through `share` (an
        all-gather, or a store exchange), and every rank raises the first failure or gets
        every rank's value. A library that agrees on set-up failures needs no round of its
        own for the verdict: the exchange it makes anyway carries it. Under `agree=False` it
        is `vote` (which then stops only this rank, on its own failure) and the exchange, so
        the peers go on to the exchange without a failed rank."""
        if not self.params.get("agree", True):
            self.vote(step, error)
            return share(value)
        posted = share((None, value) if error is None else ((self.rank, error), None))
        for failed, _ in posted:
            if failed is not None:
                raise SetupFailed(self.name, step, failed[0], failed[1])
        return [v for _, v in posted]

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
    import torch
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

    # -- rank numbering (rule RN1) -----------------------------------------------------------
    def _slot(self) -> int:
        """Which entry of the workspace list this rank takes for its own. The group rank is
        right; `workspace_index="local_rank"` takes LOCAL_RANK (the rank's GPU index on its
        host: the NVML index, which stays distinct when each process sees one GPU as ordinal
        0, row W1), the mistake of code written for a group that starts at local rank 0."""
        if self.params.get("workspace_index", "group_rank") == "local_rank":
            return self.view.ranks[self.rank].gpu
        return self.rank

    def _ptrs(self) -> list[int]:
        """The pointer array the kernel gets; an index past it reads garbage (a 0 here),
        which faults at the first access, as an out-of-range entry of the device array would."""
        me = self._slot()
        return list(self.ptrs) + [0] * max(0, me + 1 - len(self.ptrs))

    def _stage(self, x: torch.Tensor) -> None:
        check("cudaMemcpy", self.driver.memcpy_htod(self._ptrs()[self._slot()] + W.DATA, as_bytes(x)))

    def _result(self, nbytes: int, like: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        import torch
        raw = check("cudaMemcpy", self.driver.memcpy_dtoh(self._ptrs()[self._slot()] + W.DATA + self.capacity, nbytes))
        return torch.from_numpy(raw).view(like.dtype).reshape(shape)   # raw is a fresh copy: no clone

    # -- algorithm and workspace agreement (rules AW1, AW2) ---------------------------------
    def _agreed_algorithm(self, op: str, nbytes: int) -> str:
        """The library's own choice, or the caller's `force_algorithm`. A forced one-shot in
        the Lamport layout stores every rank's input in every rank's buffer (ws x bytes); the
        workspace was sized for the library's own choice (2 x capacity after the flags).
        `workspace_check="refuse"` (default) raises the library's refusal; `"none"` launches
        the stores, which leave the allocation on the ranks whose slot does not fit."""
        forced = self.params.get("force_algorithm")
        if not forced:
            return self.algorithm(op, nbytes)
        need, have = self.ws * nbytes, 2 * self.capacity
        if forced == "one-shot" and need > have:
            if self.params.get("workspace_check", "refuse") == "refuse":
                raise WorkspaceTooSmall(
                    f"{self.name}: one-shot all-reduce of {nbytes} B on {self.ws} ranks needs {need} B "
                    f"of Lamport workspace; the workspace holds {have} B, sized for the library's own "
                    f"choice at this size ({self.algorithm(op, nbytes)}) (rule AW1)")
            self._launch(lamport_push, self._ptrs(), self._slot(), nbytes, W.workspace_bytes(self.capacity))
        return forced

    def run(self, op: str, x: torch.Tensor) -> torch.Tensor:
        dtype = str(x.dtype).removeprefix("torch.")
        n, nbytes, me, ptrs = x.numel(), x.numel() * x.element_size(), self._slot(), self._ptrs()
        self._stage(x)
        if op == "all_gather":
            self._launch(K.all_gather, ptrs, me, nbytes, self.capacity, self.round + 1)
            return self._result(nbytes * self.ws, x, (self.ws * x.shape[0],) + tuple(x.shape[1:]))
        if op == "reduce_scatter":
            self._launch(K.reduce_scatter, ptrs, me, n, dtype, self.capacity, self.round + 1)
            per = n // self.ws
            return self._result(per * x.element_size(), x, (per,))
        alg = self._agreed_algorithm(op, nbytes)
        kern = K.one_shot_all_reduce if alg == "one-shot" else K.two_shot_all_reduce
        self._launch(kern, ptrs, me, n, dtype, self.capacity, self.round + 1)
        return self._result(nbytes, x, tuple(x.shape))


def probe_verdict(view: GroupView, params: dict[str, Any]) -> str:
    """Why the functional P2P probe rules peer memory out for this group ("" = it does not).
    The default trusts the probe over cuDeviceCanAccessPeer (row P4); a policy reproducing a
    stack that skips the probe sets `p2p_check = "flag"`."""
    if params.get("p2p_check", "probe") == "flag":
        return ""
    return view.p2p_unreal()


def lamport_push(ctx: Any, ptrs: list[int], me: int, nbytes: int, alloc_bytes: int) -> None:
    """The stores of a Lamport one-shot (FlashInfer / TRT-LLM): this rank's input goes to slot
    `me` of every rank's buffer, at DATA + me * nbytes. Only their reach is modelled: a store
    whose range crosses the end of the workspace allocation touches the first byte past it,
    which in the simulator is an unmapped guard gap (rule AW2); in-bounds data stays with the
    pull kernels of the data path."""
    last = W.DATA + (me + 1) * nbytes - 1
    reach = alloc_bytes if last >= alloc_bytes else last
    for p in ptrs:
        ctx.array(p + reach, np.uint8, 1)
