"""Inproc, SIGTERM and SIGHUP reached the program's rank as an exception of its own: the run
exited 1 with a FAIL blaming rank 0. They are the launcher's: the run ends 128 + signal, as
in procs mode, with nothing blamed and nothing left behind."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

from .helpers import ROOT

PROGRAM = ROOT / "tests" / "security" / "programs" / "block_forever.py"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_inproc_sigterm_and_sighup_exit_128_plus_signal_blaming_no_rank(sig):
    tmp = tempfile.mkdtemp(prefix="cs-sig-", dir="/tmp")
    p = subprocess.Popen([sys.executable, "-m", "commsim.cli", "exec", "--machine", "hgx-h100-8",
                          "--nproc-per-host", "2", "--mode", "inproc", "--", "python", str(PROGRAM)],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=tmp))
    try:
        assert "ready" in p.stdout.readline()
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
        assert p.returncode == 128 + sig, err
        assert f"terminated by {signal.Signals(sig).name}" in err
        assert "FAIL" not in err and "rank 0" not in err and "Traceback" not in err, err
        assert not os.listdir(tmp), f"left in the temp dir: {os.listdir(tmp)}"
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
        shutil.rmtree(tmp, ignore_errors=True)
