"""mpi4py as a hosted program sees it under `commsim exec --launcher mpirun`: every served
call's answers on a 2-tray GB200 slice and an HGX host in both modes, Split/Split_type
grouping, sealed store values, diagnosed hangs and mismatches, the TensorRT-LLM-style
example's verdicts, and the launcher flag's bad input."""

import subprocess
import sys
import time

import pytest

from hosting_helpers import EXAMPLES, PROGRAMS, hosted

TRTLLM = EXAMPLES / "trtllm_style_ipc_memory.py"


def _expected(rank: int, hosts: list[str]) -> dict:
    """What mpi_api.py must print on rank `rank` of a run whose rank r is on hosts[r]."""
    n = len(hosts)
    mine = [q for q in range(n) if hosts[q] == hosts[rank]]
    local = mine.index(rank)
    odd = sorted((q for q in range(n) if q % 2 == rank % 2), key=lambda q: -q)
    return {
        "rank": rank, "size": n, "props": [rank, n], "init": True, "host": hosts[rank],
        "env": {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(n),
                "OMPI_COMM_WORLD_LOCAL_RANK": str(local),
                "OMPI_COMM_WORLD_LOCAL_SIZE": str(len(mine)),
                "OMPI_COMM_WORLD_NODE_RANK": str(local), "RANK": None},
        "allgather": [[q, hosts[q]] for q in range(n)],
        "bcast": {"from": n - 1, "list": [n - 1] * 3},
        "gather": [q * q for q in range(n)] if rank == 0 else None,
        "scatter": f"part{rank}", "alltoall": [f"{q}->{rank}" for q in range(n)],
        "ops": [n * (n + 1) // 2, __import__("math").factorial(n), n, 1],
        "bits": [(1 << n) - 1, n == 1, True, 7],
        "reduce": list(range(n)) if rank == 0 else None,
        "p2p": [["early", (rank - 1) % n], ["late", (rank - 1) % n], (rank - 1) % n, 1],
        "split_type": [local, len(mine), mine], "host_split": [local, len(mine), True],
        "split": [odd.index(rank), len(odd), odd, odd], "null": [rank == 0, rank != 0],
        "freed": True,
        "buffers": [[q for q in range(n) for _ in (0, 1)], [float(sum(range(n))), float(n)],
                    [0, 1, 2], [(rank - 1) % n] * 2],
        "not_simulated": "commsim hosting: mpi4py.MPI.Comm.Scatterv is not simulated",
        "bad_root": [8, "MPI_ERR_ROOT"], "finalized": True,
    }


@pytest.mark.parametrize("machine, per_host, hosts", [
    ("gb200-nvl72:2", 2, ["gb200-nvl72-tray00"] * 2 + ["gb200-nvl72-tray01"] * 2),
    ("hgx-h100-8", 3, ["hgx-h100-0"] * 3)])
@pytest.mark.parametrize("mode", ["inproc", "procs"])
def test_every_served_call_answers_per_rank(machine, per_host, hosts, mode):
    v, res, out = hosted(PROGRAMS / "mpi_api.py", machine, mode=mode, nproc_per_host=per_host,
                         launcher="mpirun")
    assert v.ok, v.format() + out
    assert {r: res[r] for r in range(len(hosts))} == {
        r: _expected(r, hosts) for r in range(len(hosts))}
    assert "--launcher mpirun" in v.cfg.replay_command()


@pytest.mark.parametrize("mode", ["inproc", "procs"])
def test_without_mpirun_mpi4py_is_what_the_interpreter_has(mode):
    """torchrun's environment has no OMPI_COMM_WORLD_*: where mpi4py is installed its MPI_Init
    is a singleton (MPI-3.1 10.5.2), and the verdict says why; where it is not, importing it
    fails as in the real interpreter (served only under --launcher mpirun), even after an
    mpirun run of the same interpreter imported it."""
    from commsim.hosting.surfaces.mpi.mpi4py import installed
    prog = PROGRAMS / "mpi_world.py"
    hosted(prog, "gb200-nvl72:1", mode=mode, nproc_per_host=2, launcher="mpirun")
    v, res, out = hosted(prog, "gb200-nvl72:1", mode=mode, nproc_per_host=2)
    if not installed():
        assert [p.exception for p in v.ranks] == ["ModuleNotFoundError: No module named 'mpi4py'"] * 2
        return
    assert v.ok, v.format() + out
    assert [res[r]["world"] for r in (0, 1)] == [[0, 1, [0]], [0, 1, [1]]]
    assert all(any("not started by mpirun" in n for n in p.notes) for p in v.ranks)


def test_under_mpirun_comm_world_is_the_run_s_ranks():
    prog = PROGRAMS / "mpi_world.py"
    v, res, out = hosted(prog, "gb200-nvl72:1", nproc_per_host=2, launcher="mpirun")
    assert [res[r]["world"] for r in (0, 1)] == [[0, 2, [0, 1]], [1, 2, [0, 1]]]
    assert res[0]["torchrun_env"] is None and res[0]["secret_mode"] is None


def test_procs_store_is_loopback_and_its_secret_private():
    v, res, out = hosted(PROGRAMS / "mpi_world.py", "gb200-nvl72:1", mode="procs",
                         nproc_per_host=2, launcher="mpirun")
    assert v.ok, v.format() + out
    for r in (0, 1):
        assert res[r]["store_host"] == "127.0.0.1"
        assert res[r]["secret_mode"] == "0o600"
        assert res[r]["torchrun_env"] is None


def test_a_forged_store_value_is_refused():
    """Another local user can connect to the store but is refused before any request; a
    value that still is not sealed by the run (written by a client that holds the store's
    secret but not the seal's) is refused unopened."""
    from commsim.group.seal import ForgedValue, Seal, new_secret
    from commsim.group.torch_dist import ProcessWorld
    from commsim.hosting.wire.kvstore import StoreClient, StoreRefused, StoreServer
    from commsim.hosting.wire.ranks import ProcsTransport
    secret = new_secret()
    srv = StoreServer(secret)
    try:
        assert srv._srv.server_address[0] == "127.0.0.1"
        worlds = [ProcessWorld(StoreClient("127.0.0.1", srv.port, 5.0, secret=secret), r, 2,
                               secret=secret, timeout=5.0) for r in (0, 1)]
        t0, t1 = (ProcsTransport(w, time.time() + 5) for w in worlds)
        with pytest.raises(StoreRefused):
            StoreClient("127.0.0.1", srv.port, 5.0, secret=new_secret())
        # a client of the store whose values the seal does not know
        inner = StoreClient("127.0.0.1", srv.port, 5.0, secret=secret)
        other_seal = Seal(new_secret())
        # a message rank 1 never sent, posted where rank 0 reads its messages from rank 1
        key = "mpi/w/p2p/1>0"
        inner.add(f"{key}/n", 1)
        inner.set(f"{key}/1", b"\x00" * 32 + b"cos\nsystem\n(S'echo pwned'\ntR.")
        with pytest.raises(ForgedValue):
            t0.recv("w", 0, [1], -1, "recv", (0, 1))
        # a collective contribution forged under rank 1's key
        g0 = t0.group("w", "MPI_COMM_WORLD", (0, 1), 0)
        inner.set("mpi/w/0/1", other_seal.dumps("mpi/w/0/1", "forged"))
        with pytest.raises(ForgedValue):
            g0.all_gather_object("x", timeout=5.0)
        # what the run itself sealed goes through
        t1.send("w", 1, 0, 4, {"ok": 1})
        assert t0.recv("w", 0, [1], 4, "recv", (0, 1)) == (1, 4, {"ok": 1})
        # a client that does not speak the protocol does not take the store down
        import socket
        with socket.create_connection(("127.0.0.1", srv.port)) as s:
            s.sendall(b"Z\xff\xff\xff\xff")
        assert inner.add("alive", 1) == 1
    finally:
        srv.close()


@pytest.mark.parametrize("mode", ["inproc", "procs"])
def test_mismatched_calls_are_named(mode):
    v, res, out = hosted(PROGRAMS / "mpi_mismatch.py", "gb200-nvl72:1", "calls", mode=mode,
                         nproc_per_host=2, launcher="mpirun", timeout=30)
    assert v.exit_code == 1
    for p in v.ranks:
        assert "mpi4py collective mismatch on MPI_COMM_WORLD" in (p.exception or ""), v.format()
        assert "rank 0 called bcast(root=0)" in p.exception and "rank 1 called allgather" in p.exception


def test_a_collective_a_peer_never_enters_is_a_diagnosed_hang_inproc():
    v, res, out = hosted(PROGRAMS / "mpi_mismatch.py", "gb200-nvl72:1", "hang",
                         nproc_per_host=2, launcher="mpirun")
    assert v.exit_code == 1
    assert [p.status for p in v.ranks] == ["hang", "hang"], v.format()
    text = v.format()
    assert "mpi4py.MPI.Comm.Barrier on MPI_COMM_WORLD at mpi_mismatch.py" in text
    assert "mpi4py.MPI.Comm.recv(source=0, tag=5)" in text
    again, _, _ = hosted(PROGRAMS / "mpi_mismatch.py", "gb200-nvl72:1", "hang",
                         nproc_per_host=2, launcher="mpirun")
    assert again.trace_hash == v.trace_hash       # a function of the seed


def test_a_collective_a_peer_never_enters_times_out_naming_it_procs():
    t0 = time.monotonic()
    # The ranks' own group timeouts end this in about a second; the launcher's is only the
    # backstop, generous because a loaded 2-core machine can stall a rank process for seconds.
    v, res, out = hosted(PROGRAMS / "mpi_mismatch.py", "gb200-nvl72:1", "hang", mode="procs",
                         nproc_per_host=2, launcher="mpirun", timeout=45)
    assert v.exit_code == 1 and time.monotonic() - t0 < 60
    r0, r1 = v.ranks
    assert r0.status == r1.status == "failed", v.format()
    # each rank says whom it waited for, before the launcher's timeout would kill it
    assert "rank 0 arrived; rank 1 did not" in out and "GroupTimeout: timeout after" in out, out
    assert ("rank 1 is waiting until 'mpi4py.MPI.Comm.recv(source=0, tag=5) on MPI_COMM_WORLD"
            in r1.exception), v.format()
    assert "mpi4py.MPI.Comm.Barrier on MPI_COMM_WORLD at mpi_mismatch.py" in r0.exception


def test_a_peer_that_exits_is_seen_at_once_procs():
    t0 = time.monotonic()
    v, res, out = hosted(PROGRAMS / "mpi_mismatch.py", "gb200-nvl72:1", "exit", mode="procs",
                         nproc_per_host=2, launcher="mpirun", timeout=60)
    assert time.monotonic() - t0 < 30, "the survivor waited out the timeout"
    assert v.ranks[1].exit_code == 3
    assert "rank 1 failed with RankDied('its process exited with status 3')" in \
        v.ranks[0].exception, v.format()


def _signature(v):
    return [(p.rank, p.host, p.status, p.exit_code, p.exception,
             (p.first_cuda_error or {}).get("name")) for p in v.ranks]


@pytest.mark.parametrize("machine, per_host, fix, ok", [
    ("gb200-nvl72:2", 4, False, False), ("gb200-nvl72:2", 4, True, True),
    ("hgx-h100-8", 0, False, True), ("hgx-h100-8", 0, True, True)])
def test_trtllm_style_example_verdicts(machine, per_host, fix, ok):
    args = ("--fix",) if fix else ()
    v, _, out = hosted(TRTLLM, machine, *args, nproc_per_host=per_host, launcher="mpirun")
    assert v.ok == ok and v.exit_code == (0 if ok else 1), v.format() + out
    if not ok:
        for p in v.ranks:
            assert p.exception == "RuntimeError: CUDA error: cudaErrorInvalidResourceHandle"
            assert p.first_cuda_error["api"] == "cudaIpcOpenMemHandle"
            assert "trtllm_style_ipc_memory.py" in p.first_cuda_error["site"]
    elif fix and machine.startswith("gb200"):
        assert out.count("IPC declined") == 8
    else:
        assert out.count("IPC memory of 8 ranks ready") == 8 and v.residue == 0
    if machine.startswith("gb200") or not fix:          # both modes give the same verdict
        p, _, _ = hosted(TRTLLM, machine, *args, mode="procs", nproc_per_host=per_host,
                         launcher="mpirun")
        assert _signature(p) == _signature(v), p.format()


def test_launcher_flag(capsys):
    from commsim.cli import main
    assert main(["exec", "--launcher", "srun", "--machine", "gb200-nvl72:1", "--",
                 "python", str(TRTLLM)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("commsim: error: --launcher: 'srun'") and "torchrun, mpirun" in err
    assert "Traceback" not in err
    helptext = subprocess.run([sys.executable, "-m", "commsim.cli", "exec", "--help"],
                              capture_output=True, text=True).stdout
    assert "--launcher torchrun|mpirun" in helptext and "OMPI_COMM_WORLD_RANK" in helptext


def test_sweep_exec_launches_with_mpirun():
    """`sweep --exec ... --exec-launcher mpirun`: a generated two-host GB200 machine breaks the
    example (legacy IPC across hosts), and the replay carries the launcher."""
    from commsim.launch.sweep_exec import run_exec_sweep
    rep = run_exec_sweep([str(TRTLLM)], ["s0-26"], launcher="mpirun")
    (rec,) = rep.records
    assert rec["shape"] == "gb200-nvl72:2*2" and rec["kind"] == "ipc-across-hosts", rec
    assert "--launcher mpirun" in rec["replay"]
    rep = run_exec_sweep([str(TRTLLM), "--fix"], ["s0-26"], launcher="mpirun")
    assert rep.records[0]["kind"] == "ok", rep.records


def test_a_store_request_is_bounded_in_all_not_only_per_field(monkeypatch):
    """Each field within its bound, but more bytes in all than a request may carry: refused
    once past the total, so a stranger cannot make the launcher buffer without limit."""
    import socket
    import struct
    from commsim.hosting.wire import kvstore
    monkeypatch.setattr(kvstore, "MAX_MESSAGE", 1000)
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"S" + struct.pack("!I", 3) + (struct.pack("!I", 400) + b"x" * 400) * 3)
        with pytest.raises(ValueError, match="over its bound"):
            kvstore._recv_msg(b)
    a, b = socket.socketpair()                   # the server drops such a connection
    with a, b:
        a.sendall(b"S" + struct.pack("!I", 2) + (struct.pack("!I", 400) + b"x" * 400) * 2)
        assert kvstore._recv_msg(b) == (ord("S"), [b"x" * 400] * 2)
