"""What must differ per rank when ranks share one interpreter (inproc mode).

- `os.environ`: each rank reads and writes its own copy (RANK, LOCAL_RANK, WORLD_SIZE, ...,
  CUDA_VISIBLE_DEVICES differ per rank). A greenlet trace swaps the mapping behind
  `os.environ` on every switch into another rank (one dict assignment), and re-exports the
  few per-rank variables to the C environment so a process the rank spawns inherits its
  rank's values.
- `sys.modules["__main__"]`: each rank runs the program in its own `__main__` module, so
  pickling a function of the program (multiprocessing spawn, torch.multiprocessing.spawn)
  finds that rank's function.
- the process-wide random generators (Python's `random`, numpy's legacy global one, torch's
  CPU default generator): each rank draws from its own, saved and restored on the switch, so
  a rank that seeds them draws what a process of its own would, however the ranks
  interleave. A rank starts from what a fresh process has: torch's default seed
  67280421310721 (c10/core/GeneratorImpl.h) and, for `random` and numpy (seeded from OS
  entropy in a new process), a seed derived from the rank, so a run stays a function of its
  seed.
- `time.sleep` in a rank is a sleep in the scheduler's virtual time: a polling loop yields to
  the other ranks instead of stopping them all, and a run stays a function of the seed.

The trace is installed by the inproc runner for the duration of a run (`installed()`).
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import time
from typing import Any, Iterator

import greenlet

from commsim.hosting.install.patches import Patches
from commsim.hosting.state.session import hosted
from commsim.hosting.state.session import _bound
from commsim.runtime.scheduler import current_scheduler

# The variables the launcher sets per rank; kept in sync with the C environment on switch.
PER_RANK = ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "LOCAL_WORLD_SIZE",
            "WORLD_SIZE", "CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT", "PYTHONPATH",
            "COMMSIM_HOSTING", "COMMSIM_HOSTING_RANK", "COMMSIM_HOSTING_SLOT",
            "COMMSIM_HOSTING_HOST", "COMMSIM_HOSTING_VISIBLE", "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_NODE_RANK", "OMPI_UNIVERSE_SIZE")

_base: dict | None = None       # the process's own environ mapping (outside ranks)
_active: Any = None             # the HostedRank whose view is in place (None: the base)
_base_main: Any = None          # sys.modules["__main__"] outside ranks
_real_sleep = time.sleep
_patches = Patches()            # the views' attributes while installed


def encoded(env: dict[str, str]) -> dict:
    """A rank's view in os.environ's internal form (bytes keys/values on POSIX)."""
    return {os.environ.encodekey(k): os.environ.encodevalue(v) for k, v in env.items()}


def _apply(rank: Any) -> None:
    global _active
    if rank is _active:
        return
    _swap_generators(_active, rank)
    data = _base if rank is None else rank.env
    _patches.switch(os.environ, "_data", data)
    _patches.switch_module("__main__", _base_main if rank is None else
                           rank.state.get("__main__", _base_main))
    for k in PER_RANK:
        bk = os.environ.encodekey(k)
        v = data.get(bk)
        if v is None:
            os.unsetenv(k)
        else:
            os.putenv(k, v)
    _active = rank


_base_generators: dict[str, Any] = {}    # the process's own states, outside ranks
_TORCH_DEFAULT_SEED = 67280421310721


def _generators() -> dict[str, tuple[Any, Any]]:
    """(get_state, set_state) of each process-wide generator loaded now."""
    out: dict[str, tuple[Any, Any]] = {"random": (random.getstate, random.setstate)}
    np_random = sys.modules.get("numpy.random")
    if np_random is not None and hasattr(np_random, "get_state"):
        out["numpy"] = (np_random.get_state, np_random.set_state)
    torch = sys.modules.get("torch")
    gen = getattr(torch, "default_generator", None) if torch is not None else None
    if gen is not None:
        out["torch"] = (gen.get_state, gen.set_state)
    return out


def _fresh(name: str, rank: Any) -> None:
    """A generator as a new process of `rank` would find it."""
    if name == "torch":
        sys.modules["torch"].default_generator.manual_seed(_TORCH_DEFAULT_SEED)
    elif name == "numpy":
        sys.modules["numpy.random"].seed(0x5EED0000 + rank.rank)
    else:
        random.seed(0x5EED0000 + rank.rank)


def _swap_generators(old: Any, new: Any) -> None:
    gens = _generators()
    saved = _base_generators if old is None else old.state.setdefault("generators", {})
    for name, (get, _) in gens.items():
        saved[name] = get()
    wanted = _base_generators if new is None else new.state.setdefault("generators", {})
    for name, (_, put) in gens.items():
        state = wanted.get(name)
        if state is not None:
            put(state)
        elif new is not None:
            _fresh(name, new)


def _trace(event: str, args: Any) -> None:
    if event in ("switch", "throw"):
        _apply(_rank_of(args[1]))


def _rank_of(g: Any) -> Any:
    while g is not None:
        stack = _bound.get(g)
        if stack:
            return stack[-1] if stack[-1].env is not None else None
        g = g.parent
    return None


def refresh() -> None:
    """Put the running greenlet's view in place now (after a bind or an unbind)."""
    if _base is not None:
        _apply(_rank_of(greenlet.getcurrent()))


def _sleep(seconds: float) -> None:
    r = hosted()
    if r is not None and r.mode == "inproc":
        sched = current_scheduler()
        if sched is not None and sched.current_rank is not None:
            sched.sleep(seconds)
            return
    _real_sleep(seconds)


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """Per-rank environ views and virtual sleep for the block (the inproc runner's run)."""
    global _base, _active, _base_main
    _base = os.environ._data   # type: ignore[attr-defined]
    _base_main = sys.modules.get("__main__")
    _active = None
    _patches.attr(os.environ, "_data", _base)
    _patches.module("__main__", _base_main)
    prev = greenlet.settrace(_trace)
    _patches.attr(time, "sleep", _sleep)
    try:
        yield
    finally:
        greenlet.settrace(prev)
        _apply(None)
        _patches.restore()
        _base = None
