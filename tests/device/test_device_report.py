"""scripts/device_report.py turns the device check's outputs into summary, per-row table and
figures; checked on CPU with outputs shaped as the steps write them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.conformance.test_rules" name="test_rule[L1 - handle of a base]"/>
<testcase classname="tests.conformance.test_rules" name="test_rule[L8 - open across hosts]">
  <failure message="assert 0 == 400">trace</failure></testcase>
<testcase classname="tests.conformance.test_rules" name="test_rule[V2 - fabric on a tray]">
  <skipped message="host is not a GB200 tray"/></testcase>
</testsuite></testsuites>"""


def _run(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "device_report.py"), "--out", str(out),
                           "--seconds", "12"], capture_output=True, text=True, timeout=60)


def test_rows_outcomes_and_figures(tmp_path: Path) -> None:
    (tmp_path / "conformance.xml").write_text(JUNIT)
    (tmp_path / "device_check.json").write_text(json.dumps([
        {"name": "bandwidth", "ok": True, "detail": "ratio 0.91", "figures": {"ratio": 0.91}}]))
    (tmp_path / "steps.txt").write_text("check 0\ne2e 0\nconformance 1\n")
    r = _run(tmp_path)
    assert r.returncode == 1, r.stderr            # a disagreeing row fails the report
    rows = (tmp_path / "rows.tsv").read_text().splitlines()[1:]
    table = {line.split("\t")[0]: line.split("\t")[1] for line in rows}
    assert table == {"L1": "agree", "L8": "disagree", "V2": "not checked"}
    assert json.loads((tmp_path / "figures.json").read_text())["figures"] == {"bandwidth: ratio": 0.91}
    summary = (tmp_path / "summary.md").read_text()
    assert "1 agree, 1 disagree, 1 not checked" in summary and "L8 disagree" in summary


def test_all_agree_exits_zero(tmp_path: Path) -> None:
    (tmp_path / "conformance.xml").write_text(JUNIT.replace('<failure message="assert 0 == 400">trace</failure>', ""))
    assert _run(tmp_path).returncode == 0


def test_missing_folder_is_named(tmp_path: Path) -> None:
    r = _run(tmp_path / "nope")
    assert r.returncode == 2 and "--out" in r.stderr and "Traceback" not in r.stderr
