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


def test_exec_shards_merge_into_the_unsharded_report(tmp_path, capsys):
    """`sweep --exec --shard K/N --json` then `sweep merge` gives the unsharded sweep's
    records, summary and exit status; a scenario sweep's report is not mixed in."""
    import json

    from commsim.cli import main

    def sweep(*extra):
        return main(["sweep", "--exec", PROG, "--count", "6", "--quiet", *extra])

    assert sweep("--json", str(tmp_path / "all.json")) == 1
    whole = capsys.readouterr().out.splitlines()[0]
    for k in (1, 2):
        sweep("--shard", f"{k}/2", "--json", str(tmp_path / f"{k}.json"))
    capsys.readouterr()
    assert main(["sweep", "merge", str(tmp_path / "1.json"), str(tmp_path / "2.json"),
                 "--json", str(tmp_path / "merged.json"),
                 "--junit-xml", str(tmp_path / "merged.xml")]) == 1
    out = capsys.readouterr().out
    assert out.startswith("merged 2 report(s)")
    assert out.splitlines()[1].rsplit(",", 1)[0] == whole.rsplit(",", 1)[0]   # all but the time
    merged, unsharded = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("merged", "all"))
    assert merged["records"] == unsharded["records"] and len(merged["records"]) == 6
    assert (tmp_path / "merged.xml").read_text().count("<testcase ") == 6
    assert main(["sweep", "merge", str(tmp_path / "1.json")]) == 2
    assert "shard(s) 2/2 missing; run `commsim sweep --exec PROG --shard K/2" in capsys.readouterr().err
    assert main(["sweep", "--count", "2", "--quiet", "--json", str(tmp_path / "plain.json")]) == 0
    capsys.readouterr()
    assert main(["sweep", "merge", str(tmp_path / "1.json"), str(tmp_path / "plain.json")]) == 2
    assert "1.json is a `sweep --exec` report, " in capsys.readouterr().err
