"""Found once: the run's store listened on every interface and every process unpickled what it
read from it; a value set from another address ran code in the launcher and every rank.
Closed: the store listens on loopback only, and every pickle on it is sealed (HMAC, per-run
secret); a forged value is refused unread."""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import pytest

from commsim.group.seal import ForgedValue, Seal, new_secret
from commsim.group.torch_dist import host_store
from commsim.procs.launcher import run_ranks_procs
from commsim.topology import GpuRef, build_preset


def non_loopback_ipv4() -> str | None:
    """An IPv4 address of this machine that is not loopback, if it has one."""
    try:
        out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True,
                             timeout=5).stdout
        for part in out.split():
            if "/" in part and part[0].isdigit() and not part.startswith("127."):
                return part.split("/")[0]
    except (OSError, subprocess.SubprocessError):
        pass
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.1", 9))          # no packet is sent: only the route is looked up
        addr = s.getsockname()[0]
    except OSError:
        return None
    finally:
        s.close()
    return None if addr.startswith("127.") or addr == "0.0.0.0" else addr


ADDR = non_loopback_ipv4()
PROOF = Path(tempfile.gettempdir()) / f"commsim-forged-store-ran-{os.getuid()}"
PAIR = list(build_preset("hgx-h100-8").gpu_refs())[:2]
needs_addr = pytest.mark.skipif(ADDR is None, reason="this machine has no non-loopback IPv4 "
                                                     "address to connect from")


class Payload:
    """What the attacker writes: unpickling it creates `path` (harmless proof of execution)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


@needs_addr
def test_store_refuses_a_connection_from_a_non_loopback_address():
    store = host_store(5)
    with socket.create_connection(("127.0.0.1", store.port), timeout=5):
        pass                                   # the ranks' way in works
    with pytest.raises(OSError):               # ECONNREFUSED: nothing listens there
        socket.create_connection((ADDR, store.port), timeout=5).close()


def probe_from_outside(wg, d):
    """Inside a live run: connect to the run's own store from the non-loopback address."""
    port = wg._world.store.port
    try:
        socket.create_connection((non_loopback_ipv4(), port), timeout=5).close()
        got = "connected"
    except OSError as e:
        got = type(e).__name__
    wg.barrier()
    return got


@needs_addr
def test_a_live_runs_store_is_not_reachable_from_another_address():
    out = run_ranks_procs(probe_from_outside, build_preset("hgx-h100-8"), PAIR,
                          timeout=30)
    assert out == [("ok", "ConnectionRefusedError")] * 2, out


def test_seal_refuses_forged_and_moved_values(tmp_path):
    seal = Seal(new_secret())
    proof = str(tmp_path / "ran")
    evil = pickle.dumps(Payload(proof))
    for blob in (evil, b"\x00" * 32 + evil, Seal(new_secret()).dumps("status/1", Payload(proof))):
        with pytest.raises(ForgedValue):
            seal.loads("status/1", blob)
    moved = seal.dumps("status/0", ("running",))          # rank 0's value under rank 1's key
    with pytest.raises(ForgedValue):
        seal.loads("status/1", moved)
    assert seal.loads("status/0", moved) == ("running",)
    assert not os.path.exists(proof)


def forge_and_die(wg, d):
    """Rank 0 plays the attacker: a fresh client of the store (no secret) overwrites rank 1's
    status and result with a payload; rank 1 then exits without a report, so the launcher
    and rank 0 read exactly those keys while diagnosing it."""
    import torch.distributed as dist
    w = wg._world
    wg.barrier()
    if wg.rank == 1:
        w.store.set("ready", "1")        # after rank 1's own post-barrier status write
    if wg.rank == 0:
        w.store.wait(["ready"])
        attacker = dist.TCPStore("127.0.0.1", w.store.port, is_master=False,
                                 timeout=timedelta(seconds=10))
        evil = pickle.dumps(Payload(str(PROOF)))
        attacker.set("status/1", evil)
        attacker.set("result/1", evil)
        attacker.set("forged", "1")
        wg.barrier(timeout=20)            # rank 1 never arrives: the diagnosis reads status/1
        return "unreachable"
    deadline = time.monotonic() + 20
    while not w.store.check(["forged"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    os._exit(0)


def test_a_forged_status_and_result_are_never_executed():
    # The ranks come from a forkserver that may predate this test (its environment too), so
    # the proof's path is fixed rather than passed.
    if PROOF.exists():
        PROOF.rmdir()
    out = run_ranks_procs(forge_and_die, build_preset("hgx-h100-8"), PAIR, timeout=20)
    ran = PROOF.exists()
    if ran:
        PROOF.rmdir()
    assert not ran, "a forged store value was unpickled"
    assert out[0][0] == "error" and "rank 1" in out[0][1], out
    assert out[1][0] == "died" and "forged" in out[1][1], out


def forge_a_death(wg, d):
    """Rank 0 plays the attacker: a client without the secret declares rank 1 dead. Both ranks
    then meet in a barrier, which must not believe the forged death."""
    w = wg._world
    if wg.rank == 0:
        attacker = dist_client(w.store.port)
        attacker.set("dead/1", "forged death")
        attacker.add("ndead", 1)
        w.store.set("forged", "1")
    else:
        w.store.wait(["forged"])
    believed = dict(w.dead())
    wg.barrier(timeout=20)
    return believed


def dist_client(port: int):
    import torch.distributed as dist
    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))


def test_a_forged_death_mark_does_not_fail_a_healthy_run():
    out = run_ranks_procs(forge_a_death, build_preset("hgx-h100-8"), PAIR, timeout=20)
    assert out == [("ok", {}), ("ok", {})], out
