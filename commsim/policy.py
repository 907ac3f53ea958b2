"""Policies: which backends are tried, in what order, for an op and a message size.

The default policy is correct by construction: a backend is admitted only if its
`eligibility` over the group-agreed discovery view holds, i.e. every ordered pair of ranks can
import the handle type it uses and every rank meets its device requirements. A scenario may
name another policy (a preset name here, or `module:object`) to reproduce a shortcut.

Presets: "default" tries the admitted backends in a fixed order; "model" admits the same ones
and tries them fastest first by the cost model (`commsim.cost_model`) at each message size.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from . import cost_model
from .backends import default_order
from .backends.base import Backend, Eligibility, Mi
from .discovery import GroupView
from .errors import UserError
from .topology.model import Cluster, GpuRef


@dataclass
class Policy:
    name: str = "default"
    # The registry's order (each backend declares its place): peer-pointer backends first
    # (lowest latency), then multicast, then symmetric memory (which takes the sizes beyond
    # the others' workspaces, up to its own), then the fallback.
    order: tuple[str, ...] = field(default_factory=default_order)
    params: dict[str, Any] = field(default_factory=lambda: {"max_size": 8 * Mi})
    # On a set-up failure: fall back to the next backend (True) or fail the communicator.
    fallback_on_setup_error: bool = True

    def admit(self, backend: type[Backend], view: GroupView) -> Eligibility:
        return backend.eligibility(view, self.params)

    def candidates(self, op: str, nbytes: int) -> tuple[str, ...]:
        return self.order

    def for_group(self, view: GroupView) -> "Policy":
        """The policy as one group's communicator applies it, given what discovery found. A
        fixed order does not depend on the group, so the default returns itself."""
        return self

    def for_truth(self, cluster: Cluster, placement: Sequence[GpuRef]) -> "Policy":
        """The same from the topology's ground truth, for the oracle."""
        return self


# Ops the cost model predicts; the others keep the fixed order.
_MODELLED_OPS = ("all_reduce", "all_reduce_rmsnorm")


@dataclass
class ModelPolicy(Policy):
    """Admits what the default admits; tries the admitted backends fastest first by the
    model's predicted all-reduce time at the message size. Each backend's own `accepts` limits
    (its workspace) still apply in that order, so a faster backend that refuses a size hands
    it to the next. Bound to a group, it holds the fabric the model sees: from discovery in
    the communicator (`for_group`), from the topology in the oracle (`for_truth`)."""

    name: str = "model"
    fabric: cost_model.GroupFabric | None = None

    def for_group(self, view: GroupView) -> "ModelPolicy":
        return replace(self, fabric=cost_model.fabric_from_view(view))

    def for_truth(self, cluster: Cluster, placement: Sequence[GpuRef]) -> "ModelPolicy":
        return replace(self, fabric=cost_model.group_fabric(cluster, placement))

    def candidates(self, op: str, nbytes: int) -> tuple[str, ...]:
        if self.fabric is None or op not in _MODELLED_OPS:
            return self.order
        # Backends the model has no algorithm for follow the modelled ones, in their order.
        modelled = cost_model.backend_algorithms()
        known = [b for b in self.order if b in modelled]
        rest = tuple(b for b in self.order if b not in modelled)
        return cost_model.ordered_by_model(known, nbytes, self.fabric) + rest


# Built when named, so a backend registered later is in the order.
PRESET_POLICIES: dict[str, type[Policy]] = {"default": Policy, "model": ModelPolicy}


def resolve(spec: str | Policy | None, base_dir: Path | None = None) -> Policy:
    """A Policy from a preset name or `module:object` (a .py file next to the scenario)."""
    if spec is None:
        return Policy()
    if isinstance(spec, Policy):
        return spec
    if ":" not in spec:
        if spec not in PRESET_POLICIES:
            raise UserError(f"unknown policy {spec!r}; presets: {', '.join(PRESET_POLICIES)}, "
                            f"or give module:object")
        return PRESET_POLICIES[spec]()
    mod_name, _, attr = spec.partition(":")
    path = Path(mod_name if mod_name.endswith(".py") else mod_name.replace(".", "/") + ".py")
    if base_dir is not None and not path.is_absolute():
        path = base_dir / path
    if path.exists():
        sp = importlib.util.spec_from_file_location(f"commsim_policy_{path.stem}", path)
        mod = importlib.util.module_from_spec(sp)
        sp.loader.exec_module(mod)
    else:
        try:
            mod = importlib.import_module(mod_name)
        except ImportError as e:
            raise UserError(f"policy {spec!r}: no file {path} and no module {mod_name!r} ({e})")
    obj = getattr(mod, attr, None)
    if obj is None:
        raise UserError(f"policy {spec!r}: {mod_name} has no attribute {attr!r}")
    pol = obj() if callable(obj) and not isinstance(obj, Policy) else obj
    if not isinstance(pol, Policy):
        raise UserError(f"policy {spec!r} is a {type(pol).__name__}, not a commsim.policy.Policy")
    return pol
