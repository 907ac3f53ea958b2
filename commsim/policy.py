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

from commsim import cost_model
from commsim.libmodels import nccl_rules
from commsim.backends import default_order
from commsim.backends.base import Backend, Eligibility, Mi
from commsim.discovery import GroupView
from commsim.errors import UserError
from commsim.topology.model import Cluster, GpuRef


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
        return backend.admitted(view, self.params)

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
        return replace(self, fabric=cost_model.with_nccl(cost_model.fabric_from_view(view),
                                                    self._nccl_nvls(nccl_rules.machine_from_view(view))))

    def for_truth(self, cluster: Cluster, placement: Sequence[GpuRef]) -> "ModelPolicy":
        return replace(self, fabric=cost_model.with_nccl(cost_model.group_fabric(cluster, placement), self._nccl_nvls(
            nccl_rules.machine_from_cluster(cluster, placement))))

    def _nccl_nvls(self, machine: "nccl_rules.NcclMachine") -> bool:
        """Whether NCCL may use NVLS here under the policy's NCCL_* variables (NC7)."""
        return nccl_rules.decide(machine, nccl_rules.parse_env(dict(self.params.get("nccl_env", ())))).nvls

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


def _where(spec: str, base_dir: Path | None) -> tuple[str, Path, str, bool]:
    """(module name, file path, attribute, names a .py file) of a `module:object` spec."""
    mod_name, _, attr = spec.partition(":")
    is_file = mod_name.endswith(".py")
    path = Path(mod_name if is_file else mod_name.replace(".", "/") + ".py")
    if base_dir is not None and not path.is_absolute():
        path = base_dir / path
    return mod_name, path, attr, is_file


def runs_code(spec: str | Policy | None, base_dir: Path | None = None) -> str | None:
    """What code resolving `spec` would execute, in words (None for a preset), checked
    without executing it: UserError when the file or module does not exist. `scenario
    check` says this, since a scenario that names a policy file runs code."""
    if spec is None or isinstance(spec, Policy) or ":" not in spec:
        return None
    mod_name, path, _, is_file = _where(spec, base_dir)
    if path.is_file():
        return f"policy file {path}"
    if is_file:
        raise UserError(f"policy {spec!r}: no file {path}; the path is relative to the "
                        f"scenario file's folder")
    top = mod_name.split(".")[0]
    try:
        found = importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise UserError(f"policy {spec!r}: no file {path} and no importable module {top!r}")
    return f"module {mod_name}"


def _load(what: str, run: Any) -> Any:
    """Run a policy's module code; its failures become a UserError naming the file."""
    try:
        return run()
    except SyntaxError as e:
        raise UserError(f"{what}: syntax error at line {e.lineno}: {e.msg}; fix the file") from None
    except (Exception, SystemExit) as e:     # SystemExit too: a policy must not end the run
        kind = "called exit" if isinstance(e, SystemExit) else f"raised {type(e).__name__}"
        raise UserError(f"{what} {kind} while loading: {e}; fix the file (policy files run "
                        f"code when a scenario names them)") from None


def resolve(spec: str | Policy | None, base_dir: Path | None = None) -> Policy:
    """A Policy from a preset name or `module:object` (a .py file next to the scenario). The
    object must be a Policy or a Policy subclass: anything else (a function such as
    `sys:exit`) is refused without being called."""
    if spec is None:
        return Policy()
    if isinstance(spec, Policy):
        return spec
    if ":" not in spec:
        if spec not in PRESET_POLICIES:
            raise UserError(f"unknown policy {spec!r}; presets: {', '.join(PRESET_POLICIES)}, "
                            f"or give module:object")
        return PRESET_POLICIES[spec]()
    what = runs_code(spec, base_dir)
    mod_name, path, attr, _ = _where(spec, base_dir)
    if path.is_file():
        sp = importlib.util.spec_from_file_location(f"commsim_policy_{path.stem}", path)
        if sp is None or sp.loader is None:
            raise UserError(f"policy {spec!r}: {path} is not a Python file")
        mod = importlib.util.module_from_spec(sp)
        _load(what, lambda: sp.loader.exec_module(mod))
    else:
        mod = _load(what, lambda: importlib.import_module(mod_name))
    obj = getattr(mod, attr, None)
    if obj is None:
        raise UserError(f"policy {spec!r}: {what} has no attribute {attr!r}")
    if isinstance(obj, type) and issubclass(obj, Policy):
        obj = _load(f"policy {spec!r}", obj)
    if not isinstance(obj, Policy):
        raise UserError(f"policy {spec!r} is a {type(obj).__name__}, not a commsim.policy.Policy "
                        f"(give an instance or a subclass of it)")
    return obj
