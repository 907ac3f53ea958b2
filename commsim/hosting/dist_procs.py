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
from .surfaces import wrap_torch_distributed


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
    return new_group


wrap_torch_distributed("torch.distributed (procs)", "__commsim_procs__",
                       {"init_process_group": _wrap_init, "new_group": _wrap_new_group})
