"""The surface table (commsim/hosting/surfaces/table.py) is the one list of surfaces: every
module that registers a surface is in it and every entry registers one; what each entry says
it serves is what its module answers; docs/hosting-surfaces.md carries the generated table;
tests/hosting/sim_ranks.py installs its surfaces from it."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import sim_ranks as S
from sim_ranks import module_surfaces  # noqa: F401  (fixture)
from commsim.hosting.install import registry
from commsim.hosting.surfaces import table

ROOT = Path(__file__).resolve().parents[2]
SURFACES = ROOT / "commsim" / "hosting" / "surfaces"


def _registering_modules() -> set[str]:
    """Surface modules whose top level calls register_surface or wrap_torch_distributed."""
    out = set()
    for path in SURFACES.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            call = node.value if isinstance(node, ast.Expr) else None
            if isinstance(call, ast.Call) and getattr(call.func, "id", "") in (
                    "register_surface", "wrap_torch_distributed"):
                rel = path.relative_to(ROOT).with_suffix("")
                out.add(".".join(rel.parts))
    return out


def test_every_registering_module_is_in_the_table_and_no_other():
    assert set(table.MODULES) == _registering_modules()
    assert len(set(table.MODULES)) == len(table.MODULES)


def test_each_entry_registers_a_surface_and_serves_something():
    before = set(registry.surfaces())
    for e in table.TABLE:
        assert table.served(e), f"{e.module}: the table lists nothing it serves"
    assert len(registry.surfaces(table.MODULES)) >= len(table.MODULES) > 0
    assert before <= set(registry.surfaces())


@pytest.mark.parametrize("entry", table.TABLE, ids=[e.module.rsplit(".", 1)[-1] for e in table.TABLE])
def test_served_and_stand_in_names_do_not_overlap(entry):
    served, stand = table.served(entry), table.not_simulated(entry)
    for mod, names in stand.items():
        both = set(names) & set(served.get(mod, ()))
        assert not both, f"{entry.module}: {mod} {sorted(both)} both served and not simulated"


def test_a_served_function_is_the_surface_s_and_every_surface_function_is_listed(module_surfaces):
    """What the installed stand-ins answer for, read back from the foreign side: the hosted
    cuda-python module's implementations, the fake libraries' C functions, torch.cuda's
    patched names. A name served but absent from the table, or listed but not served, fails."""
    from commsim.hosting.install import fakelib
    from commsim.hosting.surfaces.cuda import bindings

    def listed(short: str) -> dict[str, list[str]]:
        return table.served(next(e for e in table.TABLE if e.module.endswith(short)))

    _, (rank,) = S.ranks("hgx-h100-8", [(0, 0)])
    got = {name: sorted(mod.__dict__["_impl"]) for name, mod in bindings._STANDIN.items()}
    want = listed("cuda.bindings")
    for name in got:      # the table lists what the module implements, the stand-in what the
        # installed binding also has: every implemented name the binding has is served
        assert set(got[name]) <= set(want[name]), sorted(set(got[name]) - set(want[name]))
    for short, soname, key in (("cuda.cudart", "libcudart.so.13", "libcudart"),
                               ("nvml", "libnvidia-ml.so.1", "libnvidia-ml"),
                               ("nccl.libnccl", "libnccl.so.2", "libnccl")):
        lib = S.solo(rank, lambda: fakelib.lookup(soname))
        assert lib is not None, soname
        assert sorted(lib._functions) == listed(short)[key], soname
    import torch.cuda
    want = listed("torch.cuda")["torch.cuda"]
    missing = [n for n in want if not hasattr(torch.cuda, n)]
    assert not missing, f"the table lists torch.cuda names torch lacks: {missing}"


def test_sim_ranks_installs_the_table_s_module_surfaces():
    want = [importlib.import_module(e.module) for e in table.TABLE if not e.needs_launcher]
    assert list(S.MODULE_SURFACES) == want


def test_docs_surface_table_is_the_generated_one():
    text = table.DOC.read_text()
    assert text == table.doc_with_table(text), (
        "regenerate: python -m commsim.hosting.surfaces.table --write")
