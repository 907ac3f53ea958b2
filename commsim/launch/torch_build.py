"""Which torch a hosted run's ranks run on, for the verdict's header.

The ranks run the launcher's own interpreter (procs: `sys.executable`; inproc: this process),
so the torch it would import is theirs. Hosting serves a simulated machine over either build
(the CPU build, or a CUDA build on a machine without a driver) and the two differ in what
their compiled parts do (docs/hosting.md, "CPU and CUDA builds of torch"), so a result names
the one it ran on. Read from the installed package's `torch/version.py` (the build writes
`__version__`, `cuda`, `hip` there as literals: tools/generate_torch_version.py in PyTorch)
without importing torch: the launcher of a program that never loads torch does not pay
seconds of CPU for the header.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import os

__all__ = ["torch_build", "describe", "version_fields"]


def describe(fields: dict[str, object]) -> str:
    """"torch 2.13.0+cpu (CPU build)", "torch 2.14.0 (CUDA 13.0 build)" from version.py's
    literals (`__version__`, `cuda`, `hip`)."""
    version = fields.get("__version__") or "(version unknown)"
    if fields.get("cuda"):
        kind = f"CUDA {fields['cuda']} build"
    elif fields.get("hip"):
        kind = f"ROCm/HIP {fields['hip']} build"
    else:
        kind = "CPU build"
    return f"torch {version} ({kind})"


def version_fields(path: str) -> dict[str, object]:
    """The names a torch/version.py assigns literals to (`__version__`, `cuda`, `hip` ...)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    out: dict[str, object] = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 \
            else node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and isinstance(node.value, ast.Constant):
            out[target.id] = node.value.value
    return out


@functools.lru_cache(maxsize=1)
def torch_build() -> str:
    """The torch the ranks import, as `describe` words it; "no torch" where none is
    installed, "torch (build unknown)" where its version.py cannot be read."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return "no torch"
    for where in spec.submodule_search_locations:
        path = os.path.join(where, "version.py")
        try:
            return describe(version_fields(path))
        except (OSError, SyntaxError, ValueError):
            continue
    return "torch (build unknown)"
