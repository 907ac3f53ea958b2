"""`commsim scenario check`: one line per file, errors on stderr, exit 2 if any file failed
(as `commsim run` does for the same bad file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from commsim.cli import main
from commsim.topology.presets import PRESETS

ROOT = Path(__file__).resolve().parents[2]
GOOD = ('[scenario]\nname = "good"\n[topology]\npreset = "gb200-nvl72"\nhosts = 2\n'
        '[[group]]\nname = "tp"\nranks = "0..7"\n[[group]]\nname = "tray"\nranks = "0..3"\n'
        '[[fault]]\nkind = "imex_missing"\nhost = "gb200-nvl72-tray01"\n')
BAD = '[scenario]\nname = "bad"\n[topology]\npreset = "gb300"\n'


def test_check_good_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "good.toml"
    f.write_text(GOOD)
    assert main(["scenario", "check", str(f)]) == 0
    out, err = capsys.readouterr()
    assert out == (f"ok  {f}  good: gb200-nvl72:2, world 8, groups tp,tray, faults 1; "
                   f"host memory ~300.3 MiB\n")
    assert err == ""


def test_check_reports_every_file_and_fails_if_any_fails(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.toml").write_text(GOOD)
    (tmp_path / "nested").mkdir()
    (tmp_path / "nested" / "b.toml").write_text(BAD)
    (tmp_path / "notes.txt").write_text("not a scenario")
    assert main(["scenario", "check", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out.splitlines() == [f"ok  {tmp_path / 'a.toml'}  good: gb200-nvl72:2, world 8, "
                                f"groups tp,tray, faults 1; host memory ~300.3 MiB"]
    assert err.startswith(f"commsim: error: {tmp_path / 'nested' / 'b.toml'}: [topology] preset: "
                          f"unknown preset 'gb300'")
    assert len(err.splitlines()) == 1


def test_check_missing_path_and_empty_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert main(["scenario", "check", str(tmp_path / "nope.toml"), str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"commsim: error: {tmp_path / 'nope.toml'}: no such file or directory",
                   f"commsim: error: {tmp_path / 'empty'}: no *.toml scenario files in this directory"]


def test_check_skips_policies_folder_like_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "p.toml").write_text(BAD)
    (tmp_path / "s.toml").write_text(GOOD)
    assert main(["scenario", "check", str(tmp_path)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1


def test_check_shipped_scenarios(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scenario", "check", str(ROOT / "scenarios" / "topologies")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(PRESETS) and all(line.startswith("ok  ") for line in lines)


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["scenario", "check", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "validate" in out.lower() and "*.toml" in out and "Exits 2" in out


def test_scenario_needs_a_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["scenario"])
    assert e.value.code == 2


def test_new_takes_the_p2p_matrix_its_warning_names(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Without `-p2p r` output the import assumes PCIe P2P and says to pass --p2p FILE; with
    it, the refused pairs (CNS) are in the scenario and nothing is assumed."""
    data = Path(__file__).resolve().parents[1] / "data" / "topo"
    args = ["scenario", "new", "--topo", str(data / "a100_pcie_bridge_pairs.txt"), "--hosts", "1",
            "--tp", "8", "--gpu-model", "A100"]
    assert main(args + ["-o", str(tmp_path / "assumed.toml")]) == 0
    assert "pass --p2p FILE" in capsys.readouterr().err
    out = tmp_path / "given.toml"
    assert main(args + ["--p2p", str(data / "a100_pcie_bridge_pairs_p2p.txt"), "-o", str(out)]) == 0
    assert "assumed" not in capsys.readouterr().err
    from commsim.scenario.schema import load
    cluster = load(out).cluster
    host = cluster.hosts[0]
    assert host.link(0, 1).p2p and not host.link(0, 4).p2p
    assert main(args + ["--p2p", str(tmp_path / "none.txt"), "-o", str(out), "--force"]) == 2
    assert "none.txt: no such file; give a text file holding `nvidia-smi topo -p2p r`" in \
        capsys.readouterr().err
