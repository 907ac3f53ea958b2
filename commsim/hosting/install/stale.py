"""References to real modules that hosting replaces, taken before it was installed.

A surface that replaces a whole module (cuda.bindings.driver / .runtime) puts its stand-in in
sys.modules and on the parent package; a module imported earlier that did `from cuda.bindings
import driver` keeps the real one, and a rank calling through it reaches the real library: on
a machine without a GPU, the real binding's "driver not found", with nothing saying why. The
hosting bootstrap installs before any user code runs, so a launched process never has such
references; an interpreter that imported user code first (pytest collecting a test module
before an in-process run, a test module with a `commsim` marker and no --commsim-machine) may.
`stale_references()` finds them, the modules and the functions taken by name (`from
cuda.bindings.driver import cuInit`), so the caller can run the ranks as fresh processes
instead, where the bootstrap comes first.
"""

from __future__ import annotations

import sys
import warnings
from types import ModuleType
from typing import Iterable

from commsim.hosting.install.registry import replaced_modules

# commsim's own modules hold the real modules on purpose (a stand-in forwards to them).
_OWN = "commsim"


def _functions(real: dict[str, ModuleType]) -> dict[int, str]:
    """id -> dotted name of each function defined in a replaced module."""
    out: dict[int, str] = {}
    for name, mod in real.items():
        for attr, value in vars(mod).items():
            if (callable(value) and not isinstance(value, type)
                    and getattr(value, "__module__", None) == name):
                out.setdefault(id(value), f"{name}.{attr}")
    return out


def _module_of(value: object) -> ModuleType | None:
    """The module a global leads to: itself, or the module a function or class is from."""
    if isinstance(value, ModuleType):
        return value
    try:
        name = getattr(value, "__module__", None) if callable(value) else None
    except Exception:          # a proxy whose attribute lookup raises: nothing to follow
        return None
    return sys.modules.get(name) if isinstance(name, str) else None


def stale_references(roots: Iterable[ModuleType]) -> list[str]:
    """'<module>.<name> is the real <module or function>' for each global that is a module an
    installed surface replaced, or a function of one, in the modules reachable from `roots`
    (a test's module and its conftests) through their globals: the modules they hold, and
    those of the functions and classes they hold. commsim's modules are not followed."""
    real = replaced_modules()
    if not real:
        return []
    targets = {**_functions(real), **{id(m): n for n, m in real.items()}}
    todo = list(roots)
    found: list[str] = []
    with warnings.catch_warnings():      # deprecated globals warn when looked at (torch's)
        warnings.simplefilter("ignore")
        _walk(todo, set(real), targets, found)
    return sorted(found)


def _walk(todo: list[ModuleType], skip: set[str], targets: dict[int, str],
          found: list[str]) -> None:
    """Walk from `todo` over module globals; `skip`: the replaced modules' names (the real
    modules and the stand-ins under them, which hold the real ones)."""
    seen: set[int] = set()
    while todo:
        mod = todo.pop()
        name = getattr(mod, "__name__", "")
        if id(mod) in seen or name in skip or name.split(".")[0] == _OWN:
            continue
        seen.add(id(mod))
        for attr, value in list(vars(mod).items()):
            what = targets.get(id(value))
            if what is not None:
                found.append(f"{name}.{attr} is the real {what}")
                continue
            nxt = _module_of(value)
            if nxt is not None and id(nxt) not in seen:
                todo.append(nxt)
