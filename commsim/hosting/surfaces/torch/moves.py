"""`t.data = v` across the host and a hosted device: how nn.Module moves its parameters.

`nn.Module.cuda()`, `.to("cuda")`, `.cpu()`, `.half()` and `.to(dtype)` make each parameter's
new tensor and then, keeping the parameter object (optimizers and user code hold it), set
`param.data = new` (torch/nn/modules/module.py, Module._apply, when
`torch._has_compatible_shallow_copy_type` holds and swapping is off, the default). On a CUDA
build that re-points the parameter's TensorImpl at the new storage and device in place.

A hosted CUDA tensor is a wrapper subclass whose elements live in a Python attribute
(torch/tensors.py), so no in-place re-pointing of the C++ object can make a CPU tensor one,
or change the dtype of one. What does the same for the program is
`torch.utils.swap_tensors` (the mechanism Module._apply itself uses for wrapper subclasses
under `torch.__future__.set_swap_module_params_on_conversion`): the object keeps its
identity and gets the class, attributes and C++ tensor of an alias of `v`. Kept across the
swap, as `.data =` keeps them: the object's own attributes (vLLM puts its weight loaders
there), its `requires_grad`, and its being a Parameter (`isinstance(p, nn.Parameter)`,
which torch answers from `_is_param` for tensor subclasses: torch/nn/parameter.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import Parameter

from commsim.hosting.surfaces.torch.tensors import HostedCudaTensor

# What the wrapper keeps in __dict__ (tensors.HostedCudaTensor): the alias brings its
# own; the program's attributes come from the object being moved.
_WRAPPER_STATE = frozenset({"_inner", "_block", "_wants_grad", "_is_param"})


def set_data(func: Any, self: Any, value: Any) -> Any:
    """`self.data = value` when either side is a hosted CUDA tensor (both sides on the host
    are torch's own `func`)."""
    hosted_self, hosted_value = isinstance(self, HostedCudaTensor), isinstance(value, HostedCudaTensor)
    if not hosted_self and not hosted_value:
        return func(self, value)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"Variable data has to be a tensor, but got {type(value).__name__}")
    is_param = isinstance(self, Parameter)
    wants_grad = bool(self.requires_grad)
    with torch.no_grad():
        alias = value.detach()
    own = {k: v for k, v in self.__dict__.items() if k not in _WRAPPER_STATE}
    if hosted_value:
        alias.__dict__.update(own)
        alias.__dict__["_wants_grad"] = wants_grad
        if is_param:
            alias.__dict__["_is_param"] = True       # Parameter-ness of a tensor subclass
    else:
        # Back on the host: a real CPU tensor (a Parameter if it was one), autograd and all.
        alias = torch.Tensor._make_subclass(Parameter if is_param else torch.Tensor, alias, wants_grad)
        alias.__dict__.update(own)
    try:
        torch.utils.swap_tensors(self, alias)
    except RuntimeError as e:
        # swap_tensors refuses a tensor other objects hold at the C++ level (a live autograd
        # graph, a view) or one with weak references: torch's in-place re-pointing has no
        # such limit, so it is this simulation's.
        raise NotImplementedError(
            f"commsim hosting: Tensor.data = <tensor on {value.device}> of a tensor on "
            f"{value.device if hosted_self and not hosted_value else 'cpu'} could not be done "
            f"in place here ({e}); make the tensor on its device instead") from None
    return None
