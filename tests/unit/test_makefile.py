"""The Makefile refuses a Python older than 3.11 with a message saying so, before it creates
a virtual environment (with 3.10 pip resolved the CUDA build of torch
and backtracked for minutes)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_make_refuses_python_older_than_3_11(tmp_path):
    old = tmp_path / "python3.10"
    # Answers like a 3.10 interpreter: reports 3.10 and fails the Makefile's version test.
    old.write_text("#!/bin/sh\n[ \"$1\" = --version ] && { echo 'Python 3.10.12'; exit 0; }\n"
                   "exec python3 -c 'import sys; sys.exit(1)'\n")
    old.chmod(0o755)
    venv = tmp_path / "venv"
    p = subprocess.run(["make", "-s", "venv", f"PYTHON={old}", f"VENV={venv}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "commsim needs Python 3.11 or newer" in p.stderr and "Python 3.10.12" in p.stderr
    assert "make PYTHON=python3.11" in p.stderr
    assert not venv.exists()
