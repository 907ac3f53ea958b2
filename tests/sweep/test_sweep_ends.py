"""A sweep that never ended: under `timeout 55` on a loaded machine the parent waited for two
workers blocked for good, and the SIGTERM from `timeout` did not end it (the executor's
shutdown waits for every running chunk). Now any exception in the parent (SIGTERM's, Ctrl-C's)
kills the workers first, and a worker stuck on one scenario is named, killed and its scenario
recorded, the rest of the sweep going on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from commsim.scenario.sweep import _run_pool, select_ids

ROOT = Path(__file__).resolve().parents[2]


def _children(pid: int) -> set[int]:
    out = set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.add(int(d))
            except (OSError, ValueError, IndexError):
                pass
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_sigtermed_sweep_exits_within_10_s_every_time(tmp_path):
    # A load of its own beside the sweep's two workers: the machine has 2 cores.
    load = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        for attempt in range(3):
            p = subprocess.Popen([sys.executable, "-m", "commsim.cli", "sweep", "--count", "2000",
                                  "--seed", str(7 + attempt), "--jobs", "2"],
                                 cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=dict(os.environ, PYTHONPATH=str(ROOT)))
            try:
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline and len(_children(p.pid)) < 2:
                    time.sleep(0.2)
                workers = _children(p.pid)
                assert len(workers) >= 2, f"no workers started: {p.poll()}"
                time.sleep(1 + attempt)                    # mid-run, at a different point each time
                p.send_signal(signal.SIGTERM)
                _, err = p.communicate(timeout=10)
                assert p.returncode == 143, err
                assert "Traceback" not in err, err
                assert not [w for w in workers if _alive(w)], "workers outlived the sweep"
            finally:
                if p.poll() is None:
                    p.kill()
                    p.communicate()
    finally:
        load.kill()
        load.wait()


def test_a_stuck_worker_is_named_killed_and_its_scenario_recorded(capsys):
    ids = select_ids(24, seed=4, filters=["clean"])
    stuck = ids[3]
    records: list[dict] = []
    # SIGSTOP: the worker stops for good inside that scenario, as one blocked on a lock does.
    _run_pool(ids, 2, "none", records.append, {stuck: signal.SIGSTOP}, stuck_after=3.0)
    assert sorted(r["id"] for r in records) == sorted(ids)
    bad = [r for r in records if not r["ok"]]
    assert [r["id"] for r in bad] == [stuck]
    assert "stuck on this scenario" in bad[0]["failures"][0]["detail"]
    err = capsys.readouterr().err
    assert f"has run {stuck} for" in err and "stuck, killed" in err
