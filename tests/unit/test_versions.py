"""The run's version input (commsim/versions.py): its defaults come from what is installed,
scenario files, flags and the sweep generator give it, bad values are named errors, and the
layers read it from the run's cluster."""

from __future__ import annotations

import dataclasses
import sys
from importlib import metadata
from pathlib import Path

import pytest

from commsim.cli import main
from commsim.errors import UserError
from commsim.scenario import generate as G
from commsim.scenario.schema import ScenarioError, loads
from commsim.topology.presets import build
from commsim.versions import TORCH_NCCL, Versions, installed, parse_field

sys.path.insert(0, str(Path(__file__).parents[1] / "hosting"))

BASE = '[scenario]\nname = "v"\n[topology]\npreset = "rtx5090-2"\n'


def test_defaults_are_what_is_installed() -> None:
    v = installed()
    torch_release = metadata.version("torch").split("+")[0]
    assert v.field_text("torch") == torch_release
    wheels = [w for w in ("nvidia-nccl-cu13", "nvidia-nccl-cu12")
              if any(d.metadata["Name"] == w for d in metadata.distributions())]
    if not wheels:   # no NCCL wheel here: the NCCL that torch release ships for CUDA 13.0
        assert v.nccl == TORCH_NCCL[v.torch[:2]][(13, 0)]
    assert v.driver == "580.82.07" and v.driver_major == 580 and v.cuda_runtime == 13000
    assert build("hgx-h100-8").versions == v           # every cluster starts from them


def test_a_torch_release_brings_the_nccl_it_ships_unless_one_is_given() -> None:
    v = Versions()
    assert v.with_fields({"torch": "2.10"}).nccl == (2, 28, 9)           # CUDA 13.0 build
    assert v.with_fields({"torch": "2.10", "cuda": "12.8"}).nccl == (2, 27, 5)
    assert v.with_fields({"torch": "2.10", "nccl": "2.21.5"}).nccl == (2, 21, 5)
    assert v.with_fields({"torch": "2.14"}).torch == (2, 14, 0)
    assert v.with_fields({"driver": "470.57.02"}).driver_major == 470


@pytest.mark.parametrize("field,text,says", [
    ("torch", "two", "'two' is not a version of the PyTorch release"),
    ("nccl", "2", "'2' has 1 number(s)"),
    ("cuda", "12.8.1.1", "has 4 number(s)"),
    ("driver", "", "is not a version of the NVIDIA kernel driver"),
])
def test_a_bad_version_names_the_flag(field: str, text: str, says: str) -> None:
    with pytest.raises(UserError, match=f"--{field}-version: .*{says}".replace("(", r"\(")
                       .replace(")", r"\)")):
        parse_field(field, text)


def test_scenario_versions_table() -> None:
    sc = loads(BASE + '[versions]\ntorch = "2.10.0"\ndriver = "570.86.10"\ncuda = "12.8"\n', "v.toml")
    assert sc.cluster.versions.text() == "driver=570.86.10 cuda=12.8 torch=2.10.0 nccl=2.27.5"
    assert sc.cluster.driver_major("rtx5090-0") == 570
    with pytest.raises(ScenarioError, match=r"v.toml: \[versions\] torch: a TOML number"):
        loads(BASE + "[versions]\ntorch = 2.10\n", "v.toml")
    with pytest.raises(ScenarioError, match=r"v.toml: \[versions\]: unknown key 'pytorch'"):
        loads(BASE + '[versions]\npytorch = "2.10"\n', "v.toml")
    with pytest.raises(ScenarioError, match=r"v.toml: \[versions\] nccl: 'x' is not a version"):
        loads(BASE + '[versions]\nnccl = "x"\n', "v.toml")


def test_a_host_left_on_another_driver_keeps_its_own() -> None:
    c = build("hgx-h100-8:1")
    c = dataclasses.replace(c, versions=c.versions.with_fields({"driver": "570.86.10"}))
    assert c.driver_version("hgx-h100-0") == "570.86.10"
    old = c.replace_host("hgx-h100-0", driver_version="450.80.02")
    assert old.driver_major("hgx-h100-0") == 450


def test_flags_are_checked_by_argparse_and_go_into_the_replay(tmp_path: Path, capsys) -> None:
    f = tmp_path / "v.toml"
    f.write_text(BASE)
    with pytest.raises(SystemExit) as e:
        main(["run", str(f), "--nccl-version", "new"])
    assert e.value.code == 2 and "argument --nccl-version: 'new' is not a version" in capsys.readouterr().err
    from commsim.commands.args import with_versions
    ns = type("Args", (), {"driver_version": "535.104.05", "cuda_version": None,
                           "torch_version": "2.9", "nccl_version": None})()
    sc = with_versions(loads(BASE, str(f)), ns)
    # 2.9 has no CUDA 13.0 build in the table: the NCCL of its newest build
    assert sc.cluster.versions.torch == (2, 9, 0) and sc.cluster.versions.nccl == (2, 27, 5)
    from commsim.scenario.runner import RunResult
    res = RunResult(scenario=sc, policy=sc.policy)
    assert res.replay_command().endswith("--driver-version 535.104.05 --torch-version 2.9")


def test_plain_sweep_and_replay_pin_versions_and_print_them(tmp_path, capsys) -> None:
    """One declaration of the version flags serves sweep and replay too: a plain sweep runs
    every generated scenario under them and each record's replay command carries them."""
    import json
    from commsim.cli import main
    from commsim.scenario.sweep import run_one
    out = tmp_path / "s.json"
    assert main(["sweep", "--count", "1", "--seed", "7", "--quiet", "--torch-version", "2.10",
                 "--driver-version", "450.80.02", "--json", str(out)]) == 0
    (rec,) = json.loads(out.read_text())["scenarios"]
    assert rec["replay"] == f"commsim replay {rec['id']} --driver-version 450.80.02 --torch-version 2.10"
    pins = (("driver", "450.80.02"), ("torch", "2.10"))
    assert run_one("s7-0", "none", pins)["replay"] == rec["replay"]
    assert main(["replay", "s7-0", "--torch-version", "2.10", "--driver-version", "450.80.02"]) == 0
    assert "versions: driver=450.80.02 cuda=" in capsys.readouterr().out


def test_the_generator_draws_versions_from_a_stream_of_its_own() -> None:
    plans = [G.sample_plan(7, i) for i in range(200)]
    drawn = [p for p in plans if p.versions]
    assert 20 <= len(drawn) <= 60                          # about one in five
    for p in drawn[:5]:
        sc = G.build(p)
        v = dict(p.versions)
        assert sc.cluster.versions.field_text("torch") == v["torch"]
        assert sc.cluster.versions.field_text("nccl") == v["nccl"]
        assert sc.cluster.versions.driver_major >= (580 if v["cuda"].startswith("13") else 550)
        assert f"versions driver={v['driver']}" in sc.description
        # everything else is the draw it was before versions were drawn
        assert dataclasses.replace(p, versions=()) == dataclasses.replace(
            G.sample_plan(7, int(p.id.split("-")[1])), versions=())
    assert G.sample_plan(7, 3) == G.sample_plan(7, 3)


def test_hosted_surfaces_read_the_run_versions() -> None:
    from hosting_helpers import PROGRAMS, hosted
    v, res, out = hosted(PROGRAMS / "versions_seen.py", "rtx5090-2",
                         versions={"driver": "570.86.10", "cuda": "12.8"})
    assert v.exit_code == 0, out
    assert res[0] == {"rank": 0, "nvml_driver": "570.86.10", "nvml_cuda": 12080,
                      "runtime": 12080, "driver_cuda": 12080, "errors": [0, 0]}
    assert "--driver-version 570.86.10 --cuda-version 12.8" in v.cfg.replay_command()
