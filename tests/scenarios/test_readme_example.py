"""The README's worked example runs as written."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

from commsim.cli import main

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- worked-example:", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.splitlines() if line.strip().startswith("commsim ")]


def test_worked_example_runs_as_written(tmp_path, monkeypatch, capsys):
    for d in ("docs", "scenarios"):
        shutil.copytree(ROOT / d, tmp_path / d)
    monkeypatch.chdir(tmp_path)
    cmds = readme_commands()
    assert len(cmds) == 3
    rcs, outs = [], []
    for cmd in cmds:
        rcs.append(main(shlex.split(cmd)[1:]))
        outs.append(capsys.readouterr().out)
    assert rcs == [0, 0, 0]
    assert (tmp_path / "my-bug.toml").exists()
    failing, fixed = outs[1], outs[2]
    assert "at step init: cudaErrorInvalidResourceHandle" in failing
    assert "rank 0 on host node-0 opening the workspace IPC handle of rank 4 on host node-1" in failing
    assert "replay: commsim run my-bug.toml" in failing
    assert "ipc: declined: ranks are on 2 hosts" in fixed
    assert re.search(r"all_reduce_rmsnorm \d+ B -> fabric", fixed) or "-> fabric" in fixed
    assert "1 ok, 0 failed" in fixed


def test_scenario_new_rejects_bad_layouts_and_writes_nothing(tmp_path, capsys):
    topo = str(ROOT / "docs" / "examples" / "gb200-tray-topo.txt")
    out = tmp_path / "x.toml"
    assert main(["scenario", "new", "--topo", topo, "--hosts", "2", "--tp", "16", "-o", str(out)]) == 2
    assert "needs 16 GPUs" in capsys.readouterr().err and not out.exists()
    assert main(["scenario", "new", "--topo", str(tmp_path / "none.txt"), "--hosts", "2", "--tp", "2",
                 "-o", str(out)]) == 2
    assert "none.txt: no such file; give a text file holding the pasted" in capsys.readouterr().err
    assert not out.exists()
    # spread placement: TP 2 with one rank per tray (the vLLM#52778 layout)
    assert main(["scenario", "new", "--topo", topo, "--hosts", "2", "--tp", "2", "--placement", "spread",
                 "--graph-capture", "-o", str(out)]) == 0
    assert 'gpus = ["node-0/0", "node-1/0"]' in out.read_text()
    assert main(["scenario", "new", "--topo", topo, "--hosts", "2", "--tp", "2", "-o", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
