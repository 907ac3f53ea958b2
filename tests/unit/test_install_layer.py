"""Every change commsim makes to a foreign module goes through the install layer
(commsim/hosting/install/: one patch recorder restores them all). Over the AST of every
module of commsim outside it: no `setattr`/`delattr`
but on `self`, no assignment to an attribute of a foreign module or of anything imported from
one, no `sys.modules[...] = ...` (nor deleting or popping an entry), no change to
`sys.meta_path`. Then the recorder itself: it restores attributes, inherited ones, a module's
class, sys.modules entries and meta-path finders in reverse order, and nested installs of a
surface patch and restore once."""

from __future__ import annotations

import ast
import sys
import types
from pathlib import Path

from commsim.hosting.install.dispatch import not_simulated, per_rank, per_rank_class
from commsim.hosting.install.patches import Patches
from commsim.hosting.install.registry import Surface

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "commsim"
INSTALL = PKG / "hosting" / "install"


def _foreign_names(tree: ast.AST) -> set[str]:
    """Names an import binds to a module outside commsim, or to something taken from one."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if not a.name.startswith("commsim"):
                    out.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and not node.level:
            if not (node.module or "").startswith("commsim"):
                out.update(a.asname or a.name for a in node.names)
    return out


def _root(node: ast.AST) -> ast.AST:
    """The name an attribute chain starts from (a call's result is an object of its own)."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node


def _is_sys(node: ast.AST, attr: str) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == attr
            and isinstance(node.value, ast.Name) and node.value.id == "sys")


def _is_sys_modules(node: ast.AST) -> bool:
    return _is_sys(node, "modules")


def violations(source: str, name: str) -> list[str]:
    tree = ast.parse(source)
    foreign = _foreign_names(tree)
    out: list[str] = []

    def flag(node: ast.AST, what: str) -> None:
        out.append(f"{name}:{node.lineno}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("setattr", "delattr") and node.args:
            target = node.args[0]
            if not (isinstance(target, ast.Name) and target.id == "self"):
                flag(node, f"{node.func.id}({ast.unparse(target)}, ...)")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and (_is_sys(node.func.value, "meta_path") or _is_sys(node.func.value, "path_hooks")
                     or (_is_sys_modules(node.func.value) and node.func.attr in ("pop", "clear", "update"))) \
                and node.func.attr not in ("index", "count", "copy", "get", "keys", "items", "values"):
            flag(node, f"{ast.unparse(node.func)}(...)")
        if isinstance(node, ast.Delete):
            for t in node.targets:
                if isinstance(t, ast.Subscript) and _is_sys_modules(t.value):
                    flag(t, f"del {ast.unparse(t)}")
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        while targets:
            t = targets.pop()
            if isinstance(t, (ast.Tuple, ast.List)):
                targets.extend(t.elts)
            elif isinstance(t, ast.Subscript) and _is_sys_modules(t.value):
                flag(t, f"{ast.unparse(t)} = ...")
            elif isinstance(t, ast.Attribute):
                root = _root(t)
                if isinstance(root, ast.Name) and root.id in foreign:
                    flag(t, f"{ast.unparse(t)} = ... (an attribute of a foreign module)")
    return out


def test_no_module_outside_the_install_layer_patches_a_foreign_module():
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        if INSTALL in path.parents:
            continue
        bad += violations(path.read_text(), str(path.relative_to(ROOT)))
    assert not bad, ("patch foreign modules through commsim.hosting.install (patches.Patches, "
                     "dispatch.per_rank):\n" + "\n".join(bad))


def test_the_check_sees_each_kind_of_patch():
    src = ("import os, sys, weakref\nimport torch.cuda as tc\nfrom ctypes import cdll\n"
           "def f(m):\n"
           "    setattr(m, 'x', 1)\n"
           "    os.getpid = f\n"
           "    tc.memory.stats = f\n"
           "    cdll._dlltype = f\n"
           "    sys.modules['mpi4py'] = m\n"
           "    a, sys.excepthook = 1, f\n"
           "    self_made = object(); self_made.x = 1\n"
           "    weakref.finalize(self_made, f).atexit = False\n"
           "    sys.meta_path.append(m)\n"
           "    del sys.modules['mpi4py']\n"
           "    sys.modules.pop('mpi4py', None)\n"
           "    sys.modules.get('mpi4py'); sys.meta_path.index(m)\n")
    found = violations(src, "p.py")
    assert sorted(int(v.split(":")[1]) for v in found) == [5, 6, 7, 8, 9, 10, 13, 14, 15], found


def test_patches_restore_everything_in_reverse():
    class Base:
        inherited = "base"

    class Target(Base):
        own = "own"

    mod = types.ModuleType("commsim_test_module")
    mod.value = 1
    p = Patches()
    assert p.attr(Target, "own", "x") == "own"
    assert p.attr(Target, "inherited", "y") == "base"
    assert p.attr(mod, "value", 2) == 1 and p.attr(mod, "value", 3) == 2
    assert p.attr(mod, "absent", 4) is None
    p.attr(mod, "__class__", type("Sub", (types.ModuleType,), {}))
    assert p.module("commsim_test_module", mod) is None
    assert p.holds(mod, "value") and sys.modules["commsim_test_module"] is mod
    undone: list[int] = []
    p.on_restore(lambda: undone.append(1))
    p.restore()
    assert undone == [1]
    assert Target.own == "own" and "inherited" not in vars(Target) and Target.inherited == "base"
    assert mod.value == 1 and not hasattr(mod, "absent") and type(mod) is types.ModuleType
    assert "commsim_test_module" not in sys.modules and not p.holds(mod, "value")


def test_a_finder_is_on_the_meta_path_until_restore():
    class Finder:
        @staticmethod
        def find_spec(name: str, path: object = None, target: object = None) -> None:
            return None

    first, last = Finder(), Finder()
    p = Patches()
    p.finder(first, first=True)
    p.finder(last)
    assert sys.meta_path[0] is first and sys.meta_path[-1] is last
    p.restore()
    assert first not in sys.meta_path and last not in sys.meta_path


def test_a_surface_installs_once_however_deep_the_nesting():
    mod = types.ModuleType("m")
    mod.f = "real"
    calls: list[str] = []

    def patch(p: Patches) -> None:
        calls.append("patch")
        p.attr(mod, "f", "fake")

    s = Surface("test", patch)
    s.install()
    s.install()
    s.uninstall()
    assert mod.f == "fake" and calls == ["patch"]
    s.uninstall()
    s.uninstall()                   # one too many: nothing to undo
    assert mod.f == "real"
    s.install()
    assert mod.f == "fake" and calls == ["patch", "patch"]
    s.uninstall()


def test_the_dispatcher_and_the_stand_in():
    rank: list[object] = []
    rank_of = lambda: rank[0] if rank else None          # noqa: E731

    def real(x: int) -> str:
        """The real one."""
        return f"real {x}"

    f = per_rank("real", lambda r, x: f"hosted {r} {x}", real, rank_of, with_rank=True)
    assert f(1) == "real 1" and f.__doc__ == "The real one."
    rank.append("r0")
    assert f(2) == "hosted r0 2"
    cls = per_rank_class("Thing", dict, list, rank_of)
    assert cls() == {} and isinstance([], cls) and isinstance({}, cls)
    rank.clear()
    assert cls() == []
    stand_in = not_simulated("torch.cuda.MemPool", "(use the caching allocator)")
    try:
        stand_in(1, key=2)
    except NotImplementedError as e:
        assert str(e) == "commsim hosting: torch.cuda.MemPool is not simulated (use the caching allocator)"
    else:
        raise AssertionError("the stand-in did not raise")


def test_a_surface_declared_again_while_installed_is_still_restored():
    """A surface module imported a second time (a reload, a purged sys.modules entry)
    declares its surface again while the first declaration is installed: uninstall_all must
    still restore what the first one patched."""
    code = (
        "import types, sys\n"
        "from commsim.hosting.install import registry\n"
        "m = types.ModuleType('m'); m.x = 'real'; sys.modules['m'] = m\n"
        "def patch(p): p.attr(m, 'x', 'fake')\n"
        "registry.register_surface('probe', patch)\n"
        "registry.install_all()\n"
        "registry.register_surface('probe', patch)\n"
        "registry.install_all()\n"
        "assert m.x == 'fake', m.x\n"
        "registry.uninstall_all()\n"
        "print(m.x)\n")
    assert _in_a_fresh_interpreter(code) == "real"


def test_hosting_reverted_behind_the_registry_is_patched_again_at_the_next_install():
    """What pytester's in-process run does: snapshot sys.modules and sys.meta_path, let the
    inner session install hosting, put both back. The registry's flags still say installed;
    the next install_all finds the stand-ins and finders gone and makes them again (before:
    later hosted runs in that process met the real cuda.bindings and no mpi4py)."""
    code = (
        "import sys\n"
        "from commsim.hosting.install.registry import install_all\n"
        "from commsim.hosting.surfaces.table import MODULES\n"
        "import torch\n"
        "from commsim.hosting.install.registry import surfaces\n"
        "surfaces(MODULES)           # imported, not installed, before the snapshot\n"
        "modules, finders = dict(sys.modules), list(sys.meta_path)\n"
        "install_all(MODULES)\n"
        "hosted = sys.modules['cuda.bindings.runtime']\n"
        "sys.modules.clear(); sys.modules.update(modules); sys.meta_path[:] = finders\n"
        "assert sys.modules.get('cuda.bindings.runtime') is not hosted\n"
        "install_all(MODULES)\n"
        "print(sys.modules['cuda.bindings.runtime'] is hosted,\n"
        "      any(type(f).__module__.endswith('mpi4py') for f in sys.meta_path))\n")
    assert _in_a_fresh_interpreter(code) == "True True"


def _in_a_fresh_interpreter(code: str) -> str:
    """The stdout of `code` run by a new interpreter (registry state is per process)."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()
