"""Blocking sockets between ranks: inproc ranks cannot serve them, so the run goes to procs
and the verdict says so; a free-port probe does not count."""

from hosting_helpers import PROGRAMS, hosted

PROGRAM = PROGRAMS / "unix_socket_pair.py"


def test_an_inproc_run_with_a_listening_rank_runs_again_in_procs_and_says_so():
    v, res, out = hosted(PROGRAM, "hgx-h100-8", nproc_per_host=2, mode="inproc")
    assert v.ok, v.format() + out
    assert v.cfg.mode == "procs"
    # whichever rank the seeded schedule runs first names its call
    assert v.needs_procs in ("rank 0: socket.listen(AF_UNIX) at unix_socket_pair.py:21 in <module>",
                             "rank 1: socket.connect(AF_UNIX) at unix_socket_pair.py:30 in <module>")
    assert res == {0: {"rank": 0, "got": 1, "port_found": True},
                   1: {"rank": 1, "got": None, "port_found": True}}
    text = v.format()
    assert "run in procs mode, not inproc: blocking sockets between ranks need real" in text
    assert "--mode procs" in text.splitlines()[-1]
    assert "running again in procs mode" in out


def test_procs_mode_serves_the_same_program_untouched():
    v, res, out = hosted(PROGRAM, "hgx-h100-8", nproc_per_host=2, mode="procs")
    assert v.ok and v.needs_procs is None, v.format() + out
    assert res[0]["got"] == 1
