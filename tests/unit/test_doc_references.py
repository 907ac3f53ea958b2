"""README.md and docs/*.md name only code that exists: every repository path they write
(`commsim/scenario/faults.py`, `tests/unit/`, `device/kernels/*.cu`) is there, and every dotted
`commsim.x.y` name is a module, or a name a module defines or imports at its top level."""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
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


# -- behaviour rows ------------------------------------------------------------------------------
# Code, docs, scenarios and tests cite the rules they follow by row id ("row L8", "rows V2-V8",
# a conformance case "L3/H3", a fault kind's "L10, N1"). Each id must be a row of exactly one
# table in docs/*.md, so a reader can look it up; the rows live nowhere else.
# The prefixes in use; a table may add one (its ids then count as citations too).
ROW_PREFIXES = ("LC", "CG", "FX", "AL", "RN", "FH", "AW", "NC", "MC", "GM", "TV", "TN",
                "P", "N", "T", "I", "S", "H", "W", "L", "V", "M", "F", "X", "B", "G")
_TABLE_ROW = re.compile(r"^\|\s*([A-Z]{1,3})(\d{1,2})\s*\|", re.M)
_RANGE = re.compile(r"^([A-Z]+)(\d+)-\1(\d+)$")
_CODE_SUFFIXES = (".py", ".md", ".toml", ".cu", ".cuh", ".h", ".c", ".sh", ".txt")
_CODE_TOPS = ("commsim", "device", "docs", "scenarios", "examples", "tests", "scripts", "benchmarks")


@dataclass(frozen=True)
class RowSyntax:
    """What a row id and a citation of ids look like, for a set of prefixes."""

    id: re.Pattern[str]
    cited: re.Pattern[str]     # "row L8", "rows P1-P4, L3/H3 and B15" (wrapping onto a "# " line)
    quoted: re.Pattern[str]    # "L10, N1" or "L4/freed" in code


def row_syntax(prefixes: frozenset[str]) -> RowSyntax:
    one = r"(?<![\w.])(?:" + "|".join(sorted(prefixes, key=len, reverse=True)) + r")\d{1,2}(?!\w)"
    sep = r"[\s#]*(?:,[\s#]*(?:and|or)\s+|,|/|-|–|\band\b|\bor\b)[\s#]*"
    many = one + r"(?:" + sep + one + r")*"
    return RowSyntax(re.compile(one), re.compile(r"\brows?\s+(" + many + r")"),
                     re.compile(r"""["'](""" + many + r""")(?:/[\w-]+)?["']"""))


SYNTAX = row_syntax(frozenset(ROW_PREFIXES))


def repository_texts() -> list[Path]:
    files = [ROOT / "README.md"]
    for top in _CODE_TOPS:
        files += sorted(p for p in (ROOT / top).rglob("*") if p.is_file() and p.suffix in _CODE_SUFFIXES)
    return files


def expand(citation: str, syntax: RowSyntax = SYNTAX) -> list[str]:
    """The ids one citation names: "P1-P4" -> P1..P4, "L3/H3" -> L3, H3."""
    out: list[str] = []
    for part in re.split(r"[\s#]*(?:,|/|\band\b|\bor\b)[\s#]*", citation):
        part = re.sub(r"[\s#]", "", part).replace("–", "-")
        m = _RANGE.match(part)
        if m:
            out += [f"{m[1]}{n}" for n in range(int(m[2]), int(m[3]) + 1)]
        elif part:
            out += syntax.id.findall(part)
    return out


def cited_rows(path: Path, text: str, syntax: RowSyntax = SYNTAX) -> set[str]:
    ids: set[str] = set()
    for m in syntax.cited.finditer(text):
        ids.update(expand(m.group(1), syntax))
    if path.suffix == ".py":
        for m in syntax.quoted.finditer(text):
            ids.update(expand(m.group(1), syntax))
    if path.suffix == ".md":      # a docs table names rows bare: "(= L6)", "V3 by analogy"
        for line in text.splitlines():
            if line.startswith("|"):
                ids.update(syntax.id.findall(line))
    return ids


def row_definitions() -> dict[str, list[str]]:
    """Row id -> the docs that define it (the first cell of a table row)."""
    defs: dict[str, list[str]] = {}
    for doc in DOCS:
        for m in _TABLE_ROW.finditer(doc.read_text()):
            defs.setdefault(m.group(1) + m.group(2), []).append(str(doc.relative_to(ROOT)))
    return defs


def undefined_rows() -> list[str]:
    defs = row_definitions()
    syntax = row_syntax(frozenset(ROW_PREFIXES) | {re.match(r"[A-Z]+", row)[0] for row in defs})
    out = [f"{row} defined in {len(where)} tables: {', '.join(where)}"
           for row, where in sorted(defs.items()) if len(where) > 1]
    for path in repository_texts():
        for row in sorted(cited_rows(path, path.read_text(errors="replace"), syntax)):
            if row not in defs:
                out.append(f"{path.relative_to(ROOT)}: row {row} is defined in no docs table")
    return out


def test_every_cited_row_is_defined_in_exactly_one_docs_table() -> None:
    bad = undefined_rows()
    assert not bad, "define these rows in docs/*.md (or fix the citation):\n" + "\n".join(bad)


def test_the_row_scan_reads_each_citation_form() -> None:
    text = ('# rows P1-P3, L3/H3 and B15\n# (rows L5-L10,\n#  V2-V8)\nx = "L10, N1"\n'
            'case("L4/freed", ...)\n# a T4 card, an H100, P2P, F16\n| x | (= L6) |\n')
    assert cited_rows(Path("a.py"), text) == {"P1", "P2", "P3", "L3", "H3", "B15", "L4", "L10", "N1",
                                               *[f"L{n}" for n in range(5, 11)],
                                               *[f"V{n}" for n in range(2, 9)]}
    assert cited_rows(Path("a.md"), text) >= {"L6"}
    assert "T4" not in cited_rows(Path("a.py"), text)


# -- pointers out of the repository --------------------------------------------------------------
# A citation names a public source or a file of this repository. Section marks ("§3") are
# allowed only after the in-repository document they number ("docs/fidelity-rules.md §9").
_OUTSIDE = ("reference §", "reference row", "design rule", "design.md", "domain.md", "/work/",
            "shared/reference", "shared/data")   # matched in lower case
_SECTION = re.compile(r"§\s*\d")
_SECTION_OF_A_DOC = re.compile(r"\.md,?\s+(?:§\s*[\d.]+(?:,\s*)?)+$")


def _points_outside(text: str) -> bool:
    low = text.lower()
    return any(word in low for word in _OUTSIDE)


def points_outside(line: str) -> bool:
    """A pointer to a document outside the repository, or a section mark of no named .md."""
    return _points_outside(line) or any(not _SECTION_OF_A_DOC.search(line[:m.end()])
                                        for m in _SECTION.finditer(line))


def outside_pointers() -> list[str]:
    here = Path(__file__).resolve()
    out = []
    for path in repository_texts():
        text = path.read_text(errors="replace")
        if path.resolve() == here or ("§" not in text and not _points_outside(text)):
            continue
        for i, line in enumerate(text.splitlines(), 1):
            if points_outside(line):
                out.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    return out


def test_no_file_points_outside_the_repository() -> None:
    bad = outside_pointers()
    assert not bad, ("cite the public source or the in-repository row instead of these "
                     "pointers:\n" + "\n".join(bad))


def test_the_pointer_check_tells_an_outside_section_from_an_inside_one() -> None:
    assert points_outside("(reference §6.4, row G3)") and points_outside("see §2.5")
    assert points_outside("(DESIGN.md §2)") and points_outside("shared/data/nccl-topologies/")
    assert not points_outside("Sources: docs/fidelity-rules.md §9 and the tables")
    assert not points_outside("docs/fidelity-rules.md §3.") and not points_outside("row V9")
