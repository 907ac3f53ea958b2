"""`commsim topo list | show | import` through commsim.cli.main."""

from __future__ import annotations

import io
import sys
import tomllib
from pathlib import Path

import pytest

import commsim.scenario
from commsim.cli import main
from commsim.topology import presets
from commsim.topology.importers.nvidia_smi import cluster_from_matrix_table

DATA = Path(__file__).resolve().parents[1] / "data" / "topo"
GB200 = str(DATA / "gb200_tray.txt")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


# -- help ------------------------------------------------------------------------------


@pytest.mark.parametrize("verb, words", [
    ([], "Machine topologies: the presets"),
    (["list"], "preset machine shapes"),
    (["show"], "gb200-nvl72:2"),
    (["import"], "--hosts"),
])
def test_every_verb_has_help(capsys: pytest.CaptureFixture[str], verb: list[str], words: str) -> None:
    with pytest.raises(SystemExit) as e:
        main(["topo", *verb, "--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith("usage: commsim topo") and words in out


def test_topo_without_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["topo"])
    assert e.value.code == 2


# -- list / show -----------------------------------------------------------------------


def test_list_names_every_preset_with_its_summary(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "topo", "list")
    assert rc == 0
    for p in presets.PRESETS.values():
        assert any(line.split()[0] == p.name and p.summary in line for line in out.splitlines())


def test_show_preset(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "topo", "show", "hgx-h100-8")
    assert rc == 0
    assert "cluster hgx-h100-8: 1 host(s), 8 GPUs" in out
    assert "GPU7\tNV18" in out and "single-node NVSwitch" in out


def test_show_sliced_preset(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "topo", "show", "gb200-nvl72:2")
    assert rc == 0 and "2 host(s), 8 GPUs" in out and "multi-node (MNNVL)" in out


@pytest.mark.parametrize("spec, words", [
    ("gb300", "unknown preset 'gb300'; known presets: hgx-h100-8"),
    ("gb200-nvl72:x", "after ':' give a host count"),
    ("gb200-nvl72:99", "a slice must keep 1..18"),
    ("missing.toml", "missing.toml: no such file"),
])
def test_show_bad_spec(capsys: pytest.CaptureFixture[str], spec: str, words: str) -> None:
    rc, out, err = run(capsys, "topo", "show", spec)
    assert rc == 2 and out == ""
    assert err.startswith("commsim: error: ") and words in err


def test_show_text_file_points_to_import(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "topo", "show", GB200)
    assert rc == 2 and "commsim topo import" in err


def test_show_scenario_written_by_import(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_file = tmp_path / "gb.toml"
    assert run(capsys, "topo", "import", GB200, "--hosts", "2", "-o", str(out_file))[0] == 0
    rc, out, _ = run(capsys, "topo", "show", str(out_file))
    assert rc == 0 and "multi-node (MNNVL), 8 GPUs on 2 host(s)" in out


def test_show_scenario_without_schema_module(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # The scenario loader is optional for this verb: presets must work without it.
    monkeypatch.delattr(commsim.scenario, "schema", raising=False)
    monkeypatch.setitem(sys.modules, "commsim.scenario.schema", None)
    f = tmp_path / "s.toml"
    f.write_text('[scenario]\nname = "s"\n[topology]\npreset = "hgx-h100-8"\n')
    rc, _, err = run(capsys, "topo", "show", str(f))
    assert rc == 2 and "needs commsim.scenario.schema" in err
    assert run(capsys, "topo", "show", "hgx-h100-8")[0] == 0


# -- import ----------------------------------------------------------------------------


def test_import_gb200_two_hosts(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "topo", "import", GB200, "--hosts", "2")
    assert rc == 0
    assert "multi-node (MNNVL), 8 GPUs on 2 host(s)" in out and "node-1\t4\tNVIDIA GB200" in out
    warnings = [l for l in err.splitlines() if l.startswith("warning: ")]
    assert any("inferred as 'rack'" in w and "--domain" in w for w in warnings)
    assert "8 NIC column(s) ignored" in err


def test_import_with_options(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "topo", "import", GB200, "--hosts", "2", "--domain", "node",
                       "--gpu-model", "GB200", "--host-prefix", "tray", "--name", "bug123")
    assert rc == 0
    assert out.count("single-node NVSwitch") == 2 and "cluster bug123" in out and "tray-1" in out
    assert "inferred" not in err


def test_import_with_p2p_file(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "topo", "import", str(DATA / "a100_pcie_bridge_pairs.txt"),
                       "--hosts", "1", "--gpu-model", "A100",
                       "--p2p", str(DATA / "a100_pcie_bridge_pairs_p2p.txt"))
    assert rc == 0
    assert "GPU0\t X \tOK\tOK\tOK\tCNS" in out   # the cause letter is kept (T4)
    assert "assumed" not in err


def test_import_from_stdin(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO((DATA / "pcie_8_gpus_spaces.txt").read_text()))
    rc, out, err = run(capsys, "topo", "import", "-", "--hosts", "1")
    assert rc == 0 and "cluster stdin: 1 host(s), 8 GPUs" in out
    assert "warning: P2P for PCIe pairs was assumed allowed" in err


def test_import_output_writes_scenario_and_refuses_overwrite(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_file = tmp_path / "bug.toml"
    rc, _, err = run(capsys, "topo", "import", GB200, "--hosts", "2", "--output", str(out_file))
    assert rc == 0 and f"wrote {out_file}" in err
    text = out_file.read_text()
    doc = tomllib.loads(text)
    assert doc["scenario"]["name"] == "gb200_tray"
    topo = doc["topology"]
    assert (topo["hosts"], topo["host_prefix"], topo["gpu_model"], topo["domain"]) == \
        (2, "node", "NVIDIA GB200", "rack")
    assert "GPU3\tNV18\tNV18\tNV18\t X " in topo["matrix"]
    assert "# Assumed while importing" in text  # the assumptions are recorded in the file
    cluster = cluster_from_matrix_table(topo, str(out_file))
    assert len(cluster.domains) == 1 and cluster.domains[0].multi_node

    rc, _, err = run(capsys, "topo", "import", GB200, "--hosts", "1", "--output", str(out_file))
    assert rc == 2 and "already exists; pass --force" in err
    assert out_file.read_text() == text

    rc, _, _ = run(capsys, "topo", "import", GB200, "--hosts", "1", "--output", str(out_file), "--force")
    assert rc == 0 and tomllib.loads(out_file.read_text())["topology"]["hosts"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bug.toml"]  # no temp files left


def test_import_output_loads_as_scenario(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from commsim.scenario import schema
    out_file = tmp_path / "h100.toml"
    assert run(capsys, "topo", "import", str(DATA / "h100_nvswitch_8_nics.txt"), "--hosts", "1",
               "-o", str(out_file))[0] == 0
    s = schema.load(out_file)
    assert s.name == "h100_nvswitch_8_nics" and s.cluster.num_gpus == 8
    assert s.cluster.hosts[0].gpus[0].model == "NVIDIA H100 80GB HBM3"
    assert len(s.cluster.domains) == 1 and not s.cluster.domains[0].multi_node


def test_import_bad_matrix_writes_nothing(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_file = tmp_path / "bad.toml"
    rc, out, err = run(capsys, "topo", "import", str(DATA / "bad_short_row.txt"), "--hosts", "1",
                       "-o", str(out_file))
    assert rc == 2 and out == ""
    assert "bad_short_row.txt line 6: GPU2 row has 3 GPU cells, header has 4 GPU columns" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, words", [
    (["nope.txt", "--hosts", "1"], "nope.txt: no such file; give a text file holding"),
    ([GB200, "--hosts", "0"], "--hosts: must be >= 1"),
    ([GB200, "--hosts", "1", "--gpu-model", "MI300X"], "unknown GPU model 'MI300X'"),
    ([GB200, "--hosts", "1", "--name", "a b"], "--name 'a b'"),
    ([str(DATA / "pcie_8_gpus_spaces.txt"), "--hosts", "1", "--domain", "rack"],
     "needs NVLink between every GPU pair"),
    ([GB200, "--hosts", "1", "--p2p", "nope_p2p.txt"], "nope_p2p.txt: no such file"),
    ([GB200, "--hosts", "1", "-o", "/nonexistent-dir/x.toml"], "does not exist"),
])
def test_import_bad_input(capsys: pytest.CaptureFixture[str], argv: list[str], words: str) -> None:
    rc, out, err = run(capsys, "topo", "import", *argv)
    assert rc == 2 and out == ""
    assert err.startswith("commsim: error: ") and words in err


@pytest.mark.parametrize("argv", [[GB200], [GB200, "--hosts", "two"], [GB200, "--hosts", "1", "--domain", "pod"]])
def test_import_usage_errors(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["topo", "import", *argv])
    assert e.value.code == 2
