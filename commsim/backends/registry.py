"""The backend registry: every backend is declared once, by its class, and everything else
reads it: the communicator (which class a name runs), the default policy order,
the oracle (each class's `truth` rule and declared limits), the cost model (`algorithms`,
`cost_family`), plots and the sweep report (`colour`), and scenario validation (the names).

Built-in backends are the modules of this package that decorate a class with
`@register_backend`; third-party ones register the same way from their own module, or are
found through the entry-point group `commsim.backends` (an entry point names a Backend
subclass, or a module whose import registers its classes), as Triton finds its backends.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
import re
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Iterator, Mapping, TypeVar

from commsim.errors import UserError

if TYPE_CHECKING:
    from commsim.backends.base import Backend

ENTRY_POINT_GROUP = "commsim.backends"
COST_FAMILIES = ("peer", "lamport", "multimem", "nccl")   # what commsim.cost_model can predict
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_COLOUR = re.compile(r"^#[0-9a-fA-F]{6}$")

_registry: dict[str, type["Backend"]] = {}
# The registry in default order, built on the first ask after a registration: the order is
# each class's declared `order` (then name), read when it is registered, and every policy,
# oracle call and cost-model query asks for it (a sort per ask was ~100 sorts a scenario).
_ordered: "MappingProxyType[str, type[Backend]] | None" = None
_loaded = False
_loading = False

B = TypeVar("B", bound=type)


class BackendDeclarationError(UserError):
    """A backend class that does not declare what the registry needs."""


def register_backend(cls: B) -> B:
    """Declare a backend (usable as a class decorator). Checks the declarations and refuses a
    second class under a name already taken."""
    from commsim.backends.base import Backend
    where = f"{cls.__module__}.{cls.__qualname__}"
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise BackendDeclarationError(f"register_backend({where}): not a commsim.backends.base.Backend "
                                      f"subclass")
    problems = []
    if not isinstance(cls.name, str) or not _NAME.match(cls.name):
        problems.append(f"name = {cls.name!r}: give a lower-case identifier, e.g. name = \"mybackend\"")
    if isinstance(cls.order, bool) or not isinstance(cls.order, int):
        problems.append(f"order = {cls.order!r}: an int, its place in the default policy order "
                        f"(the built-ins run from ipc 10 to nccl 100)")
    if not isinstance(cls.colour, str) or not _COLOUR.match(cls.colour):
        problems.append(f"colour = {cls.colour!r}: a plot colour such as \"#4e79a7\"")
    if cls.cost_family is not None and cls.cost_family not in COST_FAMILIES:
        problems.append(f"cost_family = {cls.cost_family!r}: one of {', '.join(COST_FAMILIES)}, or None "
                        f"(the cost model then does not rank it)")
    if not isinstance(cls.algorithms, tuple) or not all(isinstance(a, str) for a in cls.algorithms):
        problems.append(f"algorithms = {cls.algorithms!r}: a tuple of algorithm names")
    if cls.truth.__func__ is Backend.truth.__func__:
        problems.append("no truth(facts) classmethod: the oracle needs the backend's rule over the "
                        "topology (commsim.topology.truth.GroupFacts), restated from its sources")
    if problems:
        raise BackendDeclarationError(f"backend {where}: " + "; ".join(problems))
    old = _registry.get(cls.name)
    if old is not None and old is not cls:
        raise BackendDeclarationError(f"backend name {cls.name!r} is taken by {old.__module__}."
                                      f"{old.__qualname__}; {where} needs another name")
    global _ordered
    _registry[cls.name] = cls
    _ordered = None
    return cls


def _load() -> None:
    """Import the built-in backend modules, then the entry points, once."""
    global _loaded, _loading
    if _loaded or _loading:
        return
    _loading = True
    try:
        # This package's modules, found from this file (not by importing the package, whose
        # __init__ imports this module).
        for info in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda m: m.name):
            importlib.import_module(f"{__package__}.{info.name}")
        for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            try:
                obj = ep.load()
            except Exception as e:
                raise UserError(f"backend entry point {ep.name} = {ep.value} (group {ENTRY_POINT_GROUP}) "
                                f"failed to load: {type(e).__name__}: {e}; fix or uninstall the "
                                f"package that declares it") from None
            if isinstance(obj, type):
                register_backend(obj)
        _loaded = True
    finally:
        _loading = False


def backends() -> Mapping[str, type["Backend"]]:
    """Every registered backend by name, in default order (`order`, then name); read-only."""
    global _ordered
    _load()
    if _ordered is None:
        _ordered = MappingProxyType(dict(sorted(_registry.items(), key=lambda kv: (kv[1].order, kv[0]))))
    return _ordered


def get_backend(name: str) -> type["Backend"] | None:
    if not _loaded:
        _load()
    return _registry.get(name)


def backend_names() -> tuple[str, ...]:
    return tuple(backends())


def default_order() -> tuple[str, ...]:
    """The default policy's order: every registered backend by its declared `order`."""
    return backend_names()


def fallbacks() -> tuple[str, ...]:
    """Backends legal everywhere (nccl): the oracle appends them when an order leaves them out."""
    return tuple(n for n, c in backends().items() if c.fallback)


def iter_classes() -> Iterator[type["Backend"]]:
    yield from backends().values()
