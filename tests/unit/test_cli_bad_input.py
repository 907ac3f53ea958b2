"""Every bad input reaches the user as a named error, a non-zero
exit, no traceback and nothing half-written (no output file, no temp file beside it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from commsim.cli import main

ROOT = Path(__file__).resolve().parents[2]
TOPO = str(ROOT / "tests" / "data" / "topo" / "gb200_tray.txt")
SCEN = str(ROOT / "scenarios" / "topologies" / "hgx-h100-8.toml")
UNWRITABLE = "/proc"            # an existing directory where nobody (root included) can create files


def scenario(ranks: str = "0..1", sizes: str = '["16KiB"]', dtypes: str = '["float32"]',
             policy: str = "default", preset: str = "hgx-h100-8", placement: str = "2") -> str:
    return f"""
[scenario]
name = "t"
seed = 0
policy = "{policy}"

[topology]
preset = "{preset}"

[placement]
ranks = {placement}

[[group]]
name = "tp"
ranks = "{ranks}"

[workload]
ops = ["all_reduce"]
sizes = {sizes}
dtypes = {dtypes}
"""


def files(tmp: Path) -> dict[str, str]:
    """The bad inputs of the issue, written into `tmp`; names -> paths."""
    out = {}

    def put(name: str, text: str) -> None:
        (tmp / name).write_text(text)
        out[name] = str(tmp / name)

    put("raises.py", "raise RuntimeError('policy import failed on purpose')\n")
    put("syntax.py", "def broken(:\n")
    put("exits.py", "import sys\nsys.exit(0)\n")
    put("policy-raises.toml", scenario(policy="raises.py:POLICY"))
    put("policy-syntax.toml", scenario(policy="syntax.py:POLICY"))
    put("policy-exits.toml", scenario(policy="exits.py:POLICY"))
    put("policy-sys-exit.toml", scenario(policy="sys:exit"))
    put("policy-missing.toml", scenario(policy="missing.py:POLICY"))
    put("huge-size.toml", scenario(sizes='["1048576GiB"]'))
    put("odd-size.toml", scenario(sizes="[3]", dtypes='["bfloat16"]'))
    put("too-big.toml", scenario(ranks="0..71", sizes='["256MiB"]', preset="gb200-nvl72",
                                 placement="72"))
    (tmp / "folder").mkdir()
    put("folder/a-good.toml", scenario())
    put("folder/b-broken.toml", "[scenario\nname=")
    put("folder/c-good.toml", scenario())
    return out


# (argv with {names} from files() and {tmp}, words the error must contain, path that must not exist)
CASES = {
    # scenario files run code
    "policy-sys-exit": (["run", "{policy-sys-exit.toml}"], "not a commsim.policy.Policy", None),
    "policy-exits": (["run", "{policy-exits.toml}"], "called exit while loading", None),
    "policy-raises": (["run", "{policy-raises.toml}"], "raised RuntimeError while loading", None),
    "policy-syntax": (["run", "{policy-syntax.toml}"], "syntax error at line 1", None),
    "explain-policy-raises": (["explain", "{policy-raises.toml}"], "raises.py raised RuntimeError", None),
    "check-policy-missing": (["scenario", "check", "{policy-missing.toml}"], "no file", None),
    "new-policy-missing": (["scenario", "new", "--topo", TOPO, "--hosts", "1", "--tp", "4",
                            "--policy", "missing.py:POLICY", "-o", "{tmp}/new.toml"],
                           "no file", "{tmp}/new.toml"),
    # no memory guard
    "memory": (["run", "{too-big.toml}"], "--no-memory-check", None),
    "sweep-count": (["sweep", "--count", "1000000000000"], "argument --count", None),
    # tracebacks
    "sweep-json": (["sweep", "--count", "1", "--json", UNWRITABLE + "/r.json"], "--json", None),
    "sweep-html": (["sweep", "--count", "1", "--html", UNWRITABLE + "/r.html"], "--html", None),
    "explain-plot": (["explain", SCEN, "--plot", UNWRITABLE + "/p.png"], "--plot", None),
    "topo-import-o": (["topo", "import", TOPO, "--hosts", "1", "-o", UNWRITABLE + "/t.toml"],
                      "--output", None),
    "scenario-new-o": (["scenario", "new", "--topo", TOPO, "--hosts", "1", "--tp", "4", "-o",
                        UNWRITABLE + "/n.toml"], "cannot write", None),
    "timeout-neg": (["run", "--procs", "--timeout", "-1", SCEN], "argument --timeout", None),
    "timeout-nan": (["run", "--procs", "--timeout", "nan", SCEN], "argument --timeout", None),
    "timeout-inf": (["run", "--procs", "--timeout", "inf", SCEN], "argument --timeout", None),
    "timeout-0": (["run", "--procs", "--timeout", "0", SCEN], "argument --timeout", None),
    # wrong answers
    "run-seed": (["run", "--seed", "-1", SCEN], "argument --seed", None),
    "sweep-seed": (["sweep", "--seed", "-1"], "argument --seed", None),
    "sweep-start": (["sweep", "--start", "-5"], "argument --start", None),
    "huge-size": (["scenario", "check", "{huge-size.toml}"], "over 4GiB", None),
    "odd-size": (["scenario", "check", "{odd-size.toml}"], "whole number of bfloat16", None),
    "run-huge-size": (["run", "{huge-size.toml}"], "over 4GiB", None),
    "folder-check": (["scenario", "check", "{tmp}/folder"], "b-broken.toml", None),
    "missing-dir-topo": (["topo", "import", TOPO, "--hosts", "1", "-o", "{tmp}/no/t.toml"],
                         "does not exist", "{tmp}/no"),
    "missing-dir-new": (["scenario", "new", "--topo", TOPO, "--hosts", "1", "--tp", "4", "-o",
                         "{tmp}/no/n.toml"], "does not exist", "{tmp}/no"),
    "missing-dir-json": (["sweep", "--count", "1", "--json", "{tmp}/no/r.json"], "does not exist",
                         "{tmp}/no"),
    "missing-dir-plot": (["explain", SCEN, "--plot", "{tmp}/no/p.png"], "does not exist", "{tmp}/no"),
}


def fill(x: str, tmp: Path, names: dict[str, str]) -> str:
    for k, v in names.items():
        x = x.replace("{" + k + "}", v)
    return x.replace("{tmp}", str(tmp))


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_a_named_error(case, tmp_path, capsys):
    names = files(tmp_path)
    argv, words, absent = CASES[case]
    argv = [fill(a, tmp_path, names) for a in argv]
    before = sorted(p.name for p in tmp_path.iterdir())
    try:
        rc = main(argv)
    except SystemExit as e:          # argparse refusing a flag's value
        rc = e.code
    out, err = capsys.readouterr()
    assert rc not in (0, None), f"exit {rc}\n{out}\n{err}"
    assert words in err, err
    assert "Traceback" not in err + out
    if absent:
        assert not Path(absent.replace("{tmp}", str(tmp_path))).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == before      # nothing half-written


def test_one_broken_file_does_not_hide_the_others(tmp_path, capsys):
    names = files(tmp_path)
    rc = main(["run", str(tmp_path / "folder")])
    out, err = capsys.readouterr()
    assert rc == 2 and "b-broken.toml" in err
    # every scenario has its row in the table; the broken one is a failure
    rows = [line for line in out.splitlines() if line.startswith(("ok ", "FAIL "))]
    assert len(rows) == 3 and sum(r.startswith("FAIL") for r in rows) == 1, out
    assert "3 scenario(s), 2 ok, 1 failed" in out
    assert main(["scenario", "check", names["folder/b-broken.toml"]]) == 2   # same as run


def test_scenario_check_says_a_policy_runs_code_and_estimates_memory(tmp_path, capsys):
    files(tmp_path)
    (tmp_path / "ok.py").write_text("from commsim.policy import Policy\nPOLICY = Policy()\n")
    (tmp_path / "code.toml").write_text(scenario(policy="ok.py:POLICY"))
    assert main(["scenario", "check", str(tmp_path / "code.toml"),
                 str(tmp_path / "too-big.toml")]) == 0
    out = capsys.readouterr().out
    assert f"runs code: policy file {tmp_path / 'ok.py'}" in out
    assert "host memory ~" in out and "GiB" in out.splitlines()[1]


def test_progress_lines_when_stderr_is_not_a_terminal(tmp_path, capsys):
    files(tmp_path)
    (tmp_path / "folder" / "b-broken.toml").unlink()
    assert main(["run", str(tmp_path / "folder")]) == 0
    err = capsys.readouterr().err
    assert "[1/2] " in err and "[2/2] " in err and ": ok (" in err


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("commsim 0.")
