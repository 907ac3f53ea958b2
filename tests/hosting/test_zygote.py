"""procs mode's warm zygote (commsim/launch/zygote.py): the ranks it forks get the verdict and
output fresh interpreters get; a module the program imports reads its rank's identity at
import; a module the run opts in is imported once, in the zygote; one that runs a torch
operation there sends the run to fresh interpreters, and the verdict says so; one zygote
serves the runs of its launcher and dies with it, SIGKILL included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from commsim.launch import zygote
from commsim.launch.agreement import STARTS, compare
from commsim.procs import tree
from commsim.util.pids import pid_running

from hosting_helpers import PROGRAMS, hosted

pytestmark = pytest.mark.skipif(os.environ.get(zygote.FRESH) == "1",
                                reason="COMMSIM_FRESH_INTERPRETERS=1: this launcher forks no rank")

PROG = PROGRAMS / "identity_at_import.py"
ROOT = PROGRAMS.parents[2]
LIMIT = 30.0        # seconds a loaded 2-core machine gets to end a process


def _until(cond, limit: float = LIMIT) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and not cond():
        time.sleep(0.05)
    return cond()


def test_a_module_read_at_import_sees_its_rank_and_the_zygote_agrees_with_fresh_interpreters():
    v, res, _ = hosted(PROG, "gb200-nvl72:2", nproc_per_host=2, visible="one", mode="procs")
    assert v.ok and v.fresh is None, v.format()
    first = zygote.current_pid()
    assert first is not None
    assert sorted(res) == [0, 1, 2, 3]
    for r, d in res.items():
        assert d["in_rank"] and d["at_import"] == d["now"], d
        assert d["now"][:2] == [str(r % 2), str(r % 2)], d
    assert res[0]["now"][2] == res[1]["now"][2] != res[2]["now"][2] == res[3]["now"][2]

    kw = dict(machine="gb200-nvl72:2", nproc_per_host=1, visible="one", mode="procs")
    vz, rz, _ = hosted(PROG, **kw)
    vf, rf, _ = hosted(PROG, zygote=False, **kw)
    assert zygote.current_pid() == first, "a second run started another zygote"
    assert vz.ok and vf.ok, vz.format() + "\n" + vf.format()
    assert vz.fresh is None and vf.fresh is None
    assert rz == rf and len(rz) == 2
    a = compare(vz, vf, STARTS)
    assert a.agree, a.text()


def test_an_opted_in_module_is_imported_in_the_zygote_and_sees_its_environment():
    v, res, _ = hosted(PROG, "hgx-h100-8", nproc_per_host=2, mode="procs",
                       preload=("import_time_identity",))
    assert v.ok and v.fresh is None, v.format()
    for d in res.values():
        assert not d["in_rank"] and d["at_import"][0] is None, d
    assert {d["now"][0] for d in res.values()} == {"0", "1"}


def test_a_torch_operation_in_an_opted_in_module_sends_the_run_to_fresh_interpreters():
    v, res, _ = hosted(PROG, "hgx-h100-8", nproc_per_host=1, mode="procs",
                       preload=("torch_at_import",))
    assert v.ok, v.format()
    assert v.fresh and "a torch operation (arange)" in v.fresh, v.fresh
    assert "fresh interpreters, not forked from the warm zygote: a torch operation" in v.format()
    assert res[0]["in_rank"]


def test_end_tree_takes_what_lies_below_a_root_but_not_the_root():
    parent = subprocess.Popen([sys.executable, "-c",
                               "import subprocess,sys,time; subprocess.Popen([sys.executable,'-c',"
                               "'import time; time.sleep(600)']); time.sleep(600)"])
    try:
        assert _until(lambda: tree.members((), below=[parent.pid]))
        child = tree.members((), below=[parent.pid])
        assert len(child) == 1 and parent.pid not in child
        assert tree.end_tree((), below=[parent.pid]) == child
        assert _until(lambda: not any(pid_running(p) for p in child))
        assert parent.poll() is None
    finally:
        parent.kill()
        parent.wait()


LAUNCHER = """
import sys
from commsim.launch import zygote
from commsim.launch.config import RunConfig
from commsim.launch.run import execute
v = execute(RunConfig(machine="hgx-h100-8", nproc_per_host=1, mode="procs",
                      command=[sys.argv[1]]), echo=False)
print(v.ok, zygote.current_pid(), flush=True)
sys.stdin.read()
"""


def test_an_idle_zygote_dies_with_its_launcher_killed():
    p = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(PROG)], cwd=ROOT,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        ok, pid = p.stdout.readline().split()
        assert ok == "True" and pid_running(int(pid))
        p.send_signal(signal.SIGKILL)
        p.wait(30)
        assert _until(lambda: not pid_running(int(pid))), "the zygote outlived its launcher"
    finally:
        p.kill()
        p.wait()
