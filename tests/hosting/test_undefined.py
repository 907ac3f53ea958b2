"""`commsim exec` fails a run that hit undefined behaviour (row MC7: a plain read through a
multicast address succeeds as a call but its result is undefined) and names the program's
line; `--allow-undefined` passes it and still lists the event."""

from __future__ import annotations

from commsim.launch.cause import run_kind
from hosting_helpers import PROGRAMS, hosted


def test_undefined_behaviour_fails_the_run_and_says_where() -> None:
    v, res, out = hosted(PROGRAMS / "multicast_plain_load.py", "hgx-h100-8:1", nproc_per_host=2)
    assert [res[r]["err"] for r in (0, 1)] == [0, 0] and res[0]["mc"], out   # no CUDA error
    assert v.exit_code == 1 and run_kind(v) == "undefined"
    text = v.format()
    assert "Undefined behaviour (2 event(s); the run fails on it unless --allow-undefined):" in text
    assert "plain load/store through multicast address" in text
    assert "(row MC7), at multicast_plain_load.py:22 in <module>" in text, text


def test_allow_undefined_passes_it_and_still_lists_it() -> None:
    v, res, out = hosted(PROGRAMS / "multicast_plain_load.py", "hgx-h100-8:1", nproc_per_host=2,
                         allow_undefined=True)
    assert v.exit_code == 0, v.format()
    assert "flagged (allowed): " in v.format() and "--allow-undefined" in v.cfg.replay_command()
