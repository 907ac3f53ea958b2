"""The launcher of `commsim exec` and `sweep --exec` in procs mode never imports torch: its ranks
do (forked from the zygote, or fresh interpreters), and importing torch in the launcher too
was seconds of CPU per sweep that no rank used. Checked in a fresh interpreter, which does
what the launcher does before a rank starts: the command line parsed, the generated ids
chosen, each scenario's machine built, the run resolved and its ranks' environments made."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

LAUNCHER_SIDE = """
import os, sys
from commsim import cli
from commsim.commands import sweep as sweep_cmd, exec as exec_cmd   # the verbs' lazy imports:
from commsim.launch import run, sweep_exec, procs, zygote, pytest_plugin  # noqa: F401
from commsim.launch.config import RunConfig, load_scenario
from commsim.launch.rank_env import rank_env
from commsim.scenario.executors import shard
from commsim.scenario.sweep import select_ids
from commsim.scenario.sweep_report import Report                          # noqa: F401

args = cli.build_parser().parse_args(
    ["sweep", "--exec", "prog.py", "--exec-mode", "procs", "--count", "3", "--seed", "0"])
ids = shard(select_ids(args.count, seed=args.seed), None)
for sid in ids:
    sc = load_scenario(sid)
    cfg = RunConfig(scenario=sid, mode="procs", command=["prog.py"]).resolve()
    env = rank_env(cfg, 0, cfg.cluster(), dict(os.environ), "/nonexistent/boot", 0)
    assert sc.world_size >= 1 and env["RANK"] == "0", (sid, env.get("RANK"))
print(len(ids), "torch" in sys.modules, sorted(m for m in sys.modules if m.split(".")[0] == "torch")[:5])
"""


def test_the_procs_launcher_path_imports_no_torch():
    p = subprocess.run([sys.executable, "-c", LAUNCHER_SIDE], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split()[:2] == ["3", "False"], p.stdout
