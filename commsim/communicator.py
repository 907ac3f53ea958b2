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

from .backends import get_backend
from .backends.base import Backend, Capture, SetupFailed
from .discovery import GroupView, discover
from .driver import Driver
from .policy import Policy

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


class Communicator:
    def __init__(self, group: Any, driver: Driver, policy: Policy | None = None):
        self.group, self.driver = group, driver
        self.policy = policy or Policy()
        self.rank, self.size = group.rank, group.size
        self.decisions: list[Decision] = []
        self.backends: dict[str, Backend] = {}
        self.choices: dict[tuple[str, int, str], Choice] = {}
        self._capture: Capture | None = None
        self._captures: list[Capture] = []
        self.closed = False
        self.step = "discover"
        try:
            self.view: GroupView = discover(driver, group)
            # A policy whose order depends on the group (the "model" preset) binds to what
            # discovery found; a fixed-order policy returns itself.
            self.policy = self.policy.for_group(self.view)
            self.step = "init"
            self._init_backends()
        except BaseException as e:
            e.commsim_step = self.step
            e.commsim_trace = "\n".join(f"  {d.what}: {d.detail}" for d in self.decisions)
            self.close()
            raise

    # -- set-up ----------------------------------------------------------------------------
    def _init_backends(self) -> None:
        for name in self.policy.order:
            cls = get_backend(name)
            if cls is None:
                self.decisions.append(Decision(name, "declined: not available in this build"))
                continue
            verdict = self.policy.admit(cls, self.view)
            if not verdict.ok:
                self.decisions.append(Decision(name, "declined: " + "; ".join(verdict.reasons)))
                continue
            b = cls(self.driver, self.group, self.view, dict(self.policy.params))
            try:
                b.setup()
            except SetupFailed as e:
                b.close()
                if not self.policy.fallback_on_setup_error:
                    self.decisions.append(Decision(name, f"admitted ({'; '.join(verdict.reasons) or 'eligible'}); "
                                                         f"set-up failed, policy allows no fallback: {e}"))
                    raise
                self.decisions.append(Decision(name, f"declined after set-up failure: {e}"))
                continue
            except BaseException:
                b.close()       # a hang or peer failure mid set-up: release what this rank holds
                raise
            self.backends[name] = b
            desc = b.describe()
            self.decisions.append(Decision(name, "admitted: every requirement holds for every rank"
                                                 + (f" ({desc})" if desc else "")))

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
        raise RuntimeError(f"no backend accepts {op} of {nbytes} B {dtype}: {'; '.join(declined)}")

    def _run(self, op: str, x: torch.Tensor) -> torch.Tensor:
        if self.closed:
            raise RuntimeError("communicator is closed")
        if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise TypeError(f"dtype {x.dtype} not supported; use float32, float16 or bfloat16")
        if op == "reduce_scatter" and x.numel() % self.size:
            raise ValueError(f"reduce_scatter needs numel divisible by {self.size}, got {x.numel()}")
        self.step = "op" if self._capture is None else "capture"
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
        s = self._run("all_reduce_rmsnorm", x).float() + residual.float()
        var = s.pow(2).mean(dim=-1, keepdim=True)
        out = s * torch.rsqrt(var + eps) * weight.float()
        return out.to(x.dtype), s.to(x.dtype)

    # -- CUDA-graph mode -------------------------------------------------------------------
    @contextlib.contextmanager
    def capture(self, discard: bool = False) -> Iterator[Capture]:
        """Record the buffers ops use; at exit the backends that need it register them
        collectively. `discard=True` is the profiling pattern: capture, then throw the graphs
        away, releasing their mappings (the fix for vLLM#46515, row G5)."""
        cap = Capture()
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
