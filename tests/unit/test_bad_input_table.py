"""Every verb x every numeric flag x {nan, inf, -1, 0, 2**70, a non-number}, and every path
argument x {FIFO, directory, /dev/zero, missing, a symlink to /dev/zero}: a named error and
exit 2, no traceback, no file written; or, where the value is legal (LEGAL), a run that ends.

Verbs and flags come from the argparse parsers themselves, so a new flag is covered at once;
a new verb fails `test_every_verb_has_a_base` until BASE says how to call it cheaply. The
cases run in-process through `commsim.cli.main` (a subprocess each would cost seconds).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
from pathlib import Path
from typing import Iterator

import pytest

from commsim.cli import build_parser, main

REPO = Path(__file__).resolve().parents[2]
MATRIX = REPO / "tests/data/topo/a100_pcie_bridge_pairs.txt"
SCENARIO = REPO / "scenarios/topologies/a100-pcie-bridge-8.toml"

NUMBERS = {"nan": "nan", "inf": "inf", "-1": "-1", "0": "0", "2**70": str(2 ** 70),
           "non-number": "abc"}
PATHS = ("fifo", "directory", "/dev/zero", "missing", "symlink to /dev/zero")

# A cheap, valid call of each verb: the case's flag replaces its own entry here, a positional
# is written {dest}. "{prog}" is a program that does nothing, "{out}" a fresh output path.
BASE: dict[str, list[str]] = {
    "topo list": [],
    "topo show": ["{spec}"],
    "topo import": ["{file}", "--hosts", "1"],
    "topo fabric": ["{spec}", "--info", "{info}"],
    "scenario check": ["{paths}"],
    "scenario new": ["--topo", str(MATRIX), "--hosts", "1", "--tp", "2", "-o", "{out}"],
    "run": ["{paths}"],
    "explain": ["{paths}"],
    "sweep": ["--count", "0", "--quiet"],
    "replay": ["{id}"],
    "probe": [],
    "exec": ["--machine", "hgx-h100-8", "--mode", "inproc", "--quiet", "--", "python", "{prog}"],
    "clean": [],
}
# What a positional is when it is not the case's subject.
FILL = {"spec": "gb200-nvl72:1", "file": str(MATRIX), "info": str(REPO / "tests/data/fabric/gb200_tray_completed.txt"),
        "paths": str(SCENARIO), "id": "s0-0"}
# Flags a case drops from BASE because they do not go with the flag under test.
NOT_WITH = {("exec", "--scenario"): ("--machine",)}
# How a positional is given when it is the subject (sweep's words are `merge REPORT.json`).
POSITIONAL_FORM = {("sweep", "words"): ["merge", "{}"]}

# (verb, flag, value) that are legal and run: the run must end (rc 0 or 1), no traceback.
LEGAL = {
    ("topo show", "--shapes", "2**70"),         # at most N shapes: all of them
    ("run", "--seed", "0"), ("explain", "--seed", "0"),
    ("sweep", "--count", "0"), ("sweep", "--seed", "0"), ("sweep", "--start", "0"),
    ("sweep", "--start", "2**70"),              # a first index past the end: nothing to run
    ("exec", "--seed", "0"), ("exec", "--nproc-per-host", "0"),    # 0: one rank per GPU
}
# A case still running after this long is stuck (a FIFO read, a run that does not stop): the
# guard turns a hang into a failure naming the case instead of a CI job killed without one.
HANG_GUARD_S = 20


def leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
           ) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield " ".join(path), parser
        return
    for name, sub in subs[0].choices.items():
        yield from leaves(sub, path + (name,))


def is_numeric(a: argparse.Action) -> bool:
    if a.type is None or a.type is Path or a.choices:
        return False
    try:
        return isinstance(a.type("1"), (int, float))
    except (argparse.ArgumentTypeError, ValueError, TypeError):
        return False


_PATHLIKE = re.compile(r"FILE|SCENARIO|TOPOLOGY|\.(toml|json|html|xml|png)\b")


def is_path(a: argparse.Action) -> bool:
    return a.type is Path or bool(_PATHLIKE.search(str(a.metavar or "")))


def is_output(a: argparse.Action) -> bool:
    return str(a.metavar or "").startswith("OUT") or a.dest == "junit_xml"


def name(a: argparse.Action) -> str:
    return a.option_strings[0] if a.option_strings else a.dest


PARSER = build_parser()
LEAVES = dict(leaves(PARSER))
NUMERIC = [(v, a) for v, p in LEAVES.items() for a in p._actions if is_numeric(a)]
PATHARGS = [(v, a) for v, p in LEAVES.items() for a in p._actions if is_path(a)]


def test_every_verb_has_a_base() -> None:
    assert set(LEAVES) == set(BASE), "add the new verb to BASE (a cheap valid call)"
    assert len(NUMERIC) >= 15 and len(PATHARGS) >= 15   # the enumeration found the flags


def argv_for(verb: str, a: argparse.Action, value: str, tmp: Path) -> list[str]:
    drop = {name(a), *NOT_WITH.get((verb, name(a)), ())}
    base, out, i = BASE[verb], [], 0
    while i < len(base):
        tok = base[i]
        takes = tok.startswith("-") and tok != "--" and i + 1 < len(base) \
            and not base[i + 1].startswith("-")
        if tok in drop:
            i += 2 if takes else 1
            continue
        out += [tok, base[i + 1]] if takes else [tok]
        i += 2 if takes else 1
    fills = {**FILL, "prog": str(tmp / "prog.py"), "out": str(tmp / "new.toml")}
    subject = None
    if not a.option_strings:
        form = POSITIONAL_FORM.get((verb, a.dest), ["{}"])
        subject = [w.replace("{}", value) for w in form]
    words: list[str] = []
    for tok in out:
        if tok == "{" + a.dest + "}" and subject is not None:
            words += subject
            subject = None
        else:
            words.append(tok.format(**fills) if tok.startswith("{") else tok)
    if subject is not None:
        words = subject + words
    elif a.option_strings:
        at = words.index("--") if "--" in words else len(words)
        words[at:at] = [name(a), value]       # "--" ends exec's own flags
    return verb.split() + words


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def run_case(argv: list[str], tmp: Path, monkeypatch: pytest.MonkeyPatch,
             capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    monkeypatch.chdir(tmp)
    (tmp / "prog.py").write_text("pass\n")
    before = files_under(tmp)

    def stuck(signum, frame):
        raise AssertionError(f"commsim {' '.join(argv)}: no answer in {HANG_GUARD_S} s")
    old = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(HANG_GUARD_S)
    try:
        rc = main(argv)
    except SystemExit as e:                  # argparse: usage and the flag named
        rc = e.code if isinstance(e.code, int) else 2
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    if rc == 2:
        assert files_under(tmp) == before, f"an error wrote {files_under(tmp) - before}"
    return rc, err


def special_path(kind: str, tmp: Path, output: bool) -> str:
    if kind == "fifo":
        os.mkfifo(tmp / "fifo")
        return str(tmp / "fifo")
    if kind == "directory":
        (tmp / "adir").mkdir()
        return str(tmp / "adir")
    if kind == "missing":
        return str(tmp / ("no-such-dir/out.toml" if output else "missing.toml"))
    if kind == "symlink to /dev/zero":
        (tmp / "zero").symlink_to("/dev/zero")
        return str(tmp / "zero")
    return "/dev/zero"


@pytest.mark.parametrize("verb, action", NUMERIC, ids=[f"{v}:{name(a)}" for v, a in NUMERIC])
def test_numeric_flag(verb: str, action: argparse.Action, tmp_path: Path,
                      monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for label, value in NUMBERS.items():
        case = tmp_path / label.replace("*", "")
        case.mkdir()
        rc, err = run_case(argv_for(verb, action, value, case), case, monkeypatch, capsys)
        if (verb, name(action), label) in LEGAL:
            assert rc in (0, 1), f"{verb} {name(action)} {value}: legal, rc {rc}: {err}"
            continue
        assert rc == 2, f"{verb} {name(action)} {value}: rc {rc}, expected 2: {err}"
        flag_names = [*action.option_strings, action.dest.replace("_", "-")]
        assert "error" in err and any(f in err for f in flag_names) or value in err, \
            f"{verb} {name(action)} {value}: the error names neither the flag nor the value: {err}"


@pytest.mark.parametrize("verb, action", PATHARGS, ids=[f"{v}:{name(a)}" for v, a in PATHARGS])
def test_path_argument(verb: str, action: argparse.Action, tmp_path: Path,
                       monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for kind in PATHS:
        case = tmp_path / re.sub(r"\W+", "-", kind).strip("-")
        case.mkdir()
        path = special_path(kind, case, is_output(action))
        rc, err = run_case(argv_for(verb, action, path, case), case, monkeypatch, capsys)
        assert rc == 2, f"{verb} {name(action)} {kind}: rc {rc}, expected 2: {err}"
        assert "error" in err and (path in err or Path(path).name in err), \
            f"{verb} {name(action)} {kind}: the error does not name {path}: {err}"


# Calls that used to run, write a file `run` refuses, or fill memory: each a named error.
WRONG_ANSWERS = [
    (["exec", "--machine", "hgx-h100-8", "--scenario", str(SCENARIO), "--", "python", "p.py"],
     "--machine hgx-h100-8 with --scenario"),
    (["sweep", "--exec", ""], "--exec '': give the program"),
    (["sweep", "--exec-mode", "procs", "--count", "0"], "--exec-mode applies to sweep --exec"),
    (["sweep", "--count", "0", "--html", "x.txt"], "--html x.txt: give a .html file name"),
    (["scenario", "new", "--topo", str(MATRIX), "--hosts", "1", "--tp", "2", "--policy",
      "os:abort", "-o", "new.toml"], "policy 'os:abort'"),
    (["scenario", "new", "--topo", str(MATRIX), "--hosts", str(10 ** 6), "--tp", "2", "-o",
      "new.toml"], "--hosts: must be >= 1 and at most 4,096"),
    (["topo", "import", str(MATRIX), "--hosts", str(10 ** 9)], "at most 4,096"),
    (["topo", "import", "big.txt", "--hosts", "1"], "the header names 3,000 GPUs"),
]


@pytest.mark.parametrize("argv, words", WRONG_ANSWERS, ids=[" ".join(a[:2]) + f" {i}"
                                                           for i, (a, _) in enumerate(WRONG_ANSWERS)])
def test_wrong_answers_are_named(argv: list[str], words: str, tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    # A one-host matrix of 3,000 GPUs: refused from its header, before its 9 M cells are read.
    n = 3000
    (tmp_path / "big.txt").write_text("\t" + "\t".join(f"GPU{j}" for j in range(n)) + "\n" +
                                      "GPU0\t X \t" + "\t".join(["SYS"] * (n - 1)) + "\n")
    rc, err = run_case(argv, tmp_path, monkeypatch, capsys)
    assert rc == 2 and words in err, err
    assert not (tmp_path / "new.toml").exists()
