"""What a hosted rank gets in place of a compiled JIT module that commsim serves (FlashInfer's;
a Python extension module's torch ops are served_torch_ops.py's): a module-like
object whose attributes are the declared ops (reference implementations over the simulated
driver). A declared op that is not served is the named error at the moment the library
reaches for it, so the ops that are served run and the first one that is not says so; a name
the extension does not have is an AttributeError, as on the real module.
"""

from __future__ import annotations

import importlib
from typing import Any

from commsim.hosting.surfaces.compiled.extensions import CompiledExtension, not_served_error

__all__ = ["ServedModule"]


class ServedModule:
    """The served stand-in of one declared extension (one `CompiledExtension`)."""

    def __init__(self, ext: CompiledExtension, kind: str) -> None:
        self._ext = ext
        self._kind = kind
        self.__name__ = ext.module

    def __getattr__(self, name: str) -> Any:
        ext = self.__dict__["_ext"]
        op = ext.served.get(name)
        if op is not None:
            module, _, fn = op.impl.partition(":")
            return getattr(importlib.import_module(module), fn)
        if name in ext.not_served:
            raise not_served_error(self.__dict__["_kind"], ext.module, op=name)
        raise AttributeError(f"module {ext.module!r} has no attribute {name!r}")

    def __dir__(self) -> list[str]:
        return sorted({*self._ext.served, *self._ext.not_served})

    def __repr__(self) -> str:
        return f"<commsim served module {self._ext.module!r} ({self._ext.library})>"
