"""Found once: SIGTERM, SIGHUP or SIGKILL of the launcher left every rank's segments and the
forkserver's socket directory behind, and nothing swept them later. Closed: SIGTERM and SIGHUP
unwind like Ctrl-C (ranks killed, run directory removed, temp dir cleaned at exit); after a
SIGKILL the ranks die with the forkserver (PR_SET_PDEATHSIG) and the next run, or `commsim
clean`, removes the dead run's directory. Only this user's stale runs are touched."""

from __future__ import annotations

import os
import signal

import pytest

from commsim.cli import main
from commsim.sim import shm

from .helpers import InFlight


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_leave_nothing_behind(tmp_path, sig):
    run = InFlight(tmp_path)
    try:
        assert shm.segments(run.prefix), "the run made no segments before the signal"
        run.p.send_signal(sig)
        _, err = run.p.communicate(timeout=60)
        assert run.p.returncode == 128 + sig, err
        assert f"terminated by {signal.Signals(sig).name}" in err
        assert "Traceback" not in err, err
        assert not run.wait_gone(run.tree), "processes of the run outlived it"
        assert not shm.segments(run.prefix)
        assert not list(run.tmp.iterdir()), f"left in the temp dir: {list(run.tmp.iterdir())}"
    finally:
        run.close()


def test_a_sigkilled_runs_ranks_die_and_its_segments_are_swept_later(tmp_path, capsys):
    run = InFlight(tmp_path)
    try:
        run.p.send_signal(signal.SIGKILL)
        run.p.communicate(timeout=30)
        assert not run.wait_gone(run.tree), "ranks outlived a SIGKILLed launcher"
        left = shm.segments(run.prefix)
        assert left, "nothing to sweep: the test proves nothing"
        # The run's watchdog sweeps them once the launcher is gone; `commsim clean` does
        # whatever it has not done yet. Either way none is left.
        assert main(["clean"]) == 0
        out = capsys.readouterr().out
        assert not shm.segments(run.prefix), out
    finally:
        run.close()


def test_stale_sweep_spares_live_runs_and_is_what_a_launch_does(monkeypatch):
    live = shm.new_prefix()                        # this process is alive: not stale
    dead_pid = 2 ** 22 + 12345                     # above pid_max's default: never alive
    dead = shm.SHM_DIR / f"{shm.PREFIX_HEAD}{dead_pid}-{'01' * 16}"
    dead.mkdir(0o700)
    (dead / "a1").write_bytes(b"x")
    try:
        swept = []
        import commsim.procs.launcher as launcher
        monkeypatch.setattr(launcher.shm, "sweep_stale",
                            lambda real=shm.sweep_stale: swept.append(real()) or swept[-1])
        from commsim.procs.launcher import run_ranks_procs
        from commsim.topology import build_preset
        run_ranks_procs(_noop, build_preset("hgx-h100-8"),
                        list(build_preset("hgx-h100-8").gpu_refs())[:1], timeout=20)
        assert swept and dead.name in swept[0]
        assert not dead.exists() and (shm.SHM_DIR / live).is_dir()
    finally:
        shm.sweep(live)
        shm.sweep(dead.name)


def _noop(wg, d):
    return wg.rank
