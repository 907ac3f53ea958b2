"""Ctrl-C during `commsim exec --mode procs`, at different points of a small run: while the
launcher loads its modules, as the ranks start, while they run, and as the program ends by
itself. Each run exits 130 with `commsim: interrupted`, prints no traceback, and leaves no
process and no file behind.

Found once: a SIGINT while the launcher was still importing ended it with a raw
KeyboardInterrupt traceback (or, inside a compiled module's initialization, by SIGINT after
the message was printed); one that came while the launcher was ending the run's processes
stopped that cleanup half way. The ten-point version of this check, too slow for the suite,
is benchmarks/procs_sigint.py (ten points, about 3 s of CPU each)."""

from __future__ import annotations

import pytest

from .helpers import ROOT, interrupted_exec

PROGRAMS = ROOT / "tests" / "security" / "programs"
BLOCK = [str(PROGRAMS / "block_forever.py")]
ENDS = [str(PROGRAMS / "ready_then_sleep.py"), "0.2"]

POINTS = [
    pytest.param(BLOCK, None, 0.25, id="while-loading"),
    pytest.param(BLOCK, 0.5, 0.0, id="while-they-run"),
    pytest.param(ENDS, 0.2, 0.0, id="as-the-program-ends"),
]


@pytest.mark.parametrize("program, after_ready, after_start", POINTS)
def test_sigint_exits_130_with_its_line_and_leaves_nothing(program, after_ready, after_start):
    rc, err, alive, files = interrupted_exec(program, after_ready=after_ready,
                                             after_start=after_start)
    assert rc == 130, err
    assert err.rstrip().endswith("commsim: interrupted"), err
    assert "Traceback" not in err, err
    assert not alive, f"processes of the run still alive: {alive}"
    assert not files, f"left in the temp dir: {files}"
