"""`threading.local` per rank: what one process's main thread sees is its own.

In procs mode every rank is a process, so a `threading.local()` a library keeps at module
level (vLLM's `vllm.utils.torch_utils._current_stream_tls`, the stream its pynccl
synchronises) holds one value per rank. In inproc mode the ranks are greenlets of one
thread, and the real `threading.local` would hand rank 1 the stream rank 0 stored (its
cudaStreamSynchronize then fails with cudaErrorInvalidResourceHandle: a stream of another
process). So while hosting is installed, `threading.local` is `RankLocal`: the attributes
of one instance are kept per (rank, thread), and a subclass's `__init__` runs again with
the constructor's arguments for each new (rank, thread), as `threading.local` runs it for
each new thread (Lib/_threading_local.py). A rank's values live in its state, so a later
run in the same interpreter starts without them; outside a rank they are per thread: the
real semantics. Instances made before the install stay real `threading.local` objects.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from commsim.hosting.install.patches import Patches
from commsim.hosting.install.registry import register_surface
from commsim.hosting.state.session import hosted

_DICTS = "_commsim_rank_dicts"
_ARGS = "_commsim_rank_args"
_OWN = frozenset({_DICTS, _ARGS, "__class__", "__dict__"})


def _dicts(local: "RankLocal") -> dict:
    """thread -> attributes of `local`, for the running rank (kept in the rank's state, so a
    later run in this interpreter starts empty) or for the interpreter outside a rank."""
    r = hosted()
    if r is None:
        return object.__getattribute__(local, _DICTS)
    return r.state.setdefault("threading.local", weakref.WeakKeyDictionary()).setdefault(local, {})


class RankLocal:
    """A `threading.local` whose attributes are per (rank, thread)."""

    __slots__ = (_DICTS, _ARGS, "__weakref__")

    def __new__(cls, *args: Any, **kwargs: Any) -> "RankLocal":
        if (args or kwargs) and cls.__init__ is object.__init__:
            raise TypeError("Initialization arguments are not supported")
        self = object.__new__(cls)
        object.__setattr__(self, _DICTS, {})
        object.__setattr__(self, _ARGS, (args, kwargs))
        _dicts(self)[threading.get_ident()] = {}         # the constructing call's own
        return self

    def _ns(self) -> dict:
        dicts = _dicts(self)
        key = threading.get_ident()
        ns = dicts.get(key)
        if ns is None:
            ns = dicts[key] = {}
            args, kwargs = object.__getattribute__(self, _ARGS)
            type(self).__init__(self, *args, **kwargs)
        return ns

    def __getattribute__(self, name: str) -> Any:
        if name in _OWN or name == "_ns":
            if name == "__dict__":
                return object.__getattribute__(self, "_ns")()
            return object.__getattribute__(self, name)
        ns = object.__getattribute__(self, "_ns")()
        if name in ns:
            return ns[name]
        return object.__getattribute__(self, name)     # class attributes and methods

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _OWN:
            raise AttributeError(f"{type(self).__name__!r} object attribute {name!r} is read-only")
        object.__getattribute__(self, "_ns")()[name] = value

    def __delattr__(self, name: str) -> None:
        ns = object.__getattribute__(self, "_ns")()
        if name not in ns:
            raise AttributeError(name)
        del ns[name]


def _install(patches: Patches) -> None:
    patches.attr(threading, "local", RankLocal)


SURFACE = register_surface("threading.local per rank", _install)
install, uninstall = SURFACE.install, SURFACE.uninstall
