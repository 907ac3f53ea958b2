"""`commsim sweep --exec`: the FlashInfer-style program over generated machines; the oracle
names the shapes that break it, each with a replay command; the fixed variant is clean."""

import subprocess
import sys

from hosting_helpers import EXAMPLES

from commsim.launch.sweep_exec import run_exec_sweep
from commsim.scenario.generate import sample_ids

PROG = str(EXAMPLES / "flashinfer_style_ipc_workspace.py")
IDS = sample_ids(0, 10)


def test_shapes_that_break_the_program_are_named():
    rep = run_exec_sweep([PROG], IDS)
    kinds = {r["id"]: r["kind"] for r in rep.records}
    multihost = [r for r in rep.records if r["hosts"] > 1 and r["kind"] != "injected"]
    assert multihost and all(kinds[r["id"]] == "ipc-across-hosts" for r in multihost)
    assert any(r["kind"] == "ok" for r in rep.records if r["hosts"] == 1)
    text = rep.summary()
    # Every multi-host shape of the sample is named (which shapes the sampler draws changes
    # with the machine mix, so they are read from the records, not spelled here).
    assert "machine shapes that break it:" in text
    assert all(f"  {r['shape']}: " in text for r in multihost), text
    assert "replay: commsim exec --scenario s0-" in text


def test_fixed_variant_is_clean():
    rep = run_exec_sweep([PROG, "--fix"], IDS)
    assert not rep.defects, rep.summary()


def test_replay_command_reproduces_a_failure():
    rep = run_exec_sweep([PROG], IDS[:6])
    bad = next(r for r in rep.records if r["kind"] == "ipc-across-hosts")
    cmd = bad["replay"].split()
    r = subprocess.run([sys.executable, "-m", "commsim.cli", *cmd[1:cmd.index("--")], "--quiet",
                        "--", "python", PROG], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    assert "invalid resource handle" in r.stderr


def test_cli_exit_status():
    r = subprocess.run([sys.executable, "-m", "commsim.cli", "sweep", "--exec", PROG,
                        "--count", "6", "--quiet"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "ipc-across-hosts" in r.stdout
