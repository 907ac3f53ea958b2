"""--junit-xml on `exec` (a test case per rank), `sweep` (per scenario) and `sweep --exec`
(per generated machine), read back with junitparser as a CI system would; `sweep --exec`
refuses the plain-sweep flags it cannot honour, by name."""

import subprocess
import sys

import pytest

junitparser = pytest.importorskip("junitparser", reason="junitparser is in the test extra")

from hosting_helpers import EXAMPLES, PROGRAMS

FLASHINFER = str(EXAMPLES / "flashinfer_style_ipc_workspace.py")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "commsim.cli", *args], capture_output=True,
                          text=True, timeout=300)


def _cases(path):
    xml = junitparser.JUnitXml.fromfile(str(path))
    suites = list(xml) if isinstance(xml, junitparser.JUnitXml) else [xml]
    assert len(suites) == 1
    return suites[0], list(suites[0])


def test_exec_writes_a_case_per_rank_with_the_root_cause_and_replay(tmp_path):
    out = tmp_path / "exec.xml"
    r = _cli("exec", "--machine", "hgx-h100-8", "--nproc-per-host", "3", "--mode", "inproc",
             "--quiet", "--junit-xml", str(out), "--", "python", str(PROGRAMS / "peer_gives_up.py"))
    assert r.returncode == 1, r.stderr
    suite, cases = _cases(out)
    assert (suite.tests, suite.failures) == (3, 3)
    assert [c.name for c in cases] == ["rank 0", "rank 1", "rank 2"]
    fail = cases[0].result[0]
    assert isinstance(fail, junitparser.Failure)
    assert "Root Cause (first observed failure):" in fail.text
    assert "replay: commsim exec --machine hgx-h100-8 --nproc-per-host 3" in fail.text


def test_sweep_exec_writes_a_case_per_machine(tmp_path):
    out = tmp_path / "sweep-exec.xml"
    r = _cli("sweep", "--exec", FLASHINFER, "--count", "6", "--quiet", "--junit-xml", str(out))
    assert r.returncode == 1
    suite, cases = _cases(out)
    assert suite.tests == 6 and [c.name for c in cases] == [f"s0-{i}" for i in range(6)]
    failed = [c for c in cases if c.result]
    assert failed and suite.failures == len(failed)
    across = next(c for c in failed if c.result[0].type == "ipc-across-hosts")
    assert "row L8" in across.result[0].message
    assert across.result[0].text.startswith("replay: commsim exec --scenario s0-")


def test_sweep_writes_a_case_per_scenario(tmp_path):
    out = tmp_path / "sweep.xml"
    r = _cli("sweep", "--count", "12", "--seed", "7", "--quiet", "--junit-xml", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    suite, cases = _cases(out)
    assert (suite.tests, suite.failures) == (12, 0) and all(c.is_passed for c in cases)


@pytest.mark.parametrize("flag", [["--html", "x.html"], ["--jobs", "2"], ["--determinism"]])
def test_sweep_exec_refuses_what_it_cannot_honour(flag):
    r = _cli("sweep", "--exec", FLASHINFER, "--count", "2", *flag)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert f"{flag[0]} does not apply to sweep --exec" in r.stderr
