"""Process-mode tests spawn real rank processes (forked from a forkserver that imports torch
once per test worker). They are few and small, and carry the `procs` marker so that
`-m "not procs"` skips them when iterating on thread-mode code."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(items):
    for it in items:
        if "tests/procs/" in str(it.fspath).replace(os.sep, "/"):
            it.add_marker(pytest.mark.procs)


def pytest_configure(config):
    config.addinivalue_line("markers", "procs: spawns real rank processes (process mode)")
