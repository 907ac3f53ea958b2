"""A backend sees the driver protocol only (the pluggable device layer: the same backend runs on
the simulator and on real CUDA). No module under commsim/backends/,
nor the communicator, policy or discovery, imports the simulator or the device binding, even
indirectly (the static walk follows every import statement, also those inside functions);
importing commsim changes nothing global. Hosting imports nothing above it (launch, scenario,
procs, commands), and its layers import one way: surfaces -> state -> install (that no
import circle is left anywhere in commsim is tests/unit/test_import_cycles.py's). Every
package has a place in one order of layers (LAYERS) and imports nothing above it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "commsim"
FORBIDDEN = ("commsim.sim", "device")


def _module_file(name: str) -> Path | None:
    base = ROOT.joinpath(*name.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.exists():
            return p
    return None


def _imports(name: str, path: Path) -> set[str]:
    """Every module an import statement in `path` names (absolute, dotted)."""
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = pkg.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)   # `from pkg import module`
    return out


def _closure(roots: list[str]) -> dict[str, str]:
    """Module -> the module that first imported it, over commsim and device modules."""
    seen: dict[str, str] = {r: "" for r in roots}
    todo = list(roots)
    while todo:
        name = todo.pop()
        path = _module_file(name)
        if path is None:
            continue
        for dep in _imports(name, path):
            top = dep.split(".")[0]
            if top not in ("commsim", "device") or dep in seen:
                continue
            if _module_file(dep) is None:
                continue            # `from pkg import name` where name is not a module
            seen[dep] = name
            todo.append(dep)
    return seen


def _chain(seen: dict[str, str], mod: str) -> str:
    out = [mod]
    while seen.get(out[-1]):
        out.append(seen[out[-1]])
    return " <- ".join(out)


def _layer_roots() -> list[str]:
    backends = [f"commsim.backends.{p.stem}" for p in (PKG / "backends").glob("*.py") if p.stem != "__init__"]
    return ["commsim.backends", *backends, "commsim.communicator", "commsim.policy", "commsim.discovery"]


def test_backends_communicator_policy_discovery_never_import_sim_or_device():
    seen = _closure(_layer_roots())
    bad = [m for m in seen if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)]
    assert not bad, "\n".join(_chain(seen, m) for m in bad)
    # The walk is not vacuous: it reaches the protocol, the kernels and the runtime.
    assert {"commsim.driver", "commsim.kernels.collectives", "commsim.runtime.scheduler"} <= set(seen)


def test_the_walk_sees_an_indirect_import():
    """The same walk flags the simulator where it is imported (runner -> sim)."""
    seen = _closure(["commsim.scenario.runner"])
    assert "commsim.sim.driver" in seen


def test_importing_the_layer_loads_neither_and_changes_no_global():
    code = (
        "import sys, torch\n"
        "n = torch.get_num_threads()\n"
        "import commsim.communicator, commsim.policy, commsim.discovery\n"
        "from commsim.backends import backends\n"
        "names = tuple(backends())\n"
        "bad = [m for m in sys.modules if m == 'device' or m.startswith(('commsim.sim', 'device.'))]\n"
        "assert not bad, bad\n"
        "assert names[:5] == ('ipc', 'fabric', 'multicast', 'symm', 'nccl'), names\n"
        "import commsim.sim, commsim.scenario.runner, commsim.cli\n"
        "assert torch.get_num_threads() == n, 'an import changed torch threads'\n"
        "print('ok', n)\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env={"PATH": "", "OMP_NUM_THREADS": "2", "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0 and p.stdout.startswith("ok"), p.stdout + p.stderr


# ---- hosting and launch ----------------------------------------------------------------------

ABOVE_HOSTING = ("commsim.launch", "commsim.scenario", "commsim.procs", "commsim.commands")


def _modules(package: str) -> list[str]:
    base = ROOT.joinpath(*package.split("."))
    out = []
    for p in sorted(base.rglob("*.py")):
        parts = p.relative_to(ROOT).with_suffix("").parts
        out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


def _under(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def test_hosting_never_imports_launch_scenario_procs_or_commands():
    seen = _closure(_modules("commsim.hosting"))
    bad = [m for m in seen if _under(m, ABOVE_HOSTING)]
    assert not bad, "\n".join(_chain(seen, m) for m in bad)
    # Not vacuous: the walk reaches the simulator the surfaces answer from.
    assert "commsim.sim.driver" in seen and "commsim.hosting.install.patches" in seen


def test_hosting_layers_import_one_way():
    """install knows no rank and no surface; state knows no surface."""
    rules = {"commsim.hosting.install": ("commsim.hosting.state", "commsim.hosting.surfaces"),
             "commsim.hosting.state": ("commsim.hosting.surfaces",)}
    bad = []
    for layer, forbidden in rules.items():
        seen = _closure(_modules(layer))
        bad += [_chain(seen, m) for m in seen if _under(m, forbidden)]
    assert not bad, "\n".join(bad)


# ---- the whole package: one order of layers ------------------------------------------------

# Lowest first. A module may import its own layer and those below it, never one above (imports
# inside functions count). hosting sits below scenario: a hosted rank is answered from the
# simulator alone; launch, procs and the commands are the applications on top.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("commsim", "commsim.errors", "commsim.util"),    # commsim/__init__.py holds a docstring
    ("commsim.versions",),      # the run's versions: every layer above reads them
    ("commsim.topology",),
    ("commsim.driver", "commsim.runtime"),
    ("commsim.kernels",),
    ("commsim.sim",),
    ("commsim.group",),
    ("commsim.discovery",),
    ("commsim.libmodels",),     # other libraries' behaviour, over what discovery learns
    ("commsim.backends",),
    ("commsim.cost_model", "commsim.policy", "commsim.communicator"),
    ("commsim.hosting",),
    ("commsim.scenario",),
    ("commsim.probe", "commsim.devicecheck", "commsim.procs", "commsim.report"),
    ("commsim.launch",),
    ("commsim.commands", "commsim.cli"),
)


def _layer_of(name: str) -> int | None:
    best = None
    for i, layer in enumerate(LAYERS):
        for p in layer:
            if name == p or (p != "commsim" and name.startswith(p + ".")):
                best = i
    return best


def test_every_module_has_a_layer_and_imports_none_above_it():
    unplaced, bad = [], []
    for name in _modules("commsim"):
        mine = _layer_of(name)
        if mine is None:
            unplaced.append(name)
            continue
        path = _module_file(name)
        for dep in _imports(name, path):
            while dep and _module_file(dep) is None:
                dep = dep.rpartition(".")[0]
            theirs = _layer_of(dep) if dep.startswith("commsim") else None
            if theirs is not None and theirs > mine:
                bad.append(f"{name} (layer {mine}) imports {dep} (layer {theirs})")
    assert not unplaced, "give these a layer in LAYERS: " + ", ".join(unplaced)
    assert not bad, "\n".join(sorted(set(bad)))


def test_the_layer_check_sees_an_upward_import():
    assert _layer_of("commsim.sim.driver") < _layer_of("commsim.scenario.runner")
    assert _layer_of("commsim.hosting.surfaces.nvml") < _layer_of("commsim.launch.run")


def test_a_verb_that_runs_no_kernel_here_does_not_import_torch():
    """torch's import is seconds of CPU: a procs-mode launcher or `topo show` pays none."""
    code = ("import sys\nfrom commsim.cli import main\n"
            "assert main(['topo', 'show', 'hgx-h100-8']) == 0\n"
            "print('torch' in sys.modules, file=sys.stderr)\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env={"PATH": "", "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0 and p.stderr.strip() == "False", p.stderr
