"""Where a hosted rank's CUDA tensors come from: factories with `device=`, `.cuda()`, `.to()`.

The CPU build refuses every way of making a CUDA tensor at its first step (torch.cuda's
lazy init: "Torch not compiled with CUDA enabled"). Installed, this surface puts one
`TorchFunctionMode` on torch's mode stack; in a hosted rank it answers
- any torch function given a CUDA `device=` ("cuda", "cuda:N", torch.device("cuda", N), an
  int N; None in "cuda" means the rank's current device, as torch does): torch.empty /
  empty_strided / new_empty allocate without writing; every other factory (zeros, ones,
  full, rand, randn, randint, arange, tensor, *_like, new_*, ...) runs on the CPU and its
  result is placed on the device (torch_tensors.place);
- `Tensor.cuda(...)`, `Tensor.to(...)` towards a CUDA device (a no-op when nothing changes,
  as in torch); `.cpu()` / `.to("cpu")` of a CUDA tensor reach the tensor's dispatch;
- pinned host memory (`pin_memory()`, `pin_memory=True`): not simulated, fails naming itself.
Random factories draw from the device's generator of the rank (torch_random.py; a GPU draws
from its Philox stream: the values differ from a real run's, their distribution does not).

Everywhere else (outside a hosted rank) the mode passes every call through unchanged, and a
process that never imports torch never loads any of this. The mode stack is per thread:
a thread the program starts itself makes no CUDA tensors (torch's own error).
"""

from __future__ import annotations

from typing import Any

from commsim.hosting.state.session import hosted
from commsim.hosting.install.nesting import nested
from commsim.hosting.install.registry import register_surface, when_imported

_mode: list[Any] = []          # the one mode instance, once torch is imported
_active = [False]


def _is_ordinal(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _cuda_index(dev: Any) -> int | None:
    """The device index a `device=` argument names when it is a CUDA device, else None."""
    import torch
    if _is_ordinal(dev):
        d = torch.device("cuda", dev)
    elif isinstance(dev, (str, torch.device)):
        d = torch.device(dev)
    else:
        return None
    if d.type != "cuda":
        return None
    from commsim.hosting.surfaces.torch import cuda as torch_cuda
    torch_cuda._lazy_init()
    index = torch_cuda.current_device() if d.index is None else d.index
    if not 0 <= index < torch_cuda.device_count():
        raise torch.AcceleratorError("CUDA error: invalid device ordinal" + torch_cuda._CHECK_TAIL)
    return index


def _not_pinned() -> None:
    raise NotImplementedError("commsim hosting: pinned host memory (Tensor.pin_memory, "
                              "pin_memory=True) is not simulated")


def _factory(func: Any, index: int, args: tuple, kwargs: dict) -> Any:
    import torch
    from commsim.hosting.surfaces.torch.tensors import HostedCudaTensor, new_empty, place
    if kwargs.get("pin_memory"):
        _not_pinned()
    if kwargs.get("requires_grad"):
        # A flag on the tensor only (torch_tensors.HostedCudaTensor.requires_grad_).
        made = _factory(func, index, args, {k: v for k, v in kwargs.items() if k != "requires_grad"})
        return made.requires_grad_() if isinstance(made, HostedCudaTensor) else made
    direct = func in (torch.empty, torch.empty_strided, torch.Tensor.new_empty, torch.zeros,
                      torch.ones, torch.full)
    if direct and "out" not in kwargs and not any(isinstance(a, HostedCudaTensor) for a in args):
        # Made in place on the device: no host-sized temporary (a 128 MiB workspace stays
        # uncommitted until written when it is torch.empty).
        meta = func(*args, **{**kwargs, "device": "meta"})      # shape, strides, dtype only
        t = new_empty(meta.shape, meta.stride(), meta.dtype, index)
        if func is torch.zeros or func is torch.ones or func is torch.full:
            value = int(func is torch.ones) if func is not torch.full else \
                kwargs["fill_value"] if "fill_value" in kwargs else args[1]
            # Through the dispatch: a fill inside a CUDA graph capture is recorded, not run.
            torch.ops.aten.fill_.Scalar(t, value)
        return t
    from commsim.hosting.surfaces.torch.graphs import check_no_host_copy
    check_no_host_copy(index, f"{getattr(func, '__name__', func)}(device=cuda) (made on the host, "
                              f"then copied)")
    from commsim.hosting.surfaces.torch.random import factory_kwargs
    out = func(*args, **{**factory_kwargs(func, kwargs, index), "device": torch.device("cpu")})
    return place(out, index) if isinstance(out, torch.Tensor) else out


def _to(func: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """Tensor.to towards a CUDA device; anything else is torch's own."""
    import torch
    from commsim.hosting.surfaces.torch.tensors import HostedCudaTensor, inner_of, place
    copy = bool(kwargs.get("copy", False))
    rest = {k: v for k, v in kwargs.items() if k != "copy"}
    # An int names a CUDA ordinal here; torch's parser would ask for an accelerator.
    if _is_ordinal(rest.get("device")):
        rest["device"] = torch.device("cuda", rest["device"])
    if args and _is_ordinal(args[0]):
        args = (torch.device("cuda", args[0]), *args[1:])
    device, dtype, _non_blocking, memory_format = torch._C._nn._parse_to(*args, **rest)
    index = _cuda_index(device) if device is not None else None
    if index is None:
        return func(self, *args, **kwargs)
    same = isinstance(self, HostedCudaTensor) and self.device.index == index
    if same and not copy and (dtype is None or dtype == self.dtype) and \
            memory_format in (None, torch.preserve_format):
        return self
    if not isinstance(self, HostedCudaTensor):
        from commsim.hosting.surfaces.torch.graphs import check_no_host_copy
        check_no_host_copy(index, "Tensor.to(cuda) of a CPU tensor")
    src = inner_of(self)
    moved = src.to(dtype=dtype or src.dtype, memory_format=memory_format or torch.preserve_format,
                   copy=True)
    out = place(moved, index)
    _record_device_copy(self, out)
    return out


def _record_device_copy(src: Any, out: Any) -> None:
    """A device-to-device `.to()` inside a CUDA graph capture: replay copies again."""
    from commsim.hosting.surfaces.torch import graphs as torch_graphs
    if torch_graphs.CAPTURING[0]:
        cap = torch_graphs.capture_for((src.device.index, out.device.index))
        if cap is not None:
            cap.work.append(lambda: out._inner.copy_(src._inner))


def _cuda(func: Any, self: Any, device: Any = None, non_blocking: bool = False,
          memory_format: Any = None) -> Any:
    import torch
    index = _cuda_index("cuda" if device is None else device)
    if index is None:
        raise RuntimeError(f"Invalid device, must be cuda device, got {device}")
    kw = {} if memory_format is None else {"memory_format": memory_format}
    return _to(torch.Tensor.to, self, torch.device("cuda", index), **kw)


def _pin(func: Any, *args: Any, **kwargs: Any) -> Any:
    _not_pinned()


def _make_mode() -> Any:
    import torch
    from torch.overrides import TorchFunctionMode

    methods = {torch.Tensor.to: _to, torch.Tensor.cuda: _cuda, torch.Tensor.pin_memory: _pin}
    data_descriptor = torch._C.TensorBase.data

    class HostedCudaMode(TorchFunctionMode):
        """CUDA tensors for hosted ranks (module docstring); a pass-through elsewhere."""

        def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if not _active[0] or hosted() is None:
                return func(*args, **kwargs)
            special = methods.get(func)
            if special is not None:
                return special(func, *args, **kwargs)
            if getattr(func, "__self__", None) is data_descriptor and func.__name__ == "__set__":
                from commsim.hosting.surfaces.torch.moves import set_data
                return set_data(func, *args)
            dev = kwargs.get("device")
            if dev is not None:
                index = _cuda_index(dev)
                if index is not None:
                    return _factory(func, index, args, kwargs)
            if kwargs.get("pin_memory"):
                _not_pinned()
            return func(*args, **kwargs)

    return HostedCudaMode()


def _empty_kernel(name: str) -> Any:
    """The CUDA kernel of a factory that PyTorch's C++ calls inside composite ops (torch.where
    with a Python scalar makes its scalar a tensor on the operands' device): the CPU build
    has none. In a hosted rank it allocates on the device; elsewhere it fails as before."""
    def kernel(*args: Any, **kwargs: Any) -> Any:
        import torch
        from commsim.hosting.surfaces.torch.tensors import new_empty
        if hosted() is None or not _active[0]:
            raise NotImplementedError(f"Could not run 'aten::{name}' with arguments from the "
                                      f"'CUDA' backend (a CPU-only build of torch)")
        device = kwargs.pop("device", None)
        index = _cuda_index(device if device is not None else "cuda")
        kwargs.pop("pin_memory", None)
        meta = getattr(torch.ops.aten, name.split(".")[0]).__getattr__(
            name.split(".")[1] if "." in name else "default")(*args, device="meta", **kwargs)
        return new_empty(meta.shape, meta.stride(), meta.dtype, index)
    return kernel


_CUDA_FACTORIES = ("empty.memory_format", "empty_strided")


def _guard_dlpack(torch: Any) -> None:
    """torch.utils.dlpack.to_dlpack of a CUDA tensor would export a capsule whose pointer no
    kernel can use: refused in a hosted rank, naming itself."""
    import torch.utils.dlpack as dl
    real = dl.to_dlpack

    def to_dlpack(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        from commsim.hosting.surfaces.torch.tensors import HostedCudaTensor, _no_dlpack
        if isinstance(tensor, HostedCudaTensor):
            _no_dlpack()
        return real(tensor, *args, **kwargs)
    dl.to_dlpack = to_dlpack
    # Import of a CUDA capsule (a library's hand-made one over device memory): a hosted CUDA
    # tensor over the rank's bytes (surfaces/torch/dlpack.py); both from_dlpack paths call it.
    from commsim.hosting.surfaces.torch import dlpack as torch_dlpack
    if not getattr(torch._C._from_dlpack, "__commsim_dlpack__", False):
        torch._C._from_dlpack = torch_dlpack.from_dlpack_of(torch._C._from_dlpack)


def _push(torch_module: Any) -> None:
    if not _active[0] or _mode:
        return
    import torch
    lib = torch.library.Library("aten", "IMPL")        # noqa: TOR901 (kept for the process)
    for name in _CUDA_FACTORIES:
        lib.impl(name, _empty_kernel(name), "CUDA")
    _guard_dlpack(torch)
    _mode.append(_make_mode())
    _mode.append(lib)
    _mode[0].__enter__()      # stays on this thread's mode stack for the process's life


def _install() -> None:
    _active[0] = True
    when_imported("torch", _push)


def _uninstall() -> None:
    # The mode stays on the stack (something may sit above it) but passes everything through.
    _active[0] = False


install, uninstall = nested(_install, _uninstall)
register_surface("torch CUDA tensors", install, uninstall)
