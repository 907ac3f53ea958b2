"""The scenario TOML loader: valid files, fault application, value parsing, and the messages
of malformed files (each must name the file, the field and what is accepted)."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

from commsim.errors import UserError
from commsim.scenario.faults import is_driver_fault
from commsim.scenario.model import Scenario
from commsim.scenario.schema import ScenarioError, load, loads, write_scenario
from commsim.topology.model import FabricState, GpuRef, NVML_ERROR_UNKNOWN, TopologyError, ZERO_UUID
from commsim.topology.presets import PRESETS, build

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "scenarios").rglob("*.toml"))

H100 = '[scenario]\nname = "t"\n[topology]\npreset = "hgx-h100-8"\n'
GB2 = '[scenario]\nname = "t"\n[topology]\npreset = "gb200-nvl72"\nhosts = 2\n'
TP = '[[group]]\nname = "tp"\nranks = "0..7"\n'


def write(tmp_path: Path, text: str, name: str = "s.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# -- valid files ---------------------------------------------------------------------------
def test_every_preset_has_a_shipped_topology_scenario() -> None:
    names = {p.stem for p in (ROOT / "scenarios" / "topologies").glob("*.toml")}
    assert names == set(PRESETS)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_scenario_loads(path: Path) -> None:
    s = load(path)
    assert isinstance(s, Scenario) and s.path == path and s.name
    assert s.groups and s.workload.ops
    if path.parent.name == "topologies":
        assert s.topology_spec == path.stem
        assert s.world_size == build(path.stem).num_gpus
        assert path.read_text().startswith("# Machine:")


def test_defaults_world_group_and_cluster_order_placement() -> None:
    s = loads(H100, "x.toml")
    assert s.world_size == 8 and s.topology_spec == "hgx-h100-8"
    assert [g.name for g in s.groups] == ["world"] and s.groups[0].ranks == tuple(range(8))
    assert s.placement == tuple(GpuRef("hgx-h100-0", i) for i in range(8))
    assert (s.policy, s.seed, s.description, s.path) == ("default", 0, "", None)
    assert s.workload.sizes == (4096,) and s.workload.dtypes == ("bfloat16",)


def test_preset_slice_and_partial_placement() -> None:
    s = loads(GB2 + "[placement]\nranks = 6\n", "x.toml")
    assert s.topology_spec == "gb200-nvl72:2" and len(s.cluster.hosts) == 2
    assert s.world_size == 6
    assert s.placement[4] == GpuRef("gb200-nvl72-tray01", 0)


def test_explicit_placement_accepts_both_gpu_spellings() -> None:
    s = loads(GB2 + '[placement]\ngpus = ["gb200-nvl72-tray01/gpu3", "gb200-nvl72-tray00/0"]\n',
              "x.toml")
    assert s.placement == (GpuRef("gb200-nvl72-tray01", 3), GpuRef("gb200-nvl72-tray00", 0))
    assert s.groups[0].ranks == (0, 1)


@pytest.mark.parametrize("ranks, expected", [
    ('"0..7"', tuple(range(8))),
    ('" 2 .. 4 "', (2, 3, 4)),
    ('"5..5"', (5,)),
    ("[3, 1, 2]", (3, 1, 2)),  # the listed order is the group's rank order
])
def test_group_ranks(ranks: str, expected: tuple[int, ...]) -> None:
    s = loads(H100 + f'[[group]]\nname = "g"\nranks = {ranks}\n', "x.toml")
    assert s.group("g").ranks == expected


@pytest.mark.parametrize("size, expected", [
    ("8192", 8192), ('"4KiB"', 4096), ('"1MiB"', 1 << 20), ('"2GiB"', 2 << 30),
    ('"512B"', 512), ('"4096"', 4096), ('" 16 KiB "', 16384),
])
def test_sizes(size: str, expected: int) -> None:
    s = loads(H100 + f"[workload]\nsizes = [{size}]\n", "x.toml")
    assert s.workload.sizes == (expected,)


def test_full_workload() -> None:
    s = loads(H100 + '[workload]\nops = ["all_gather", "all_reduce"]\nsizes = ["4KiB", 8]\n'
              'dtypes = ["float32", "float16"]\ngraph_capture = true\ndiscard_capture = true\n'
              'iterations = 3\n', "x.toml")
    w = s.workload
    assert w.ops == ("all_gather", "all_reduce") and w.sizes == (4096, 8)
    assert w.dtypes == ("float32", "float16") and w.graph_capture and w.discard_capture
    assert w.iterations == 3


def fault(kind: str, **fields: str) -> str:
    return "[[fault]]\n" + f'kind = "{kind}"\n' + "".join(f"{k} = {v}\n" for k, v in fields.items())


T0, T1 = "gb200-nvl72-tray00", "gb200-nvl72-tray01"


def test_imex_missing_empties_that_hosts_channels() -> None:
    s = loads(GB2 + fault("imex_missing", host=f'"{T1}"'), "x.toml")
    assert s.cluster.host(T1).imex_channels == ()
    assert s.cluster.host(T0).imex_channels == (0,)
    assert [f.kind for f in s.faults] == ["imex_missing"] and s.faults[0].host == T1


def test_fabric_faults() -> None:
    s = loads(GB2 + fault("fabric_state", gpu=f'"{T0}/1"', state='"in_progress"')
              + fault("fabric_status_error", gpu=f'"{T0}/2"')
              + fault("zero_cluster_uuid", gpu=f'"{T1}/0"'), "x.toml")
    c = s.cluster
    assert c.gpu(GpuRef(T0, 1)).fabric.state == FabricState.IN_PROGRESS
    assert s.faults[0].state == "IN_PROGRESS"  # stored canonical
    g2 = c.gpu(GpuRef(T0, 2)).fabric
    assert g2.state == FabricState.COMPLETED and g2.status == NVML_ERROR_UNKNOWN
    assert c.gpu(GpuRef(T1, 0)).fabric.cluster_uuid == ZERO_UUID
    assert c.gpu(GpuRef(T1, 1)).fabric.cluster_uuid != ZERO_UUID


def test_status_error_keeps_a_state_set_before_it() -> None:
    s = loads(GB2 + fault("fabric_state", gpu=f'"{T0}/1"', state='"NOT_STARTED"')
              + fault("fabric_status_error", gpu=f'"{T0}/1"'), "x.toml")
    fab = s.cluster.gpu(GpuRef(T0, 1)).fabric
    assert fab.state == FabricState.NOT_STARTED and fab.status == NVML_ERROR_UNKNOWN


def test_link_and_multicast_faults() -> None:
    s = loads(H100 + fault("p2p_disabled", host='"hgx-h100-0"', gpus="[2, 5]")
              + fault("no_multicast", gpu='"hgx-h100-0/3"')
              + fault("nvlinks_down", gpu='"hgx-h100-0/4"'), "x.toml")
    c = s.cluster
    a, b = GpuRef("hgx-h100-0", 2), GpuRef("hgx-h100-0", 5)
    assert not c.p2p(a, b) and not c.p2p(b, a) and c.p2p(a, GpuRef("hgx-h100-0", 4))
    assert s.faults[0].gpus == (2, 5)
    assert not c.gpu(GpuRef("hgx-h100-0", 3)).multicast
    assert not c.gpu(GpuRef("hgx-h100-0", 4)).nvlinks_up


def test_driver_faults_are_kept_not_applied() -> None:
    s = loads(H100 + fault("oom", rank="3", at_allocation="2")
              + fault("call_fails", rank="1", api='"cudaIpcOpenMemHandle"',
                      code='"cudaErrorInvalidResourceHandle"', nth="2"), "x.toml")
    assert s.cluster == build("hgx-h100-8")
    oom, call = [f for f in s.faults if is_driver_fault(f)]
    assert (oom.rank, oom.at_allocation) == (3, 2)
    assert (call.rank, call.api, call.code, call.nth) == (
        1, "cudaIpcOpenMemHandle", "cudaErrorInvalidResourceHandle", 2)


def test_expectations() -> None:
    s = loads(H100 + TP + '[workload]\nsizes = ["4KiB"]\n'
              '[[expect]]\nbackend = "ipc"\nsize = 4096\nop = "all_reduce"\n'
              '[[expect]]\nerror = "CUDA_ERROR_NOT_PERMITTED"\nstep = "init"\nrank = 7\n'
              '[[expect]]\nleak = true\n', "x.toml")
    be, err, leak = s.expectations
    assert (be.group, be.backend, be.size, be.op) == ("tp", "ipc", 4096, "all_reduce")
    assert (err.error, err.step, err.rank, err.group) == ("CUDA_ERROR_NOT_PERMITTED", "init", 7, None)
    assert leak.leak and leak.backend is None


def test_scenario_table_fields() -> None:
    s = loads('[scenario]\nname = "a.b_c-1"\ndescription = "d"\nseed = 42\n'
              'policy = "policies/vllm_pre_fix.py:POLICY"\n[topology]\npreset = "rtx4090-8"\n', "x")
    assert (s.name, s.description, s.seed, s.policy) == (
        "a.b_c-1", "d", 42, "policies/vllm_pre_fix.py:POLICY")


@pytest.mark.parametrize("policy", ["default", "vllm-pre-55835", "mypkg.policies:SHORTCUT",
                                    "p.py:P", "../shared/pol.py:make_policy"])
def test_policy_shapes_accepted(policy: str) -> None:
    assert loads(H100.replace('name = "t"', f'name = "t"\npolicy = "{policy}"'), "x").policy == policy


def test_docs_example_loads() -> None:
    text = (ROOT / "docs" / "scenario-format.md").read_text()
    block = re.search(r"## A complete example\n\n```toml\n(.*?)```", text, re.S).group(1)
    s = loads(block, "docs example")
    assert s.world_size == 8 and len(s.faults) == 2 and len(s.expectations) == 3
    assert s.cluster.host(T1).imex_channels == ()


# -- explicit matrix topology (delegated to the nvidia-smi importer) -----------------------
def fake_importer(monkeypatch: pytest.MonkeyPatch, fn) -> list:
    calls: list = []
    mod = types.ModuleType("commsim.topology.importers.nvidia_smi")

    def cluster_from_matrix_table(table, source, warnings=None):
        calls.append((table, source))
        if warnings is not None:
            warnings.append("assumed something")
        return fn(table)

    mod.cluster_from_matrix_table = cluster_from_matrix_table
    monkeypatch.setitem(sys.modules, "commsim.topology.importers.nvidia_smi", mod)
    return calls


MATRIX = ('[scenario]\nname = "m"\n[topology]\nhosts = 2\nhost_prefix = "node"\n'
          'gpu_model = "NVIDIA H100"\ndomain = "rack"\nmatrix = [["X", "NV18"], ["NV18", "X"]]\n')


def test_matrix_topology_is_delegated(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_importer(monkeypatch, lambda t: build("gb200-nvl72:2"))
    s = loads(MATRIX, "m.toml")
    assert calls[0][1] == "m.toml" and calls[0][0]["host_prefix"] == "node"
    assert s.topology_spec == "matrix x2 (rack)" and s.world_size == 8
    assert s.extra["topology_warnings"] == ["assumed something"]


def test_matrix_topology_error_is_prefixed(monkeypatch: pytest.MonkeyPatch) -> None:
    def bad(t):
        raise TopologyError("matrix row 1 has 3 cells, expected 2")

    fake_importer(monkeypatch, bad)
    with pytest.raises(ScenarioError, match=r"^m\.toml: \[topology\]: matrix row 1 has 3 cells"):
        loads(MATRIX, "m.toml")


def test_matrix_topology_rejects_unknown_key(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_importer(monkeypatch, lambda t: build("hgx-h100-8"))
    with pytest.raises(ScenarioError, match="unknown key 'gpu_modle' \\(did you mean 'gpu_model'"):
        loads(MATRIX + 'gpu_modle = "x"\n', "m.toml")


TRAY = ('[scenario]\nname = "m"\n[topology]\nhosts = 2\nhost_prefix = "tray"\nmatrix = """\n'
        '\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\n'
        'GPU0\t X \tNV18\tNV18\tNV18\t0-71\nGPU1\tNV18\t X \tNV18\tNV18\t0-71\n'
        'GPU2\tNV18\tNV18\t X \tNV18\t72-143\nGPU3\tNV18\tNV18\tNV18\t X \t72-143\n"""\n')


def test_real_matrix_import_and_faults_on_its_hosts() -> None:
    s = loads(TRAY + '[[fault]]\nkind = "imex_missing"\nhost = "tray-1"\n', "m.toml")
    assert s.topology_spec == "matrix x2 (rack)" and s.world_size == 8
    assert s.cluster.host("tray-0").imex_channels == (0,)
    assert s.cluster.host("tray-1").imex_channels == ()
    assert s.extra["topology_warnings"]  # the inferred domain and GPU model are reported


def test_real_matrix_rows_form_without_nvlink() -> None:
    s = loads('[scenario]\nname = "m"\n[topology]\ndomain = "none"\n'
              'matrix = [["X", "PIX"], ["PIX", "X"]]\n', "m.toml")
    assert s.topology_spec == "matrix x1 (none)" and s.world_size == 2


def test_real_matrix_error_is_not_prefixed_twice() -> None:
    with pytest.raises(ScenarioError) as info:
        loads('[scenario]\nname = "m"\n[topology]\nmatrix = [["X", "FOO"], ["FOO", "X"]]\n',
              "m.toml")
    msg = str(info.value)
    assert msg.startswith("m.toml: [topology] matrix") and msg.count("m.toml: ") == 1
    assert "unknown cell 'FOO'" in msg and "NV<count>" in msg


# -- malformed files -----------------------------------------------------------------------
# (id, file text, fragments that must all appear in the message after "<file>: ").
BAD = [
    ("toml-syntax", '[scenario]\nname = \n', ["line 2, column 8: TOML syntax error"]),
    ("toml-syntax-eof", '[scenario]\nname = "t"\n[topology]\npreset = ', ["line 4 (end of file): TOML syntax error"]),
    ("missing-name", '[scenario]\ndescription = "x"\n[topology]\npreset = "hgx-h100-8"\n',
     ["[scenario] name: missing", 'e.g. name = "']),
    ("missing-scenario", '[topology]\npreset = "hgx-h100-8"\n', ["[scenario]: missing", 'name = "my-scenario"']),
    ("missing-topology", '[scenario]\nname = "t"\n', ["[topology]: missing", 'preset = "hgx-h100-8"']),
    ("unknown-table", H100 + "[wrokload]\nops = []\n",
     ["[wrokload]: unknown table (did you mean 'workload'?)", "accepted tables: [scenario], [topology]", "[[expect]]"]),
    ("table-not-array", H100 + '[group]\nname = "tp"\n', ["[[group]]: must be an array of tables", "write [[group]]"]),
    ("array-not-table", '[[scenario]]\nname = "t"\n[topology]\npreset = "hgx-h100-8"\n',
     ["[scenario]: must be one table", "write [scenario] (single brackets)"]),
    ("stray-top-level-key", 'name = "t"\n' + H100.replace('name = "t"\n', ''),
     ["name: a top-level key outside any table (did you mean [scenario] name?)"]),
    ("unknown-key", H100 + '[workload]\nsizez = ["4KiB"]\n',
     ["[workload]: unknown key 'sizez' (did you mean 'sizes'?)", "accepted keys: ops, sizes, dtypes"]),
    ("bad-name", '[scenario]\nname = "my scenario"\n[topology]\npreset = "hgx-h100-8"\n',
     ["[scenario] name: 'my scenario' is not a name of letters, digits"]),
    ("negative-seed", H100.replace('name = "t"', 'name = "t"\nseed = -1'),
     ["[scenario] seed: seed -1 is out of range; accepted: >= 0"]),
    ("bad-policy", H100.replace('name = "t"', 'name = "t"\npolicy = "pol.py:"'),
     ["[scenario] policy: policy 'pol.py:' is not a policy reference", '"module:object"', '"default"']),
    ("bad-policy-dotted-attr", H100.replace('name = "t"', 'name = "t"\npolicy = "m:a.b"'),
     ["[scenario] policy: policy 'm:a.b'"]),
    ("unknown-preset", '[scenario]\nname = "t"\n[topology]\npreset = "hgx-h100-16"\n',
     ["[topology] preset: unknown preset 'hgx-h100-16' (did you mean 'hgx-h100-8'?)",
      "accepted: hgx-h100-8, hgx-h200-8, dgx-b200-8, gb200-nvl72"]),
    ("no-preset-no-matrix", '[scenario]\nname = "t"\n[topology]\nhosts = 2\n',
     ['[topology]: needs preset = "<name>" (one of hgx-h100-8,', "matrix = [...]"]),
    ("hosts-slice-too-large", '[scenario]\nname = "t"\n[topology]\npreset = "gb200-nvl72"\nhosts = 19\n',
     ["[topology] hosts: host count 19 is out of range; accepted: 1..18 (preset gb200-nvl72 has 18 hosts)"]),
    ("hosts-wrong-type", '[scenario]\nname = "t"\n[topology]\npreset = "gb200-nvl72"\nhosts = "2"\n',
     ["[topology] hosts: expected an integer, got string '2'"]),
    ("preset-and-matrix", H100 + 'matrix = [["X"]]\n', ["[topology]: give either preset", "not both"]),
    ("matrix-key-with-preset", H100 + 'gpu_model = "x"\n',
     ["[topology] gpu_model: only an explicit matrix topology takes", "accepted keys are preset, hosts"]),
    ("world-larger-than-gpus", H100 + "[placement]\nranks = 9\n",
     ["[placement] ranks: world size 9 is larger than the cluster's 8 GPUs; accepted: 1..8"]),
    ("bad-placement-gpu-index", H100 + '[placement]\ngpus = ["hgx-h100-0/0", "hgx-h100-0/9"]\n',
     ["[placement] gpus: GPU 'hgx-h100-0/9': host hgx-h100-0 has GPUs 0..7"]),
    ("bad-placement-gpu-shape", H100 + '[placement]\ngpus = ["hgx-h100-0:1"]\n',
     ["[placement] gpus: GPU 'hgx-h100-0:1' is not \"host/index\"", 'e.g. "hgx-h100-0/0"']),
    # A GPU placed twice is several processes on one GPU (accepted); a rank whose own GPU
    # its CUDA_VISIBLE_DEVICES hides is not.
    ("placement-visible-hides-own-gpu", H100 + '[placement]\ngpus = ["hgx-h100-0/1"]\nvisible = ["0,-1,1"]\n',
     ["[placement] visible: rank 0 drives hgx-h100-0/1, which its process does not see (it sees [0])"]),
    ("placement-length-mismatch", H100 + '[placement]\nranks = 3\ngpus = ["hgx-h100-0/1"]\n',
     ["[placement] gpus: lists 1 GPU(s) but ranks = 3"]),
    ("rank-out-of-range", H100 + '[[group]]\nname = "tp"\nranks = [0, 8]\n',
     ["[[group]] #1 ranks: rank 8 is out of range; accepted: 0..7 (world size 8)"]),
    ("range-out-of-range", H100 + '[[group]]\nname = "tp"\nranks = "0..8"\n',
     ["[[group]] #1 ranks: rank 8 is out of range; accepted: 0..7"]),
    ("empty-range", H100 + '[[group]]\nname = "tp"\nranks = "7..0"\n',
     ["[[group]] #1 ranks: range '7..0' is empty (start > end)"]),
    ("bad-range", H100 + '[[group]]\nname = "tp"\nranks = "0-7"\n',
     ["[[group]] #1 ranks: '0-7' is not a rank range", '"0..7"']),
    ("duplicate-rank", H100 + '[[group]]\nname = "tp"\nranks = [0, 1, 1]\n',
     ["[[group]] #1 ranks: rank 1 is listed twice"]),
    ("boolean-rank", H100 + '[[group]]\nname = "tp"\nranks = [0, true]\n',
     ["[[group]] #1 ranks: expected an integer, got boolean true"]),
    ("duplicate-group", H100 + TP + '[[group]]\nname = "tp"\nranks = [0]\n',
     ["[[group]] #2 name: group name 'tp' is already used by [[group]] #1"]),
    ("group-missing-ranks", H100 + '[[group]]\nname = "tp"\n', ["[[group]] #1 ranks: missing", 'ranks = "0..7"']),
    ("unknown-fault-kind", GB2 + fault("imex_mising", host=f'"{T1}"'),
     ["[[fault]] #1 kind: unknown fault kind 'imex_mising' (did you mean 'imex_missing'?)",
      "accepted: imex_missing, fabric_state, fabric_status_error"]),
    ("missing-fault-kind", GB2 + f'[[fault]]\nhost = "{T1}"\n', ["[[fault]] #1 kind: missing; accepted: imex_missing"]),
    ("missing-fault-field", GB2 + fault("fabric_state", gpu=f'"{T0}/0"'),
     ["[[fault]] #1 state: missing", 'state = "IN_PROGRESS"', "NOT_SUPPORTED, NOT_STARTED, IN_PROGRESS, COMPLETED"]),
    ("fault-key-of-other-kind", GB2 + fault("imex_missing", host=f'"{T1}"', gpu=f'"{T1}/0"'),
     ["[[fault]] #1: unknown key 'gpu'", "accepted keys for kind imex_missing: kind, host"]),
    ("fault-unknown-host", H100 + fault("imex_missing", host='"hgx-h100-1"'),
     ["[[fault]] #1 host: unknown host 'hgx-h100-1' (did you mean 'hgx-h100-0'?)", "hosts: hgx-h100-0"]),
    ("fault-unknown-gpu-host", GB2 + fault("no_multicast", gpu='"gb200-nvl72-tray05/0"'),
     ["[[fault]] #1 gpu: GPU 'gb200-nvl72-tray05/0': unknown host 'gb200-nvl72-tray05'",
      "hosts: gb200-nvl72-tray00, gb200-nvl72-tray01"]),
    ("bad-fabric-state", GB2 + fault("fabric_state", gpu=f'"{T0}/0"', state='"READY"'),
     ["[[fault]] #1 state: unknown fabric state 'READY'", "accepted: NOT_SUPPORTED, NOT_STARTED, IN_PROGRESS, COMPLETED"]),
    ("p2p-same-gpu", H100 + fault("p2p_disabled", host='"hgx-h100-0"', gpus="[1, 1]"),
     ["[[fault]] #1 gpus: the pair [1, 1] names one GPU twice"]),
    ("p2p-gpu-out-of-range", H100 + fault("p2p_disabled", host='"hgx-h100-0"', gpus="[1, 8]"),
     ["[[fault]] #1 gpus: GPU index 8 is out of range; accepted: 0..7 (host hgx-h100-0 has 8 GPUs)"]),
    ("p2p-not-a-pair", H100 + fault("p2p_disabled", host='"hgx-h100-0"', gpus="[1, 2, 3]"),
     ["[[fault]] #1 gpus: expected a pair of GPU indices of host hgx-h100-0, e.g. gpus = [0, 1]"]),
    ("fault-rank-out-of-range", H100 + fault("oom", rank="8", at_allocation="1"),
     ["[[fault]] #1 rank: rank 8 is out of range; accepted: 0..7 (world size 8)"]),
    ("fault-allocation-zero", H100 + fault("oom", rank="0", at_allocation="0"),
     ["[[fault]] #1 at_allocation: allocation number 0 is out of range; accepted: >= 1"]),
    ("fault-bad-code", H100 + fault("call_fails", rank="0", api='"cuMemCreate"', code='"CUDA_ERROR_NOT_PERMITED"'),
     ["[[fault]] #1 code: unknown CUDA error 'CUDA_ERROR_NOT_PERMITED' (did you mean 'CUDA_ERROR_NOT_PERMITTED'",
      "cudaError_t member"]),
    ("fault-success-code", H100 + fault("call_fails", rank="0", api='"cuMemCreate"', code='"cudaSuccess"'),
     ["[[fault]] #1 code: cudaSuccess is success, not an error"]),
    ("fault-bad-api", H100 + fault("call_fails", rank="0", api='"cu Mem"', code='"cudaErrorInvalidValue"'),
     ["[[fault]] #1 api: 'cu Mem' is not a driver call name"]),
    ("size-decimal-unit", H100 + '[workload]\nsizes = ["4KB"]\n',
     ["[workload] sizes: size '4KB': unit 'KB' is not accepted; write 4KiB", "decimal KB/MB/GB are refused"]),
    ("size-wrong-case", H100 + '[workload]\nsizes = ["1mib"]\n', ["[workload] sizes: size '1mib'", "write 1MiB (units are case-sensitive)"]),
    ("size-negative", H100 + "[workload]\nsizes = [-1]\n", ["[workload] sizes: size -1 must be > 0 bytes"]),
    ("size-zero-string", H100 + '[workload]\nsizes = ["0KiB"]\n', ["[workload] sizes: size '0KiB' must be > 0 bytes"]),
    ("size-float", H100 + '[workload]\nsizes = ["1.5MiB"]\n', ["[workload] sizes: size '1.5MiB' is not a size", "KiB"]),
    ("size-unknown-unit", H100 + '[workload]\nsizes = ["4TiB"]\n', ["[workload] sizes: size '4TiB': unknown unit 'TiB'"]),
    ("size-twice", H100 + '[workload]\nsizes = ["4KiB", 4096]\n', ["[workload] sizes: size 4096 (4096 bytes) is listed twice"]),
    ("sizes-not-array", H100 + '[workload]\nsizes = "4KiB"\n', ["[workload] sizes: expected an array, got string '4KiB'"]),
    ("sizes-empty", H100 + "[workload]\nsizes = []\n", ["[workload] sizes: must not be empty"]),
    ("unknown-op", H100 + '[workload]\nops = ["allreduce"]\n',
     ["[workload] ops: unknown op 'allreduce' (did you mean 'all_reduce'?)", "accepted: all_reduce, all_gather, reduce_scatter"]),
    ("unknown-dtype", H100 + '[workload]\ndtypes = ["bf16"]\n',
     ["[workload] dtypes: unknown dtype 'bf16'", "accepted: float32, float16, bfloat16"]),
    ("bad-bool", H100 + '[workload]\ngraph_capture = "yes"\n', ["[workload] graph_capture: expected true or false, got string 'yes'"]),
    ("zero-iterations", H100 + "[workload]\niterations = 0\n", ["[workload] iterations: iterations 0 is out of range; accepted: >= 1"]),
    ("unknown-backend", H100 + '[[expect]]\nbackend = "custom"\n',
     ["[[expect]] #1 backend: unknown backend 'custom'; accepted: ipc, fabric, multicast, symm, nccl"]),
    ("unknown-error", H100 + '[[expect]]\nerror = "cudaErrorInvalidResourceHandel"\nstep = "init"\n',
     ["[[expect]] #1 error: unknown CUDA error 'cudaErrorInvalidResourceHandel' (did you mean 'cudaErrorInvalidResourceHandle'"]),
    ("unknown-step", H100 + '[[expect]]\nerror = "cudaErrorInvalidValue"\nstep = "initialize"\n',
     ["[[expect]] #1 step: unknown step 'initialize'", "accepted: discover, init, op, capture, register, release_capture, close"]),
    ("error-without-step", H100 + '[[expect]]\nerror = "cudaErrorInvalidValue"\n',
     ["[[expect]] #1 step: missing; an error expectation says at which step"]),
    ("step-without-error", H100 + '[[expect]]\nbackend = "ipc"\nstep = "init"\n',
     ["[[expect]] #1 step: step applies only with error"]),
    ("expect-unknown-group", H100 + TP + '[[expect]]\ngroup = "pp"\nbackend = "ipc"\n',
     ["[[expect]] #1 group: unknown group 'pp'", "groups in this file: tp"]),
    ("expect-needs-group", H100 + TP + '[[group]]\nname = "half"\nranks = "0..3"\n[[expect]]\nbackend = "ipc"\n',
     ["[[expect]] #1 group: a backend expectation needs group", "groups: tp, half"]),
    ("expect-backend-and-error", H100 + '[[expect]]\nbackend = "ipc"\nerror = "cudaErrorInvalidValue"\nstep = "op"\n',
     ["[[expect]] #1: gives backend and error", "write one [[expect]] each"]),
    ("expect-empty", H100 + '[[expect]]\ngroup = "world"\n', ["[[expect]] #1: says nothing", 'backend = "fabric"']),
    ("expect-op-not-run", H100 + '[[expect]]\nop = "all_gather"\nbackend = "ipc"\n',
     ["[[expect]] #1 op: op 'all_gather' is not run; [workload] ops are all_reduce"]),
    ("expect-size-not-run", H100 + '[[expect]]\nsize = "8KiB"\nbackend = "ipc"\n',
     ["[[expect]] #1 size: size '8KiB' (8192 bytes) is not run; [workload] sizes are 4096 bytes"]),
    ("expect-rank-out-of-range", H100 + '[[expect]]\nerror = "cudaErrorInvalidValue"\nstep = "op"\nrank = 8\n',
     ["[[expect]] #1 rank: rank 8 is out of range; accepted: 0..7"]),
]


@pytest.mark.parametrize("text, fragments", [pytest.param(t, f, id=i) for i, t, f in BAD])
def test_malformed_file_is_rejected_with_file_field_and_accepted(
        tmp_path: Path, text: str, fragments: list[str]) -> None:
    path = write(tmp_path, text, "bad.toml")
    with pytest.raises(ScenarioError) as info:
        load(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: "), msg
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg!r}"
    assert isinstance(info.value, UserError) and "Traceback" not in msg


def test_bad_cases_are_distinct() -> None:
    ids = [i for i, _, _ in BAD]
    texts = [t for _, t, _ in BAD]
    assert len(set(ids)) == len(ids) and len(set(texts)) == len(texts) and len(BAD) >= 20


def test_loads_names_its_source() -> None:
    with pytest.raises(ScenarioError, match=r"^<string>: \[scenario\]: missing"):
        loads('[topology]\npreset = "hgx-h100-8"\n')


def test_load_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="nope.toml: no such file"):
        load(tmp_path / "nope.toml")


def test_load_directory(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="is a directory"):
        load(tmp_path)


# -- write_scenario ------------------------------------------------------------------------
def test_write_scenario_atomic_and_validated(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "gen.toml"
    with pytest.raises(UserError, match="cannot write"):      # a missing directory is refused
        write_scenario(target, H100)
    target.parent.mkdir()
    assert write_scenario(target, H100) == target
    assert target.read_text() == H100 and load(target).name == "t"
    assert [p.name for p in target.parent.iterdir()] == ["gen.toml"]  # no temp file left
    with pytest.raises(ScenarioError, match=r"gen\.toml: \[topology\] preset: unknown preset"):
        write_scenario(target, H100.replace("hgx-h100-8", "nope"))
    assert target.read_text() == H100  # the old file survives a refused write
    write_scenario(target, "not toml = [", validate=False)
    assert target.read_text() == "not toml = ["
