"""README.md and docs/*.md name only code that exists: every repository path they write
(`commsim/scenario/faults.py`, `tests/unit/`, `device/kernels/*.cu`) is there, and every dotted
`commsim.x.y` name is a module, or a name a module defines or imports at its top level."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = ("commsim", "device", "tests", "scripts", "benchmarks", "scenarios", "examples", "docs")
# A path starts at a top-level folder and is not the tail of a longer word or path; a rate
# such as "340 scenarios/s" is prose, not the folder.
_PATH = re.compile(r"(?<![\w/.-])((?:" + "|".join(TOP) + r")/[\w./*-]*[\w*/])")
_RATE = re.compile(r"^scenarios/s$")
_DOTTED = re.compile(r"(?<![\w./])(commsim(?:\.[A-Za-z_]\w*)+)")


def _module_file(parts: list[str]) -> Path | None:
    base = ROOT.joinpath(*parts)
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.exists():
            return p
    return None


@functools.lru_cache(maxsize=None)
def _top_level_names(path: Path) -> frozenset[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
    return frozenset(names)


def dotted_name_resolves(name: str) -> bool:
    """A module, or module.attribute (further attributes of it are not checked)."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        path = _module_file(parts[:k])
        if path is not None:
            return k == len(parts) or parts[k] in _top_level_names(path)
    return False


def path_resolves(path: str) -> bool:
    return any(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()


def stale_references() -> list[str]:
    out = []
    for doc in DOCS:
        text = doc.read_text()
        where = doc.relative_to(ROOT)
        for m in _PATH.finditer(text):
            p = m.group(1).rstrip(".")
            if not _RATE.match(p) and not path_resolves(p):
                out.append(f"{where}: path {p}")
        for m in _DOTTED.finditer(text):
            n = m.group(1)
            if not dotted_name_resolves(n):
                out.append(f"{where}: name {n}")
    return out


def test_docs_name_only_paths_and_modules_that_exist() -> None:
    stale = stale_references()
    assert not stale, "rename or drop these references:\n" + "\n".join(stale)


def test_the_check_tells_a_gone_module_from_a_present_one() -> None:
    assert dotted_name_resolves("commsim.scenario.faults.register_fault")
    assert dotted_name_resolves("commsim.topology.importers")
    assert not dotted_name_resolves("commsim.scenario.faults.no_such_name")
    assert not dotted_name_resolves("commsim.caching_allocator")
    assert path_resolves("commsim/scenario/fault_keys.py") and path_resolves("device/kernels/*.cu")
    assert not path_resolves("commsim/hosting/run.py")
