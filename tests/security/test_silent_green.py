"""Finding: silent green. Inproc, a rank's os._exit(0) ended the launcher itself: exit status
0, no verdict, after the program had hit a CUDA error; a policy file whose import called
os._exit(0) made `run` and `explain` exit 0 with no output. Closed: while commsim owes a
verdict, os._exit in its own process unwinds (commsim/hosting/install/hard_exit.py): the inproc rank
exits with that status and the verdict lists it; a policy's os._exit is a named error. In
procs mode a rank's os._exit writes its report first, so both modes give the same verdict."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from .helpers import ROOT, SCENARIO

PROGRAM = ROOT / "tests" / "security" / "programs" / "hard_exit_after_error.py"


def _commsim(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    # A subprocess: without the fix os._exit would end the test process itself.
    return subprocess.run([sys.executable, "-m", "commsim.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize("mode", ["inproc", "procs"])
def test_a_rank_that_calls_os_exit_0_gets_a_verdict_for_every_rank(mode):
    r = _commsim("exec", "--machine", "hgx-h100-8", "--nproc-per-host", "2", "--mode", mode,
                 "--", "python", str(PROGRAM))
    err = r.stderr
    assert "commsim exec: ok: 2 rank(s)" in err, err
    assert r.returncode == 0, err          # what the processes chose, as in procs mode
    for rank in (0, 1):
        block = err.split(f"  rank {rank} (")[1].split("\n  rank")[0]
        assert "first CUDA error: cudaSetDevice -> cudaErrorInvalidDevice (101)" in block, err
        assert "the program called os._exit(0)" in block, err
    assert err.rstrip().splitlines()[-1].startswith("replay: ")


def _scenario_with_policy(tmp_path, policy_code: str):
    (tmp_path / "pol.py").write_text(textwrap.dedent(policy_code))
    sc = tmp_path / "s.toml"
    sc.write_text(SCENARIO.replace('policy = "default"', 'policy = "pol.py:P"'))
    return sc


@pytest.mark.parametrize("verb", ["run", "explain"])
def test_a_policy_file_whose_import_calls_os_exit_is_a_named_error(tmp_path, verb):
    sc = _scenario_with_policy(tmp_path, "import os\nos._exit(0)\n")
    r = _commsim(verb, *(["-v"] if verb == "run" else []), str(sc))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "pol.py called exit while loading: os._exit(0)" in r.stdout + r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("verb", ["run", "explain"])
def test_a_policy_method_that_calls_os_exit_fails_the_command(tmp_path, verb):
    sc = _scenario_with_policy(tmp_path, """
        import os
        from commsim.policy import Policy

        class P(Policy):
            def candidates(self, op, nbytes):
                os._exit(0)
        """)
    r = _commsim(verb, str(sc))
    assert r.returncode != 0, (r.stdout, r.stderr)
    assert r.stdout + r.stderr, "exited with no output"
    assert "Traceback" not in r.stderr


def test_forked_children_and_other_threads_keep_a_real_exit():
    code = textwrap.dedent("""
        import os, threading
        from commsim.hosting.install.hard_exit import HardExit, exits_unwind
        with exits_unwind():
            pid = os.fork()
            if pid == 0:
                os._exit(3)                      # multiprocessing's fork children do this
            assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 3
            try:
                os._exit(0)
            except HardExit as e:
                print("unwound", e.code, flush=True)
            t = threading.Thread(target=os._exit, args=(0,))
            t.start()
            t.join()
        print("not reached")
        """)
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, env={"PYTHONPATH": str(ROOT)})
    assert r.stdout == "unwound 0\n", (r.stdout, r.stderr)
    assert r.returncode == 1 and "os._exit(0) called in thread" in r.stderr
