"""Process-mode tests spawn real rank processes (forked from a forkserver that imports torch
once per test worker). They are few and small, and carry the `procs` marker so that
`-m "not procs"` skips them when iterating on thread-mode code."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from commsim.sim import shm


def pytest_collection_modifyitems(items):
    for it in items:
        if "tests/procs/" in str(it.fspath).replace(os.sep, "/"):
            it.add_marker(pytest.mark.procs)


def pytest_configure(config):
    config.addinivalue_line("markers", "procs: spawns real rank processes (process mode)")


def leftovers() -> list[Path]:
    """Shared-memory segments of runs this test process launched (prefix commsim-<pid>-)."""
    return shm.segments(f"{shm.PREFIX_HEAD}{os.getpid()}")


def pid_alive(pid: int) -> bool:
    """True when `pid` exists and is not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
