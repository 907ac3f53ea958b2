"""`commsim sweep` and `commsim replay` through commsim.cli.main."""

from __future__ import annotations

import json

import pytest

from commsim.backends.fabric import FabricBackend
from commsim.cli import main
from commsim.scenario.sweep import Progress


def run(capsys, *argv):
    try:
        rc = main(list(argv))
    except SystemExit as e:          # argparse refused a flag's value
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def test_sweep_writes_json_and_html(capsys, tmp_path) -> None:
    js, ht = tmp_path / "out.json", tmp_path / "map.html"
    rc, out, err = run(capsys, "sweep", "--count", "25", "--seed", "3", "--filter", "clean",
                       "--json", str(js), "--html", str(ht))
    assert rc == 0, out
    assert "failures by kind: illegal-backend 0, not-best 0, cuda-error 0, numerics 0, leak 0, " \
           "nondeterministic 0" in out
    assert "25 scenario(s), 25 clean, 0 failed" in out
    assert "machine" in out and "backends (ops)" in out
    assert "sweep: 25/25 scenarios" in err          # not a TTY: progress lines, not a bar
    d = json.loads(js.read_text())
    assert d["count"] == 25 and d["failed"] == 0 and d["seed"] == 3
    assert all(s["id"][:3] in ("s3-", "k3-") and s["ok"] for s in d["scenarios"])
    assert set(d["failures_by_kind"]) == {"illegal-backend", "not-best", "cuda-error", "numerics",
                                          "leak", "nondeterministic", "knob-outcome", "nccl-outcome",
                                          "outcome"}
    assert sum(c["scenarios"] for c in d["cells"]) == 25
    page = ht.read_text()
    assert page.startswith("<!doctype html>") and "display: grid" in page
    assert all(c["machine"] in page for c in d["cells"])


def test_sweep_with_workers(capsys, tmp_path) -> None:
    js = tmp_path / "w.json"
    rc, out, _ = run(capsys, "sweep", "--count", "16", "--seed", "4", "--filter", "clean",
                     "--jobs", "2", "--json", str(js), "--quiet")
    assert rc == 0, out
    d = json.loads(js.read_text())
    from commsim.scenario.sweep import select_ids
    assert d["jobs"] == 2
    assert [s["id"] for s in d["scenarios"]] == select_ids(16, seed=4, filters=["clean"])   # in order


def test_sweep_failure_exits_1_with_replay_commands(capsys, monkeypatch, tmp_path) -> None:
    orig = FabricBackend.close

    def leaky(self):
        if not self.closed and self.mapped:
            self.mapped.pop()
        orig(self)

    monkeypatch.setattr(FabricBackend, "close", leaky)
    js = tmp_path / "f.json"
    rc, out, _ = run(capsys, "sweep", "--count", "12", "--seed", "5", "--filter", "gb200-nvl72:2",
                     "--filter", "clean", "--json", str(js), "--quiet")
    assert rc == 1
    assert "failed scenarios (replay each with the command shown):" in out
    d = json.loads(js.read_text())
    assert d["failed"] and d["failures_by_kind"]["leak"]
    for f in d["failures"]:
        assert f["replay"] == f"commsim replay {f['id']}" and f["replay"] in out


def test_replay_prints_explanation_and_verdict(capsys) -> None:
    rc, out, _ = run(capsys, "replay", "s0-1", "--determinism")
    assert rc == 0, out
    assert out.startswith("== s0-1: ")
    assert "oracle allows" in out and "verdict s0-1: clean" in out
    assert "admitted" in out or "declined" in out


def test_replay_of_a_planted_failure_exits_1(capsys, monkeypatch) -> None:
    orig = FabricBackend.close

    def leaky(self):
        if not self.closed and self.mapped:
            self.mapped.pop()
        orig(self)

    monkeypatch.setattr(FabricBackend, "close", leaky)
    from commsim.scenario.sweep import select_ids
    sid = select_ids(1, seed=5, filters=["gb200-nvl72:2", "tp4", "clean"])[0]
    rc, out, _ = run(capsys, "replay", sid)
    assert rc == 1 and "FAIL leak" in out and "leak:" in out


@pytest.mark.parametrize("argv, words", [
    (("sweep", "--count", "5", "--filter", "gb900"), "--filter 'gb900' matches no machine shape"),
    (("sweep", "--count", "5", "--filter", ""), "--filter: empty substring"),
    (("sweep", "--count", "-1"), "argument --count: -1 is negative"),
    (("sweep", "--count", "5", "--jobs", "0"), "argument --jobs: 0 is outside 1..256"),
    (("replay", "bogus"), "is not a generated id"),
    (("replay", "e999999999999"), "out of range"),
])
def test_bad_arguments_are_clear_errors(capsys, argv, words) -> None:
    rc, out, err = run(capsys, *argv)
    assert rc == 2
    assert words in err and "Traceback" not in err


def test_filter_that_can_match_nothing_in_reach(capsys) -> None:
    rc, _, err = run(capsys, "sweep", "--count", "3", "--filter", "rtx4090", "--filter", "tp16")
    assert rc == 2 and "only 0 of the first" in err


def test_progress_bar_on_a_tty() -> None:
    import io

    class Tty(io.StringIO):
        def isatty(self):
            return True

    s = Tty()
    p = Progress(4, s)
    for i in range(1, 5):
        p.update(i, 1)
    p.close()
    text = s.getvalue()
    assert "\r[" in text and "4/4" in text and "failed 1" in text


def test_help_lists_the_verbs(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "sweep" in out and "replay" in out


def test_a_crashing_worker_is_reported_not_hung() -> None:
    from commsim.scenario.sweep import run_sweep, select_ids
    ids = select_ids(40, seed=4, filters=["clean"])
    rep = run_sweep(ids, jobs=2, crash_ids=[ids[5]])
    assert [r["id"] for r in rep.records] == ids
    assert [r["id"] for r in rep.failed] == [ids[5]]
    f = rep.failed[0]
    assert f["kinds"] == ["cuda-error"] and "worker process died" in f["failures"][0]["detail"]
    assert f["replay"] == f"commsim replay {ids[5]}"


def test_positional_words_serve_merge_and_exec_arguments(capsys) -> None:
    """`sweep merge A B` and `sweep --exec PROG -- ARGS` share one positional list: the
    program's arguments reach it (they were read as an unknown action), stray words are refused
    with both uses named."""
    from commsim.cli import build_parser
    from commsim.commands.sweep import _positionals

    a = build_parser().parse_args(["sweep", "--exec", "prog.py", "--", "--fix", "merge"])
    _positionals(a)
    assert (a.action, a.reports, a.exec_args) == (None, [], ["--fix", "merge"])
    a = build_parser().parse_args(["sweep", "merge", "a.json", "b.json"])
    _positionals(a)
    assert (a.action, a.reports, a.exec_args) == ("merge", ["a.json", "b.json"], [])
    rc, out, err = run(capsys, "sweep", "x.json")
    assert rc == 2 and "sweep merge A.json" in err and "--exec PROG" in err, err


def test_workers_fork_from_this_process_only_while_it_runs_no_threads_of_its_own() -> None:
    """A fork copies one thread: workers are forked from the sweep's process while it has only
    the threads its imports started (what a forkserver would fork from), from a forkserver once
    it runs another thread. In a fresh process: the test's own may run threads (xdist)."""
    import subprocess
    import sys
    if not sys.platform.startswith("linux"):
        pytest.skip("threads are counted in /proc/self/task (Linux)")
    prog = ("import threading\n"
            "from commsim.scenario import sweep as S\n"
            "from commsim.scenario.sweep import run_one\n"
            "run_one('s4-1')\n"                       # a scenario in process starts no thread
            "print(S._context().get_start_method())\n"
            "ev = threading.Event(); t = threading.Thread(target=ev.wait); t.start()\n"
            "print(S._context().get_start_method())\n"
            "ev.set(); t.join()\n"
            # join() returns when the thread's Python state is gone; its OS thread leaves
            # /proc/self/task a moment later (seen on a loaded machine)
            "import time; end = time.monotonic() + 10\n"
            "while S._os_threads() != S._IMPORT_THREADS and time.monotonic() < end: time.sleep(0.01)\n"
            "print(S._context().get_start_method())\n")
    out = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["fork", "forkserver", "fork"]


def test_progress_lines_off_a_terminal_carry_the_eta() -> None:
    """A CI log gets a line per `every_n` done (or per `every_s`), each with rate and ETA;
    the last says done."""
    import io

    from commsim.scenario.sweep import Progress

    s = io.StringIO()
    p = Progress(6, s, every_n=2, what="sweep --exec", unit="machines", failed="with a defect")
    for i in range(1, 7):
        p.update(i, 1)
    lines = s.getvalue().splitlines()
    assert [ln.split(",")[0] for ln in lines] == ["sweep --exec: 2/6 machines",
                                                 "sweep --exec: 4/6 machines",
                                                 "sweep --exec: 6/6 machines"]
    assert all(", 1 with a defect, " in ln for ln in lines)
    assert "ETA " in lines[0] and "ETA " in lines[1] and lines[2].endswith(", done")
