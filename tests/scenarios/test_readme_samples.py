"""Every console sample in README.md and docs/*.md is what its command prints: each `$ ` line is run (through commsim's CLI, from the repository root) and the
lines after it must appear in its output in order, a line `...` standing for any run of lines.
A command that ends `# exit N` must exit with N, and its shown lines are matched against
stdout and stderr together (a verdict, which `commsim exec` prints on stderr); any other
command must exit 0 and its lines are its stdout."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from commsim.cli import main

ROOT = Path(__file__).resolve().parents[2]


def samples() -> list[tuple[str, str, list[str]]]:
    out = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        blocks = doc.read_text().split("```console")[1:]
        for block in blocks:
            cmd, shown = None, []
            for line in block.split("```", 1)[0].splitlines():
                if line.startswith("$ "):
                    if cmd:
                        out.append((doc.name, cmd, shown))
                    cmd, shown = line[2:], []
                elif cmd is not None:
                    shown.append(line.rstrip())
            if cmd:
                out.append((doc.name, cmd, shown))
    return out


def matches(shown: list[str], got: list[str]) -> bool:
    """`shown` equals `got` line for line, where a `...` line matches any run of lines."""
    memo: dict[tuple[int, int], bool] = {}

    def m(i: int, j: int) -> bool:
        if (i, j) not in memo:
            if i == len(shown):
                memo[i, j] = j == len(got)
            elif shown[i] == "...":
                memo[i, j] = any(m(i + 1, k) for k in range(j, len(got) + 1))
            else:
                memo[i, j] = j < len(got) and shown[i] == got[j] and m(i + 1, j + 1)
        return memo[i, j]
    return m(0, 0)


SAMPLES = samples()


def unchecked_outputs() -> list[str]:
    """Fenced blocks other than ```console that show a `$ ` command's output: shown, so
    taken as what the command prints, but checked by no test (commands alone are fine)."""
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for n, block in enumerate(doc.read_text().split("```")[1::2], 1):
            lang, _, body = block.partition("\n")
            lines = [line for line in body.splitlines() if line.strip()]
            if lang.strip() != "console" and any(line.startswith("$ ") for line in lines) \
                    and any(not line.startswith("$ ") for line in lines):
                found.append(f"{doc.name}: block {n} ({lang.strip() or 'no language'}): {lines[0]}")
    return found


def test_the_readme_has_samples():
    assert len(SAMPLES) >= 2


def test_no_doc_shows_output_no_test_checks():
    # Figures in a block marked "not run here" drifted from what the command prints.
    assert unchecked_outputs() == [], "make these ```console blocks (run here) or drop the output"


@pytest.mark.parametrize("doc, cmd, shown", SAMPLES, ids=[s[1][:60] for s in SAMPLES])
def test_sample_output_is_what_the_command_prints(doc, cmd, shown, monkeypatch, capsys):
    argv = shlex.split(cmd, comments=True)
    assert argv[0].endswith("commsim"), f"{doc}: sample command {cmd!r} is not a commsim command"
    marker = re.search(r"#\s*exit (\d+)\s*$", cmd)
    monkeypatch.chdir(ROOT)
    assert main(argv[1:]) == (int(marker.group(1)) if marker else 0)
    cap = capsys.readouterr()
    text = cap.out + cap.err if marker else cap.out
    got = [line.rstrip() for line in text.splitlines()]
    while shown and not shown[-1]:
        shown = shown[:-1]
    assert matches(shown, got), (f"{doc}: `{cmd}` prints\n" + "\n".join(got) +
                                 "\n\nbut the sample shows\n" + "\n".join(shown))
