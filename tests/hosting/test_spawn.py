"""A hosted program that spawns its own workers (torch.multiprocessing.spawn): the workers are
hosted too, as processes of their rank's simulated host."""

import pytest

from hosting_helpers import PROGRAMS, hosted


@pytest.mark.parametrize("mode, args", [("procs", ("--ipc", "--workers", "1")),
                                        ("inproc", ("--workers", "1"))])
def test_spawned_workers_live_on_their_rank_host(mode, args):
    # Each worker is a fresh interpreter importing torch, one after another in inproc mode:
    # minutes on a loaded 2-core machine, hence the generous bound.
    v, _, out = hosted(PROGRAMS / "spawn_workers.py", "gb200-nvl72:2", *args, mode=mode,
                       nproc_per_host=1, timeout=400)
    assert v.ok, v.format() + out
    assert len(v.workers) == 2
    for w in v.workers:
        assert w.host == v.cfg.placement[w.rank][0]      # the parent rank's tray
        assert w.slot >= 2 and not w.residue
    opened = 1 if mode == "procs" else 0
    for r, tray in enumerate(("gb200-nvl72-tray00", "gb200-nvl72-tray01")):
        assert f"rank {r} on {tray}: 1 workers on the same host, {opened} IPC buffers opened" in out


def test_a_process_started_after_its_run_ended_runs_plain_and_says_nothing(tmp_path):
    """multiprocessing's resource tracker, spawned by a rank just before the run ends, can
    start after the run's directory is gone: it must not print an error into the user's
    output after the verdict (it did, as a traceback from sitecustomize)."""
    import os
    import subprocess
    import sys

    from commsim.launch.bootstrap import write_sitecustomize
    boot = write_sitecustomize(str(tmp_path))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([boot, os.environ.get("PYTHONPATH", "")]),
               COMMSIM_HOSTING=str(tmp_path / "gone" / "config.json"))
    r = subprocess.run([sys.executable, "-c", "import socket; print(socket.gethostname())"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.strip() == socket_hostname()


def test_a_process_whose_run_directory_goes_while_it_starts_runs_plain(tmp_path):
    """The same race one step later: the config was read, then the run's directory went before
    the process took its slot (seen in CI as a FileNotFoundError for stacks/<slot>.txt)."""
    import os
    import subprocess
    import sys

    from commsim.launch.bootstrap import write_sitecustomize
    from commsim.launch.config import RunConfig
    boot = write_sitecustomize(str(tmp_path))
    cfg = RunConfig(machine="hgx-h100-8", run_dir=str(tmp_path / "gone"), placement=[("h0", 0)])
    cfg.dump(str(tmp_path / "config.json"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([boot, os.environ.get("PYTHONPATH", "")]),
               COMMSIM_HOSTING=str(tmp_path / "config.json"), COMMSIM_HOSTING_SLOT="")
    r = subprocess.run([sys.executable, "-c", "import os; print(os.environ['COMMSIM_HOSTING_SLOT'] == '')"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.strip() == "True"


def socket_hostname() -> str:
    import socket
    return socket.gethostname()
