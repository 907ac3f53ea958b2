"""Bad input that raised tracebacks: deeply nested TOML (`run`, `scenario check DIR`, which then
gave up on the whole directory), deeply nested JSON and shard records with a missing or
mistyped field (`sweep merge`); and a tampered shard's `replay` string shown as the command to
run; a seed the generators cannot take ran anyway. Each is now a named error, exit 2, and
the replay command is rebuilt from the id."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from commsim.cli import main
from commsim.scenario.sweep import crash_record
from commsim.util.fileio import INPUT_LIMIT

ROOT = Path(__file__).resolve().parents[2]
DEEP = 50_000


def _deep_toml(path):
    path.write_text("a = " + "[" * DEEP + "]" * DEEP + "\n")
    return path


def test_deeply_nested_toml_is_a_named_error_in_run_and_check(tmp_path, capsys):
    f = _deep_toml(tmp_path / "deep.toml")
    assert main(["run", str(f)]) == 2
    err = capsys.readouterr().err
    assert "deep.toml: TOML nested deeper" in err and "Traceback" not in err

    d = tmp_path / "dir"
    d.mkdir()
    _deep_toml(d / "a-deep.toml")
    (d / "b-ok.toml").write_text(min((ROOT / "scenarios").rglob("*.toml")).read_text())
    assert main(["scenario", "check", str(d)]) == 2
    out = capsys.readouterr()
    assert "a-deep.toml: TOML nested deeper" in out.err
    assert "b-ok.toml" in out.out, "the rest of the directory was not checked"




def _report(sid: str = "s4-3") -> dict:
    rec = crash_record(sid, "boom")
    fail = {"id": sid, "kinds": rec["kinds"], "description": rec["description"],
            "failures": rec["failures"], "replay": rec["replay"]}
    scen = {k: v for k, v in rec.items() if k not in ("failures", "replay")}
    return {"seed": 4, "filters": [], "jobs": 1, "wall_s": 1.0, "scenarios": [scen],
            "failures": [fail]}


def _tamper(d: dict, where: str, value) -> dict:
    d = copy.deepcopy(d)
    part, _, key = where.rpartition(".")
    target = {"scenario": d["scenarios"][0], "failure": d["failures"][0], "": d}[part]
    if value is _MISSING:
        del target[key]
    else:
        target[key] = value
    return d


_MISSING = object()


@pytest.mark.parametrize("where, value, words", [
    ("scenario.id", _MISSING, "has no field 'id'"),
    ("scenario.ok", "yes", "field 'ok' is a str, not bool"),
    ("scenario.kinds", _MISSING, "has no field 'kinds'"),
    ("scenario.backends", [1, 2], "field 'backends' is a list, not dict"),
    ("scenario.seconds", "1", "field 'seconds' is a str"),
    ("scenario.id", "s4-3; rm -rf ~", "is not a sweep scenario id"),
    ("scenario.shape", 7, "field 'shape' is a int"),
    ("failure.failures", "x", "field 'failures' is a str, not list"),
    ("failure.id", _MISSING, "has no field 'id'"),
    ("failures", {"a": 1}, "'failures' is not a list"),
    ("wall_s", "fast", "field 'wall_s' is a str"),
    ("jobs", [], "field 'jobs' is a list"),
])
def test_a_malformed_shard_record_is_named(tmp_path, capsys, where, value, words):
    f = tmp_path / "shard.json"
    f.write_text(json.dumps(_tamper(_report(), where, value)))
    assert main(["sweep", "merge", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("commsim: error: ") and words in err and "Traceback" not in err, err


def test_deeply_nested_json_is_a_named_error(tmp_path, capsys):
    f = tmp_path / "deep.json"
    f.write_text("[" * DEEP + "]" * DEEP)
    assert main(["sweep", "merge", str(f)]) == 2
    assert "nested deeper" in capsys.readouterr().err


def test_a_tampered_replay_string_is_never_shown(tmp_path, capsys):
    d = _report()
    d["failures"][0]["replay"] = "commsim replay s4-3; rm -rf ~"
    f = tmp_path / "shard.json"
    f.write_text(json.dumps(d))
    assert main(["sweep", "merge", str(f)]) == 1         # the merged sweep has a failure
    out = capsys.readouterr().out
    assert "rm -rf" not in out and "replay: commsim replay s4-3" in out


@pytest.mark.parametrize("argv", [
    ["run", "--seed", str(2 ** 70), "x.toml"],                # ran, then every rank failed
    ["exec", "--seed", "-1", "--machine", "hgx-h100-8", "--", "python", "x.py"],   # ran
    ["sweep", "--seed", str(2 ** 64), "--count", "1"],
])
def test_a_seed_that_is_negative_or_wider_than_64_bits_is_refused(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --seed: " in err and "Traceback" not in err


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "symlink-to-dev-zero", "too-large"])
@pytest.mark.parametrize("verb", [["run"], ["scenario", "check"], ["sweep", "merge"], ["topo", "import"]])
def test_an_input_that_is_no_regular_file_or_too_large_is_refused_before_reading(tmp_path, verb, kind):
    import subprocess
    import sys
    path = tmp_path / "in.toml"
    if kind == "fifo":
        os.mkfifo(path)                   # read, it waited for a writer for good
    elif kind == "dev-zero":
        path = Path("/dev/zero")          # read, it never ended
    elif kind == "symlink-to-dev-zero":
        path.symlink_to("/dev/zero")
    else:
        with open(path, "wb") as f:
            f.truncate(INPUT_LIMIT + 1)   # sparse: no disk used
    r = subprocess.run([sys.executable, "-m", "commsim.cli", *verb, str(path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    words = "more than the" if kind == "too-large" else (
        "is a FIFO" if kind == "fifo" else "is a device")
    assert f"{path}: " in r.stderr and words in r.stderr and "Traceback" not in r.stderr, r.stderr
