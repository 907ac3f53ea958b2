"""The communicator: discovery -> eligibility -> ordered candidates -> dispatch; capture and
graph registration; close. Every decision is recorded with its reasons (`explain()`).

    comm = Communicator(group, driver)            # collective over `group`
    y = comm.all_reduce(x)                        # torch tensors in and out
    with comm.capture():                          # CUDA-graph mode
        comm.all_reduce(x)
    comm.close()                                  # idempotent; the ledger returns to zero
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from commsim.backends import get_backend
from commsim.backends.base import Backend, Capture, SetupFailed
from commsim.discovery import GroupView, discover
from commsim.driver import Driver, check
from commsim.policy import Policy

@dataclass
class Decision:
    what: str
    detail: str


@dataclass
class Choice:
    op: str
    nbytes: int
    backend: str
    algorithm: str
    declined: list[str] = field(default_factory=list)


SETUP_MODES = ("init", "lazy")


class Communicator:
    """`setup="lazy"` defers the backends' set-up to the first op, as serving stacks that
    build workspaces on first use do (rules LC1, LC2 of docs/lifecycle-rules.md): a set-up
    failure then surfaces at step `op`, or `capture` when the first op is captured. Without
    it the policy's `setup` parameter decides (default "init": eager)."""

    def __init__(self, group: Any, driver: Driver, policy: Policy | None = None,
                 setup: str | None = None, nccl_env: Any = (), fd_transport: str = ""):
        self.group, self.driver = group, driver
        self.policy = policy or Policy()
        self.setup_mode = setup or self.policy.params.get("setup", "init")
        if self.setup_mode not in SETUP_MODES:
            raise ValueError(f"setup {self.setup_mode!r}: accepted {', '.join(SETUP_MODES)}")
        self._setup_pending = False
        # NCCL_* variables of the process (the workload's) over the policy's own `nccl_env`
        self.nccl_env = {**dict(self.policy.params.get("nccl_env", ())), **dict(nccl_env)}
        self.fd_transport = fd_transport     # "" : the policy's (commsim/libmodels/fd_exchange.py)
        self.abandoned: list[Backend] = []          # set-up failed, not rolled back (FH1)
        self.silent_fallbacks: list[tuple[str, str]] = []   # (step, what) under FH3
        self.rank, self.size = group.rank, group.size
        self.decisions: list[Decision] = []
        # The fallback's own set-up failure: with nothing left to fall back to, an op no
        # other backend accepts fails with it (NCCL's result and WARN, as a stack that
        # falls back to NCCL raises what ncclCommInitRank returned).
        self.fallback_failed: SetupFailed | None = None
        self.backends: dict[str, Backend] = {}
        self.choices: dict[tuple[str, int, str], Choice] = {}
        self._capture: Capture | None = None
        self._captures: list[Capture] = []
        self.closed = False
        self.step = "discover"
        try:
            if self.policy.params.get("device_ordinal") == "group_rank":
                # Rule RN4: the rank number taken for a device ordinal (TRT-LLM#1494,
                # flashinfer#2662); the right one is the device the launcher gave the process.
                check("cudaSetDevice", driver.cudaSetDevice(group.rank))
            self.view: GroupView = discover(driver, group)
            # A policy whose order depends on the group (the "model" preset) binds to what
            # discovery found; a fixed-order policy returns itself.
            self.policy = self.policy.for_group(self.view)
            self.step = "init"
            if self.setup_mode == "lazy":
                self._setup_pending = True
                self.decisions.append(Decision("set-up", "deferred to the first op (lazy workspaces, "
                                                         "rules LC1-LC2)"))
            else:
                self._init_backends()
        except BaseException as e:
            e.commsim_step = self.step
            e.commsim_trace = self.trace()
            self.close()
            raise

    # -- set-up ----------------------------------------------------------------------------
    def _init_backends(self) -> None:
        failed: list[str] = []
        for name in self.policy.order:
            cls = get_backend(name)
            if cls is None:
                self.decisions.append(Decision(name, "declined: not available in this build"))
                continue
            verdict = self.policy.admit(cls, self.view)
            if not verdict.ok:
                self.decisions.append(Decision(name, "declined: " + "; ".join(verdict.reasons)))
                continue
            params = {**self.policy.params, "nccl_env": self.nccl_env}
            if self.fd_transport:
                params["fd_transport"] = self.fd_transport
            b = cls(self.driver, self.group, self.view, params)
            try:
                b.setup()
            except SetupFailed as e:
                if self.policy.params.get("rollback", True):
                    b.close()
                else:               # rule FH1: what set-up allocated stays allocated
                    self.abandoned.append(b)
                if not self.policy.fallback_on_setup_error:
                    self.decisions.append(Decision(name, f"admitted ({'; '.join(verdict.reasons) or 'eligible'}); "
                                                         f"set-up failed, policy allows no fallback: {e}"))
                    raise
                if cls.fallback:
                    self.fallback_failed = e
                if self.policy.params.get("report_fallback", True):
                    self.decisions.append(Decision(name, f"declined after set-up failure: {e}"))
                else:               # rule FH3: nothing in the explanation says so
                    failed.append(f"{name} set-up failed: {e}")
                continue
            except BaseException:
                b.close()       # a hang or peer failure mid set-up: release what this rank holds
                raise
            self.backends[name] = b
            desc = b.describe()
            self.decisions.append(Decision(name, self._admitted(cls, verdict) + (f" ({desc})" if desc else "")))
        if failed:
            # The simulator's audit, not the communicator's report: what a silent fallback hid.
            to = next(iter(self.backends), "nothing")
            self.silent_fallbacks.append((self.step, f"silently fell back to {to} ({'; '.join(failed)})"))

    def _admitted(self, cls: Any, verdict: Any) -> str:
        """Why a backend was admitted. A policy with a gate of its own (a serving stack's
        shortcut such as "world size 2 is always eligible") says so, and where the machine's
        rules would have declined the backend, says that too: the reason a failure after
        set-up happened at all."""
        if not verdict.reasons:
            return "admitted: every requirement holds for every rank"
        text = f"admitted by policy {self.policy.name}: {'; '.join(verdict.reasons)}"
        own = cls.admitted(self.view, self.policy.params)
        if not own.ok:
            text += f"; the machine's rules would decline it: {'; '.join(own.reasons)}"
        return text

    def trace(self) -> str:
        """The decisions so far, one per line (what a failure's report carries)."""
        return "\n".join(f"  {d.what}: {d.detail}" for d in self.decisions)

    # -- dispatch --------------------------------------------------------------------------
    def _pick(self, op: str, x: torch.Tensor) -> Backend:
        nbytes = x.numel() * x.element_size()
        dtype = str(x.dtype).removeprefix("torch.")
        key = (op, nbytes, dtype)
        ch = self.choices.get(key)
        if ch is not None:
            return self.backends[ch.backend]
        declined = []
        for name in self.policy.candidates(op, nbytes):
            b = self.backends.get(name)
            if b is None:
                continue
            ok, why = b.accepts(op, nbytes, dtype)
            if ok:
                self.choices[key] = Choice(op, nbytes, name, b.algorithm(op, nbytes), declined)
                return b
            declined.append(f"{name}: {why}")
        if self.fallback_failed is not None:
            raise self.fallback_failed
        raise RuntimeError(f"no backend accepts {op} of {nbytes} B {dtype}: {'; '.join(declined)}")

    def _run(self, op: str, x: torch.Tensor) -> torch.Tensor:
        if self.closed:
            raise RuntimeError("communicator is closed")
        if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise TypeError(f"dtype {x.dtype} not supported; use float32, float16 or bfloat16")
        if op == "reduce_scatter" and x.numel() % self.size:
            raise ValueError(f"reduce_scatter needs numel divisible by {self.size}, got {x.numel()}")
        self.step = "op" if self._capture is None else "capture"
        if self._setup_pending:
            self._lazy_setup(f"the first op, which ran at step {self.step} (lazy workspaces, rules LC1-LC2)")
        b = self._pick(op, x)
        kind = "all_reduce" if op == "all_reduce_rmsnorm" else op
        if self._capture is not None and b.needs_graph_registration:
            b.record(self._capture, x)
            if op != "all_reduce_rmsnorm":
                # Inside a capture the kernel is recorded, not run (vLLM returns empty_like
                # during capture); the graph replays after registration and fills `out`.
                out = torch.empty(self._out_shape(kind, x), dtype=x.dtype)
                self._capture.pending.append((b, kind, x.clone(), out))
                return out
        return b.run(kind, x)

    def _lazy_setup(self, when: str) -> None:
        """Run the deferred set-up now; a failure carries the step it happened at."""
        self._setup_pending = False
        try:
            self._init_backends()
        except BaseException as e:
            e.commsim_step = self.step
            e.commsim_trace = self.trace()
            raise
        i = next(i for i, d in enumerate(self.decisions) if d.what == "set-up")
        self.decisions[i] = Decision("set-up", f"deferred to {when}")

    def _out_shape(self, op: str, x: torch.Tensor) -> tuple[int, ...]:
        if op == "all_gather":
            return (self.size * x.shape[0],) + tuple(x.shape[1:])
        if op == "reduce_scatter":
            return (x.numel() // self.size,)
        return tuple(x.shape)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return self._run("all_reduce", x)

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        return self._run("all_gather", x)

    def reduce_scatter(self, x: torch.Tensor) -> torch.Tensor:
        return self._run("reduce_scatter", x)

    def all_reduce_rmsnorm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                           eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
        """The fused op serving stacks use: r = all_reduce(x) + residual; out = rmsnorm(r) * w.
        Returns (out, r), computed in float32 and cast back."""
        r = self._run("all_reduce_rmsnorm", x)
        # float32 throughout, in place where the tensor is ours: 7 passes over the message
        # instead of 10, and no float32 copies of residual and weight (at 8 MiB this op was
        # two fifths of a sweep scenario's CPU).
        s = r.float() if r.dtype != torch.float32 else r.clone()
        s.add_(residual)
        var = torch.linalg.vector_norm(s, dim=-1, keepdim=True).square_().div_(s.shape[-1])
        out = torch.mul(s, var.add_(eps).rsqrt_()).mul_(weight)
        return out.to(x.dtype), s.to(x.dtype)

    # -- CUDA-graph mode -------------------------------------------------------------------
    @contextlib.contextmanager
    def capture(self, discard: bool = False) -> Iterator[Capture]:
        """Record the buffers ops use; at exit the backends that need it register them
        collectively. `discard=True` is the profiling pattern: capture, then throw the graphs
        away, releasing their mappings (the fix for vLLM#46515, row G5).

        Entering is the library's capture hook, before the workload's stream capture begins:
        a lazy set-up still pending runs here (rule LC3: sglang's pre-initialised workspaces,
        vLLM's refusal to create one during capture), since inside a GLOBAL-mode capture its
        cudaMalloc is refused and the capture invalidated (rules CG1-CG2). A policy with
        `setup_in_capture=True` leaves it to the first captured op, as FlashInfer fusion
        workspaces created on first use did (vllm-project/vllm#37461, #55973)."""
        cap = Capture()
        if self._setup_pending and not self.policy.params.get("setup_in_capture", False):
            self.step = "capture"
            self._lazy_setup("the capture hook, before the stream capture began (rule LC3)")
        self._capture = cap
        try:
            yield cap
        finally:
            self._capture = None
        self.step = "register"
        for b in self.backends.values():
            if b.needs_graph_registration:
                b.register_graph_buffers(cap)
        self._captures.append(cap)
        self.step = "op"
        for b, op, x, out in cap.pending:      # the first replay of the graph
            out.copy_(b.run(op, x))
        cap.pending.clear()
        if discard:
            self.release_capture(cap)

    def release_capture(self, cap: Capture) -> None:
        self.step = "release_capture"
        for b in self.backends.values():
            if b.needs_graph_registration:
                b.release_capture(cap)

    # -- close -----------------------------------------------------------------------------
    def close(self) -> None:
        """Idempotent; safe after a failed init; backends close in reverse set-up order."""
        if self.closed:
            return
        self.closed = True
        self.step = "close"
        for b in reversed(list(self.backends.values())):
            b.close()
        self.backends.clear()

    # -- explanation -----------------------------------------------------------------------
    def explain(self) -> str:
        v = self.view
        lines = [f"group {getattr(self.group, 'name', '?')}: {self.size} ranks on {len(v.hosts)} host(s)"]
        for d in self.decisions:
            lines.append(f"  {d.what}: {d.detail}")
        for ch in self.choices.values():
            extra = f" (declined first: {'; '.join(ch.declined)})" if ch.declined else ""
            lines.append(f"  {ch.op} {ch.nbytes} B -> {ch.backend} {ch.algorithm}{extra}")
        return "\n".join(lines)

    def chosen(self, op: str, nbytes: int, dtype: str = "bfloat16") -> str | None:
        ch = self.choices.get((op, nbytes, dtype))
        return ch.backend if ch else None
