"""CUDA tensors of a hosted rank on the CPU build of torch.

`HostedCudaTensor` is a wrapper subclass (`torch.Tensor._make_wrapper_subclass`): to torch
and to the program it is a tensor on `cuda:N` (`.device`, `.is_cuda`, `.get_device()`), with
its own sizes, strides and storage offset; its elements live in an inner CPU tensor whose
storage is the rank's simulated device memory (torch/memory.py). Every aten op reaches
`__torch_dispatch__`, which runs it on the inner tensors, on the CPU, over the same bytes,
and gives back CUDA tensors of the same device:
- an in-place op or an `out=` op returns the tensor it wrote;
- a view (slice, `view`, `transpose`, `detach`, ...) shares its base's block, so its
  `data_ptr()` is the base's plus `storage_offset() * element_size()`, as on a GPU;
- a new result is placed in a new block of the device's caching allocator.
Operands on different devices raise torch's own "Expected all tensors to be on the same
device" error (a CPU 0-dim tensor is a scalar and may mix, as in torch), except the ops that
move data between devices (`copy_`, `_to_copy`, indexing with CPU indices). Ops that are not
PyTorch's own (a compiled extension's kernel) fail loudly, naming the op: running them on
the CPU would be computing on the wrong device.

The methods that torch's C++ bindings implement with a CUDA device guard (the CPU build has
none: "PyTorch is not linked with support for cuda devices") or refuse for a subclass
(`__getitem__`, `__setitem__`, `copy_`, `contiguous`, `nonzero`, `new_tensor`, `__float__`,
`__int__`, `__index__`, `numpy`, `tolist`, `__format__`, `__repr__`, `data_ptr`,
`untyped_storage`) are given here in Python, with torch's behaviour for a CUDA tensor.
"""

from __future__ import annotations

from typing import Any

import torch
import torch._utils as tu
from torch import _tensor_str

from commsim.hosting.surfaces.torch import graphs as torch_graphs
from commsim.hosting.surfaces.torch.device import cuda_index
from commsim.hosting.surfaces.torch.graphs import leaves
from commsim.hosting.surfaces.torch.streams import HostedStream
from commsim.hosting.surfaces.torch import memory as torch_memory
from commsim.hosting.surfaces.torch import random as torch_random
from commsim.hosting.state.session import current

__all__ = ["HostedCudaTensor", "place", "new_empty", "inner_of", "is_hosted_cuda",
           "register_op_namespace"]

# Ops that take operands on different devices by definition (torch's cross-device copy and
# indexing with CPU index tensors).
_MIXING = frozenset({"copy_", "_to_copy", "index", "index_put_", "index_put", "_index_put_impl_",
                     "_copy_from", "_copy_from_and_resize", "lift_fresh"})
# Ops that would move a tensor's elements out of its device memory.
_REFUSED = frozenset({"set_", "_pin_memory", "pin_memory"})
# Namespaces whose ops are PyTorch's own and run on the CPU like on the GPU.
_OWN_NAMESPACES = frozenset({"aten", "prims"})
# Ops with nothing to compute on a simulated device.
_NO_OP = frozenset({"record_stream"})
# Namespaces of ops another surface computes over the simulated devices (torch.ops.symm_mem:
# torch_distributed/symm_mem.py): namespace -> handler(func, args, kwargs).
_OP_NAMESPACES: dict[str, Any] = {}


def register_op_namespace(namespace: str, handler: Any) -> None:
    """Route `torch.ops.<namespace>.*` on hosted CUDA tensors to `handler(func, args, kwargs)`
    (a surface that simulates that library's kernels) instead of refusing them."""
    _OP_NAMESPACES[namespace] = handler


def unregister_op_namespace(namespace: str) -> None:
    """Refuse `torch.ops.<namespace>.*` on hosted CUDA tensors again (a served extension's
    ops, once its run restores the extension as unloaded)."""
    _OP_NAMESPACES.pop(namespace, None)


class HostedCudaTensor(torch.Tensor):
    """A tensor on cuda:N of a hosted rank (see the module docstring)."""

    _inner: torch.Tensor
    _block: "torch_memory.DeviceBlock | None"

    @staticmethod
    def __new__(cls, inner: torch.Tensor, device: int, block: Any) -> "HostedCudaTensor":
        t = torch.Tensor._make_wrapper_subclass(
            cls, inner.shape, strides=inner.stride(), storage_offset=inner.storage_offset(),
            dtype=inner.dtype, device=torch.device("cuda", device))
        t._inner = inner
        t._block = block
        return t

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        return _dispatch(func, args, kwargs or {})

    # -- what torch's bindings do with a device guard or refuse for a subclass ---------------
    def data_ptr(self) -> int:
        """The simulated device address of the first element (0 for an empty storage)."""
        if self._block is None:
            return 0
        return self._block.device_address(self._inner.data_ptr())

    def numpy(self, *, force: bool = False) -> Any:
        # torch/csrc/utils/tensor_numpy.cpp: a CUDA tensor is refused; force=True is
        # `detach().cpu()...numpy()` (Tensor.numpy docs): a host copy.
        if force:
            _no_host_read(self, "Tensor.numpy(force=True)")
            return self._inner.detach().clone().numpy()
        raise TypeError(f"can't convert {self.device} device type tensor to numpy. Use "
                        f"Tensor.cpu() to copy the tensor to host memory first.")

    def record_stream(self, stream: Any) -> None:
        """Tensor.record_stream(s): torch's binding takes a torch.Stream, which a hosted
        rank's torch.cuda.Stream is not; the block's reuse needs no deferring here (work
        completes when it is launched), so only the argument is checked, as torch's parser
        checks it."""
        if not isinstance(stream, (HostedStream, torch.Stream)):
            raise TypeError(f"record_stream(): argument 's' (position 1) must be Stream, "
                            f"not {type(stream).__name__}")

    def tolist(self) -> Any:
        _no_host_read(self, "Tensor.tolist()")
        return self._inner.tolist()

    def __format__(self, spec: str) -> str:
        if self.dim() == 0:
            _no_host_read(self, "formatting a CUDA tensor")
            return self._inner.item().__format__(spec)
        return object.__format__(self, spec)

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        body = tensor_contents
        if body is None and self.numel() > 0:
            _no_host_read(self, "printing a CUDA tensor")
            body = _tensor_str._tensor_str(self._inner.detach(), len("tensor("))
        text = _tensor_str._str(self, tensor_contents=body)
        return "tensor(" + text.partition("(")[2]           # torch's prefix, not the class name

    def __getitem__(self, index: Any) -> Any:
        idx = _unwrap_index(index, self)
        cap = self._capture_of_item(index, None)
        out = _adopt(self._inner[idx], self.device.index, [self])
        if cap is not None and out._block is not self._block:       # a gather: new memory
            cap.work.append(lambda: out._inner.copy_(self._inner[idx]))
        return out

    def __setitem__(self, index: Any, value: Any) -> None:
        idx = _unwrap_index(index, self)
        v = inner_of(value) if isinstance(value, torch.Tensor) else value
        cap = self._capture_of_item(index, value)
        if cap is not None:             # captured: written at replay, not now

            def write() -> None:
                self._inner[idx] = v
            cap.work.append(write)
            return
        self._inner[idx] = v

    def _capture_of_item(self, index: Any, value: Any) -> Any:
        """The capture that records an indexing of this tensor (host operands refused)."""
        if not torch_graphs.CAPTURING[0]:
            return None
        cap = torch_graphs.capture_for((self.device.index,))
        if cap is not None and any(isinstance(x, torch.Tensor) and not isinstance(x, HostedCudaTensor)
                                   and x.dim() > 0 for x in leaves((index, value), [])):
            torch_graphs.host_sync("indexing a CUDA tensor with a CPU tensor")
        return cap

    # Bindings that take a CUDA device guard before dispatching (python_variable_methods.cpp):
    # the same operations through the dispatcher.
    def copy_(self, src: Any, non_blocking: bool = False) -> "HostedCudaTensor":
        return torch.ops.aten.copy_.default(self, src, non_blocking)

    def contiguous(self, memory_format: Any = torch.contiguous_format) -> Any:
        if self.is_contiguous(memory_format=memory_format):
            return self
        return torch.ops.aten.clone.default(self, memory_format=memory_format)

    def nonzero(self, *, as_tuple: bool = False) -> Any:
        out = torch.ops.aten.nonzero.default(self)
        return tuple(out.unbind(1)) if as_tuple else out

    def new_tensor(self, data: Any, dtype: Any = None, device: Any = None,
                   requires_grad: bool = False, **kwargs: Any) -> Any:
        return torch.tensor(data, dtype=dtype or self.dtype, device=device or self.device,
                            requires_grad=requires_grad, **kwargs)

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __index__(self) -> int:
        return self._inner.__index__()

    def __complex__(self) -> complex:
        return complex(self.item())

    def __invert__(self) -> Any:
        return torch.ops.aten.bitwise_not.default(self)

    # Autograd's bookkeeping takes a CUDA device guard, which the CPU build aborts on
    # (std::terminate, not an exception): the C++ flag is never set. `requires_grad` is kept
    # here so parameters can be made and moved (nn.Parameter, Module.cuda()) and run under
    # torch.no_grad() / inference_mode(), as inference code does; an op that autograd would
    # record is refused by the dispatch (_autograd_refused).
    def requires_grad_(self, requires_grad: bool = True) -> "HostedCudaTensor":
        self.__dict__["_wants_grad"] = bool(requires_grad)
        return self

    @property
    def requires_grad(self) -> bool:      # type: ignore[override]
        return self.__dict__.get("_wants_grad", False)

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        self.requires_grad_(value)

    def untyped_storage(self) -> "HostedStorage":
        return HostedStorage(self)

    def storage(self) -> Any:
        raise NotImplementedError("commsim hosting: Tensor.storage() (TypedStorage) of a CUDA "
                                  "tensor is not simulated; untyped_storage() is")

    def is_shared(self) -> bool:
        return True                   # torch: CUDA storage counts as shared

    def share_memory_(self) -> "HostedCudaTensor":
        return self                   # torch: a no-op for CUDA tensors

    def __deepcopy__(self, memo: dict) -> "HostedCudaTensor":
        if id(self) not in memo:
            memo[id(self)] = self.clone()
        return memo[id(self)]

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        _no_dlpack()

    def __reduce_ex__(self, proto: Any) -> Any:
        """Pickling (pickle, torch.save, broadcast_object_list): the elements as a CPU tensor,
        rebuilt on the same device by torch's own `_rebuild_device_tensor_from_cpu_tensor`
        (what torch uses for devices whose storage it cannot pickle; torch.load's
        weights_only unpickler allows it). A Parameter stays one (torch's
        `_rebuild_parameter`). Unpickled where no such device exists, `.to(device)` fails
        as torch does there. torch.multiprocessing's pickler sends CUDA IPC handles
        instead (torch/ipc.py)."""
        if self.__dict__.get("_is_param"):
            return (tu._rebuild_parameter, (self.detach(), self.requires_grad, {}))
        _no_host_read(self, "pickling a CUDA tensor")
        host = self._inner.detach().clone()
        return (tu._rebuild_device_tensor_from_cpu_tensor,
                (host, self.dtype, str(self.device), self.requires_grad))


class HostedStorage:
    """What `untyped_storage()` gives for a hosted CUDA tensor: the device bytes' address and
    size (the block's), as torch's CUDA storage reports them; sharing it is not simulated."""

    def __init__(self, t: HostedCudaTensor) -> None:
        st = t._inner.untyped_storage()
        self.device = t.device
        self._nbytes = st.nbytes()
        self._ptr = t._block.device_address(st.data_ptr()) if t._block is not None else 0

    is_cuda = True

    def data_ptr(self) -> int:
        return self._ptr

    def nbytes(self) -> int:
        return self._nbytes

    def size(self) -> int:
        return self._nbytes

    __len__ = size

    def element_size(self) -> int:
        return 1

    def __getattr__(self, name: str) -> Any:
        raise NotImplementedError(f"commsim hosting: UntypedStorage.{name} of a CUDA tensor is "
                                  f"not simulated")

    def __repr__(self) -> str:
        return (f"<commsim hosted CUDA storage of {self._nbytes} bytes at {self._ptr:#x} "
                f"on {self.device}>")


def _no_dlpack() -> None:
    raise NotImplementedError("commsim hosting: DLPack export of a CUDA tensor (how kernel "
                              "libraries take tensors) is not simulated")


def _no_autograd(op: str = "") -> None:
    raise NotImplementedError(f"commsim hosting: autograd on CUDA tensors of a hosted rank "
                              f"is not simulated{' (aten.' + op + ' of a tensor that requires grad)' if op else ''}; "
                              f"run under torch.no_grad() or torch.inference_mode()")


# Ops autograd does not record (an alias or a detached view) or that Module and Parameter
# machinery runs with grad enabled (state_dict detaches).
_NO_GRAD_RECORD = frozenset({"detach", "alias", "lift_fresh"})


def _autograd_refused(name: str, wrappers: list) -> None:
    """Refuse an op autograd would record: an operand requires grad and grad mode is on."""
    if name in _NO_GRAD_RECORD or not torch.is_grad_enabled():
        return
    for w in wrappers:
        if w.__dict__.get("_wants_grad"):
            _no_autograd(name)


def _map(fn: Any, x: Any) -> Any:
    """fn over the leaves of an aten op's arguments (tuples, lists and dicts are all the
    containers an op schema has; torch's pytree costs 4x more per call)."""
    if isinstance(x, (tuple, list)):
        return type(x)(_map(fn, v) for v in x)
    if isinstance(x, dict):
        return {k: _map(fn, v) for k, v in x.items()}
    return fn(x)


def is_hosted_cuda(t: Any) -> bool:
    return isinstance(t, HostedCudaTensor)


def inner_of(t: Any) -> Any:
    """The CPU tensor over a hosted CUDA tensor's bytes (anything else unchanged)."""
    return t._inner if isinstance(t, HostedCudaTensor) else t


def _unwrap_index(index: Any, owner: HostedCudaTensor) -> Any:
    def un(x: Any) -> Any:
        if isinstance(x, HostedCudaTensor):
            if x.device != owner.device:
                _device_mismatch(owner.device, x.device)
            return x._inner
        return x
    return _map(un, index)


def _device_mismatch(a: Any, b: Any) -> None:
    # aten/src/ATen/TensorIterator.cpp (compute_types): the first device seen and the first
    # that differs from it, in operand order.
    raise RuntimeError(f"Expected all tensors to be on the same device, but found at least "
                       f"two devices, {a} and {b}!")


# ---- placing CPU results on a device -------------------------------------------------------

def new_empty(shape: Any, stride: Any, dtype: torch.dtype, device: int,
              storage_offset: int = 0) -> HostedCudaTensor:
    """An uninitialised tensor on cuda:`device` (torch.empty's semantics: nothing written)."""
    r = current()
    item = torch.empty((), dtype=dtype).element_size()
    span = storage_offset + 1 + sum((s - 1) * st for s, st in zip(shape, stride)) \
        if all(s > 0 for s in shape) else 0
    raw, block = torch_memory.allocate(r, device, span * item)
    inner = raw.view(dtype).as_strided(tuple(shape), tuple(stride), storage_offset)
    return HostedCudaTensor(inner, device, block)


def place(cpu: torch.Tensor, device: int) -> HostedCudaTensor:
    """A copy of `cpu` on cuda:`device`: its storage's bytes in a new block, same strides."""
    r = current()
    st = cpu.untyped_storage()
    raw, block = torch_memory.allocate(r, device, st.nbytes())
    if st.nbytes():
        raw.copy_(torch.empty(0, dtype=torch.uint8).set_(st))
    inner = raw.view(cpu.dtype).as_strided(cpu.shape, cpu.stride(), cpu.storage_offset())
    return HostedCudaTensor(inner, device, block)


def _adopt(out: Any, device: int, inputs: list[HostedCudaTensor],
           fresh: dict[int, Any] | None = None) -> Any:
    """Wrap one CPU result: a view of an input keeps that input's block; a new result is
    placed (results sharing one new storage share one new block)."""
    sp = out.untyped_storage().data_ptr()
    if sp:
        for w in inputs:
            if w._inner.untyped_storage().data_ptr() == sp:
                return HostedCudaTensor(out, w.device.index, w._block)
    if fresh is not None and sp:
        hit = fresh.get(sp)
        if hit is not None:
            inner = hit._inner.as_strided(out.shape, out.stride(), out.storage_offset())
            return HostedCudaTensor(inner, device, hit._block)
    w = place(out, device)
    if fresh is not None and sp:
        fresh[sp] = w
    return w


# ---- dispatch ------------------------------------------------------------------------------

def _target(kwargs: dict) -> tuple[dict, Any]:
    """kwargs with a `device` argument replaced by the CPU, and the device asked for."""
    dev = kwargs.get("device")
    if dev is None:
        return kwargs, None
    index = cuda_index(dev)          # validates the ordinal as torch does
    dev = torch.device("cuda", index) if index is not None else torch.device(dev)
    return {**kwargs, "device": torch.device("cpu")}, dev


def _dispatch(func: Any, args: tuple, kwargs: dict) -> Any:
    name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
    namespace = getattr(func, "namespace", "aten")
    if namespace in _OP_NAMESPACES:
        return _OP_NAMESPACES[namespace](func, args, kwargs)
    if namespace not in _OWN_NAMESPACES:
        raise NotImplementedError(
            f"commsim hosting: {func} on a CUDA tensor is not simulated (a compiled "
            f"extension's kernel; only PyTorch's own aten ops run, on the CPU)")
    if name in _NO_OP:
        return None
    if name in _REFUSED:
        raise NotImplementedError(f"commsim hosting: {func} on a CUDA tensor is not simulated")
    flat = leaves((args, kwargs), [])
    wrappers = [x for x in flat if isinstance(x, HostedCudaTensor)]
    _autograd_refused(name, wrappers)
    if name not in _MIXING:
        seen = None
        for x in flat:
            if not isinstance(x, torch.Tensor) or (x.device.type == "cpu" and x.dim() == 0
                                                    and not isinstance(x, HostedCudaTensor)):
                continue
            if seen is None:
                seen = x.device
            elif x.device != seen:
                _device_mismatch(seen, x.device)
    kwargs, target = _target(kwargs)
    new_shape = tuple(args[1]) if name == "resize_" else \
        tuple(args[1].shape) if name == "resize_as_" else None
    if new_shape is not None and new_shape != tuple(args[0].shape):
        raise NotImplementedError(f"commsim hosting: resizing a CUDA tensor ({func}) "
                                  f"is not simulated")
    inner_args, inner_kwargs = _map(inner_of, args), _map(inner_of, kwargs)
    if wrappers and (target is None or target.type == "cuda"):
        # A random op draws from its device's generator (torch/random.py).
        func, inner_kwargs = torch_random.op_with_generator(
            func, inner_kwargs, target.index if target is not None else wrappers[0].device.index)
    cap = _capture(func, name, flat, wrappers, target) if torch_graphs.CAPTURING[0] else None
    if cap is not None and func._schema.is_mutable:
        return cap.record_write(func, args, kwargs, inner_args, inner_kwargs)
    out = func(*inner_args, **inner_kwargs)
    if wrappers and wrappers[0]._block is not None:
        wrappers[0]._block.clock[0] += 1          # the device's op clock (torch/streams.py)
    if target is not None and target.type == "cpu":
        return out                    # moved to the host (.cpu(), .to("cpu"), new_* on cpu)
    device = target.index if target is not None else wrappers[0].device.index
    by_inner = {id(w._inner): w for w in wrappers}
    plain = {id(x): x for x in flat if isinstance(x, torch.Tensor) and not isinstance(x, HostedCudaTensor)}
    fresh: dict[int, Any] = {}

    def wrap(o: Any) -> Any:
        if not isinstance(o, torch.Tensor):
            return o
        w = by_inner.get(id(o))
        if w is not None:              # in place or out=: the tensor that was written
            if tuple(o.shape) != tuple(w.shape) or o.stride() != w.stride():
                raise NotImplementedError(f"commsim hosting: {func} changed the shape of a "
                                          f"CUDA tensor in place; not simulated")
            return w
        if id(o) in plain:            # a CPU tensor written in place (cpu.copy_(cuda))
            return o
        return _adopt(o, device, wrappers, fresh)
    result = _map(wrap, out)
    if cap is not None:
        cap.record_result(func, inner_args, inner_kwargs,
                          [t for t in leaves(result, []) if isinstance(t, HostedCudaTensor)])
    return result


def _capture(func: Any, name: str, flat: list, wrappers: list, target: Any) -> Any:
    """The graph capture that records this op (torch/graphs.py), or None when it runs as
    usual: no capture on its device's capture stream, or a view (no device work)."""
    devices = {w.device.index for w in wrappers}
    if target is not None and target.type == "cuda":
        devices.add(target.index)
    cap = torch_graphs.capture_for(devices)
    if cap is None or torch_graphs.is_viewlike(func, name):
        return None
    if (target is not None and target.type == "cpu") or name == "_local_scalar_dense":
        torch_graphs.host_sync(f"reading a CUDA tensor on the host ({func})")
    if any(isinstance(x, torch.Tensor) and not isinstance(x, HostedCudaTensor) and x.dim() > 0
           for x in flat):
        torch_graphs.host_sync(f"a copy between host and device ({func} with a CPU tensor)")
    return cap


def _no_host_read(t: "HostedCudaTensor", what: str) -> None:
    if torch_graphs.CAPTURING[0] and torch_graphs.capture_for((t.device.index,)) is not None:
        torch_graphs.host_sync(what)
