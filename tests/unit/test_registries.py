"""Registries: a backend and a fault kind added from outside the package,
editing no commsim module, run in a scenario; the docs' fault table is the registry's.

The plugins are installed in a temporary directory put on PYTHONPATH of a fresh interpreter:
a package plus a .dist-info whose entry_points.txt declares the backend in the
`commsim.backends` group (how a pip-installed plugin is found), or a script that calls
`register_backend` / `register_fault` itself."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import dataclasses
import textwrap
from pathlib import Path

import pytest

from commsim.backends import BackendDeclarationError, backends, default_order, register_backend
from commsim.backends.nccl import NcclBackend
from commsim.scenario import fault_keys, fault_registry, faults as F
from commsim.scenario.model import Fault
from commsim.scenario.schema import ScenarioError, loads

ROOT = Path(__file__).resolve().parents[2]

# A backend of its own: a gather over the group, tried first, legal wherever there are peers.
PLUGIN = '''
import torch
from commsim.backends.base import Backend, Eligibility


class GatherBackend(Backend):
    name = "plugin_gather"
    order, colour = 5, "#123456"
    algorithms, cost_family = (), None

    @classmethod
    def eligibility(cls, view, params):
        return Eligibility.check([(view.size > 1, "a group of one rank")])

    @classmethod
    def truth(cls, facts):
        return None if facts.ws > 1 else "a group of one rank"

    def algorithm(self, op, nbytes):
        return "gather"

    def run(self, op, x):
        self.round += 1
        xs = self.group.all_gather_object(x.float().numpy(), tag=f"gather.{op} {self.round}")
        ts = [torch.from_numpy(a) for a in xs]
        if op == "all_gather":
            return torch.cat(ts).to(x.dtype)
        s = sum(ts).to(x.dtype)
        return s.reshape(-1).chunk(self.ws)[self.rank].clone() if op == "reduce_scatter" else s
'''

SCENARIO = '''
[scenario]
name = "plugin"
seed = 3

[topology]
preset = "hgx-h100-8"

[placement]
ranks = 4

[[group]]
name = "tp"
ranks = "0..3"

[workload]
ops = ["all_reduce", "all_gather"]
sizes = ["4KiB"]
dtypes = ["bfloat16", "float32"]

[[expect]]
group = "tp"
backend = "plugin_gather"
'''


def _run(tmp: Path, code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp), str(ROOT)]), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=240)


def test_a_backend_found_by_entry_point_runs_a_scenario(tmp_path):
    pkg = tmp_path / "commsim_gather"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(PLUGIN)
    dist = tmp_path / "commsim_gather-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: commsim-gather\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[commsim.backends]\nplugin_gather = commsim_gather:GatherBackend\n")
    (tmp_path / "plugin.toml").write_text(SCENARIO)
    p = _run(tmp_path, """
        import sys
        from commsim.backends import default_order
        from commsim.cli import main
        assert default_order()[0] == "plugin_gather", default_order()
        sys.exit(main(["run", "plugin.toml"]))
        """)
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(r"^ok\s+must pass\s+plugin\s+hgx-h100-8\s+4\s+tp\s+plugin_gather\s", p.stdout, re.M), p.stdout
    # The plugin module lives outside commsim: nothing under commsim/ names it (the backend's
    # name is not the bare word "gather", which torch.distributed's op list in hosting holds).
    assert not [f for f in (ROOT / "commsim").rglob("*.py")
                if re.search(r"GatherBackend|commsim_gather|plugin_gather", f.read_text())]


def test_a_backend_registered_by_call_is_chosen_legal_and_judged_clean(tmp_path):
    (tmp_path / "gather_plugin.py").write_text(PLUGIN)
    p = _run(tmp_path, f"""
        from commsim.backends import register_backend
        from commsim.scenario.oracle import judge
        from commsim.scenario.runner import run_scenario
        from commsim.scenario.schema import loads
        import gather_plugin
        register_backend(gather_plugin.GatherBackend)
        sc = loads({SCENARIO!r}, "plugin.toml")
        res = run_scenario(sc)
        v = judge(sc, res)
        assert res.ok and v.ok, (res.failures, v.render())
        assert set(res.backends.values()) == {{"plugin_gather"}}, res.backends
        assert all(legal[0] == "plugin_gather" for legal in v.legal.values()), v.legal
        print("chosen", sorted(set(res.backends.values())))
        """)
    assert p.returncode == 0 and "chosen ['plugin_gather']" in p.stdout, p.stdout + p.stderr


def test_a_fault_kind_registered_from_outside_applies_and_is_judged(tmp_path):
    """A machine fault defined in a user's module: FABRIC handles off on one GPU. Across two
    GB200 trays the group then cannot use fabric (nor multicast / symm, which need FABRIC
    across hosts): the communicator falls back to nccl and the oracle agrees."""
    (tmp_path / "fault_plugin.py").write_text(textwrap.dedent('''
        import dataclasses
        from commsim.scenario.faults import MACHINE, FaultKind, register_fault

        def _no_fabric_handle(cluster, f):
            return cluster.replace_gpu(f.gpu, fabric_handle=False)

        register_fault(FaultKind(
            "no_fabric_handle", ("gpu",), MACHINE,
            "the GPU reports HANDLE_TYPE_FABRIC_SUPPORTED = 0", "V2",
            apply=_no_fabric_handle))
        '''))
    sc_text = SCENARIO.replace('preset = "hgx-h100-8"', 'preset = "gb200-nvl72"\nhosts = 2') \
        .replace("ranks = 4", "ranks = 8").replace('"0..3"', '"0..7"') \
        .replace('backend = "plugin_gather"', 'backend = "nccl"') \
        + '\n[[fault]]\nkind = "no_fabric_handle"\ngpu = "gb200-nvl72-tray01/2"\n'
    p = _run(tmp_path, f"""
        import fault_plugin
        from commsim.scenario.oracle import judge
        from commsim.scenario.runner import run_scenario
        from commsim.scenario.schema import loads
        sc = loads({sc_text!r}, "fault.toml")
        assert [f.kind for f in sc.faults] == ["no_fabric_handle"]
        assert not sc.cluster.gpu(sc.faults[0].gpu).fabric_handle
        res = run_scenario(sc)
        v = judge(sc, res)
        assert res.ok and v.ok, (res.failures, v.render())
        assert set(res.backends.values()) == {{"nccl"}}, res.backends
        print("fell back to", sorted(set(res.backends.values())))
        """)
    assert p.returncode == 0 and "fell back to ['nccl']" in p.stdout, p.stdout + p.stderr


def test_docs_fault_table_is_the_registry():
    doc = (ROOT / "docs" / "scenario-format.md").read_text().splitlines()
    start = doc.index("| `kind` | Keys | Models | Row |")
    table = doc[start:start + 2 + len(F.fault_kinds())]
    assert table == list(F.docs_table()), "regenerate the table: " + "\n".join(F.docs_table())
    assert not doc[start + 2 + len(F.fault_kinds())].startswith("|")


def test_registry_refuses_incomplete_or_clashing_declarations():
    class NoTruth(NcclBackend):
        name, order, colour = "no_truth", 50, "#000000"
        truth = classmethod(lambda cls, facts: None)

    class Clash(NoTruth):
        name = "nccl"

    class Undeclared(NcclBackend.__mro__[1]):   # Backend itself: nothing declared
        name = "undeclared"

        @classmethod
        def eligibility(cls, view, params):
            return None

        def run(self, op, x):
            return x

    with pytest.raises(BackendDeclarationError, match="taken by commsim.backends.nccl"):
        register_backend(Clash)
    with pytest.raises(BackendDeclarationError, match="order = None.*colour = None.*truth"):
        register_backend(Undeclared)
    assert "no_truth" not in backends() and default_order()[-1] == "nccl"
    with pytest.raises(Exception, match="keys must be fields of Fault"):
        F.register_fault(F.FaultKind("bad", ("temperature",), F.MACHINE, "", apply=lambda c, f: c))
    with pytest.raises(Exception, match="causes = .* exactly when it takes the key cause"):
        F.register_fault(F.FaultKind("no_causes", ("host", "cause"), F.MACHINE, "", apply=lambda c, f: c))
    assert "bad" not in F.kind_names() and "no_causes" not in F.kind_names()


def test_every_fault_key_is_declared_with_its_example_and_parser():
    """Fault's fields are the [[fault]] keys: each declares the example its "missing" message
    shows and the parser the loader runs, and every key some kind takes is one of them."""
    keys = {f.name: f for f in dataclasses.fields(Fault) if f.name != "kind"}
    for name, f in keys.items():
        assert fault_keys.example(f).startswith(f"{name} = "), name
        assert callable(f.metadata["parse"]), name
    taken = {k for kind in F.fault_kinds().values() for k in kind.fields + kind.optional}
    assert taken == set(keys), f"keys no kind takes, or kinds' keys Fault lacks: {set(keys) ^ taken}"


def test_a_kind_from_outside_with_a_cause_is_read_by_the_declared_parser():
    """A kind that takes `cause` brings its causes; the loader's message lists them."""
    kind = F.FaultKind("link_flaky_test", ("host", "gpus", "cause"), F.MACHINE, "", apply=lambda c, f: c,
                       causes=("slow", "lossy"))
    F.register_fault(kind)
    try:
        base = '[scenario]\nname = "x"\n[topology]\npreset = "hgx-h100-8"\n[[fault]]\n' \
               'kind = "link_flaky_test"\nhost = "hgx-h100-0"\ngpus = [0, 1]\n'
        sc = loads(base + 'cause = "lossy"\n', "x.toml")
        assert sc.faults[0].cause == "lossy" and sc.faults[0].gpus == (0, 1)
        with pytest.raises(ScenarioError, match=r"x.toml: \[\[fault\]\] #1 cause: unknown "
                                                r"link_flaky_test cause 'loud'.*accepted: slow, lossy"):
            loads(base + 'cause = "loud"\n', "x.toml")
    finally:
        fault_registry._kinds.pop("link_flaky_test")
