"""torch.distributed in procs mode: the real thing (gloo) in real processes.

The CPU build of torch has no NCCL, so a hosted program that asks for backend "nccl" (or
"cpu:gloo,cuda:nccl") gets gloo, which serves its CPU tensors and object collectives; the
substitution is noted in the rank's verdict. A `device_id` naming a CUDA device is dropped
(there are no CUDA tensors to bind). Everything else is torch's own code.
"""

from __future__ import annotations

import functools
from typing import Any

from .session import hosted
from .surfaces import register_surface, when_imported

_saved: list[tuple[Any, str, Any]] = []


def _gloo(backend: Any) -> Any:
    if backend is None:
        return None
    text = str(backend)
    return "gloo" if "nccl" in text.lower() else backend


def _wrap_init(real: Any) -> Any:
    @functools.wraps(real)
    def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
        r = hosted()
        if r is not None and r.mode == "procs":
            if backend is not None and _gloo(backend) != backend:
                r.events.note(f"backend {backend!r} served by gloo (CPU tensors)")
                backend = "gloo"
            kwargs.pop("device_id", None)
        return real(backend, *args, **kwargs)
    init_process_group.__commsim_procs__ = True   # type: ignore[attr-defined]
    return init_process_group


def _wrap_new_group(real: Any) -> Any:
    @functools.wraps(real)
    def new_group(*args: Any, **kwargs: Any) -> Any:
        r = hosted()
        if r is not None and r.mode == "procs":
            if "backend" in kwargs:
                kwargs["backend"] = _gloo(kwargs["backend"])
            kwargs.pop("device_id", None)
        return real(*args, **kwargs)
    new_group.__commsim_procs__ = True   # type: ignore[attr-defined]
    return new_group


def _patch(dist: Any) -> None:
    import torch.distributed.distributed_c10d as c10d
    for mod in (dist, c10d):
        for name, wrap in (("init_process_group", _wrap_init), ("new_group", _wrap_new_group)):
            real = getattr(mod, name, None)
            if real is None or getattr(real, "__commsim_procs__", False):
                continue
            _saved.append((mod, name, real))
            setattr(mod, name, wrap(real))


def _install() -> None:
    when_imported("torch.distributed", _patch)


def _uninstall() -> None:
    while _saved:
        mod, name, real = _saved.pop()
        setattr(mod, name, real)


register_surface("torch.distributed (procs)", _install, _uninstall)
