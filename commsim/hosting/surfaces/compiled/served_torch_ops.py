"""Ops of a compiled extension that commsim serves, registered where the library looks them up.

A compiled torch extension registers its ops with the dispatcher when it loads
(`TORCH_LIBRARY(namespace, m) { m.def(schema); }`), and the library's Python side calls them
as `torch.ops.<namespace>.<op>(...)`. A served extension does the same in a hosted rank:
`register` defines every served op under its namespace with `torch.library` (the real
schema, so `torch.ops.<namespace>.<op>` resolves and its arguments are checked as the
real op's are) and puts a Python packet in front of each, which binds the arguments by that
schema and runs the reference implementation with the caller's rank before torch's
dispatcher is entered: an inproc rank that waits for its peers inside an op switches to
them from Python frames only (as torch.ops.symm_mem's packets do, torch_distributed/
symm_mem.py). An op called as an OpOverload (`.default`) reaches the same implementation
through the dispatcher. An op the extension declares but commsim does not serve is defined
too and raises the extension's named error, so a probe (`hasattr`) sees it as installed.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

import torch

from commsim.hosting.install.patches import Patches
from commsim.hosting.state.session import current, hosted
from commsim.hosting.surfaces.compiled.extensions import ServedOp
from commsim.hosting.surfaces.torch import tensors as hosted_tensors

__all__ = ["register"]


def _implementation(op: ServedOp) -> Callable[..., Any]:
    """The op's reference implementation, called with the caller's rank first."""
    module, _, name = op.impl.partition(":")
    fn = getattr(importlib.import_module(module), name)
    return lambda *args: fn(current(), *args)


class _Packet:
    """`torch.ops.<namespace>.<op>` in a hosted rank: the arguments bound by the op's schema
    (defaults filled in), then the implementation, in Python."""

    def __init__(self, real: Any, run: Callable[..., Any]) -> None:
        self._real = real
        self._run = run
        self.__name__ = real.__name__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if hosted() is None:
            return self._real(*args, **kwargs)
        schema = self._real.default._schema
        values = list(args)
        for a in schema.arguments[len(args):]:
            if a.name in kwargs:
                values.append(kwargs.pop(a.name))
            elif a.has_default_value():
                values.append(a.default_value)
            else:
                raise TypeError(f"{schema.name}() is missing value for argument '{a.name}'. "
                                f"Declaration: {schema}")
        if kwargs or len(values) > len(schema.arguments):
            raise TypeError(f"{schema.name}() got unexpected arguments. Declaration: {schema}")
        return self._run(*values)

    @property
    def default(self) -> "_Overload":
        return _Overload(self)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class _Overload:
    """`torch.ops.<namespace>.<op>.default` in a hosted rank (sgl_kernel/allreduce.py calls
    every op so): the packet, in Python. Through torch's dispatcher, an inproc rank that waits
    inside the op would hand the thread to its peers with the dispatcher's thread-local
    guards still set (a peer's hosted CUDA tensors would then reach CPU torch)."""

    def __init__(self, packet: _Packet) -> None:
        self._packet = packet

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._packet(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._packet._real.default, name)


def _refusing(error: Callable[[], Exception]) -> Callable[..., Any]:
    def refuse(*args: Any) -> Any:
        raise error()
    return refuse


def register(patches: Patches, ops: dict[str, ServedOp], refused: dict[str, str],
             error: Callable[[], Exception]) -> None:
    """Define `ops` ("<namespace>.<op>" -> ServedOp) and `refused` ("<namespace>.<op>" ->
    schema, served by nobody: each raises `error()`) with torch.library; restore() removes
    them again, so a run in the same process after this one finds the extension unloaded."""
    runs = {name: (op.schema, _implementation(op)) for name, op in ops.items()}
    runs.update({name: (schema, _refusing(error)) for name, schema in refused.items()})
    libraries: dict[str, Any] = {}
    for name, (schema, run) in runs.items():
        namespace, _, short = name.partition(".")
        lib = libraries.get(namespace)
        if lib is None:
            lib = libraries[namespace] = torch.library.Library(namespace, "FRAGMENT")
        lib.define(schema)
        lib.impl(short, run, "CompositeExplicitAutograd")
    for lib in libraries.values():
        patches.on_restore(lib._destroy)
    packets: dict[str, _Packet] = {}
    for name, (schema, run) in runs.items():
        namespace, _, short = name.partition(".")
        ns = getattr(torch.ops, namespace)
        packets[name] = _Packet(getattr(ns, short), run)
        patches.attr(ns, short, packets[name])
    # An OpOverload (`torch.ops.sgl_kernel.init_custom_ar.default(...)`, as sgl_kernel/
    # allreduce.py calls them) with a hosted CUDA tensor among its arguments reaches the
    # tensor's dispatch before any kernel registered here: route it to the same packet.
    for namespace in libraries:
        hosted_tensors.register_op_namespace(namespace, _overload_handler(namespace, packets))
        patches.on_restore(lambda ns=namespace: hosted_tensors.unregister_op_namespace(ns))


def _overload_handler(namespace: str, packets: dict[str, _Packet]) -> Callable[..., Any]:
    def run(func: Any, args: tuple, kwargs: dict) -> Any:
        return packets[f"{namespace}.{func.overloadpacket.__name__}"](*args, **(kwargs or {}))
    return run
