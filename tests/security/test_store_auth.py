"""The exec launcher's key-value store (commsim/hosting/wire/kvstore.py, mpirun-style runs in
procs mode) serves only the run's own processes.

Found once: any local user could connect to it, write a value under a guessable key (a rank's
status, which then erased where the rank was stuck, or a message that failed its receive),
grow the launcher without a bound in all (only each request was bounded), and hold server
threads open. Closed: a connection proves it holds the run's secret before any request is
read, the store's bytes in all and its connections are bounded.

The attacker is a separate process. This machine's test runs as root, so it also runs as
another uid (nobody, 65534) where setuid is allowed; otherwise only as a second process of
the same uid, which is the stronger case (it can read everything but the secret's file,
which it is not given)."""

from __future__ import annotations

import os
import socket
import struct

import pytest

from commsim.group.seal import Seal, new_secret
from commsim.group.torch_dist import last_status
from commsim.hosting.wire import kvstore
from commsim.hosting.wire.kvstore import StoreClient, StoreFull, StoreRefused, StoreServer
from commsim.runtime.diagnosis import BLOCKED

from .helpers import FORKED, fork_child

def _request(op: str, fields: list[bytes]) -> bytes:
    out = op.encode() + struct.pack("!I", len(fields))
    for f in fields:
        out += struct.pack("!I", len(f)) + f
    return out


def _after_nonce(port: int, first: bytes) -> str:
    """Connect, take the nonce, send `first` and then a set of rank 1's status; everything the
    server sent after the nonce, until it closed, in hex."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        assert len(s.recv(32, socket.MSG_WAITALL)) == 32
        got = b""
        try:
            s.sendall(first)
            s.sendall(_request("S", [b"status/1", b"\x00" * 32 + b"forged"]))
            while chunk := s.recv(64):
                got += chunk
        except OSError:              # the server closed while we were still sending
            pass
        return got.hex()


def _attacker(port: int, uid: int | None) -> list[str]:
    """The attack from a forked process, as `uid` if given (root can drop to it)."""
    def child(w: int) -> None:
        if uid is not None:
            os.setgid(uid)
            os.setuid(uid)
        # a guessed proof; then a client that skips the handshake and writes at once
        os.write(w, " ".join([_after_nonce(port, b"\x00" * 32), _after_nonce(port, b"")]).encode())
    pid, r = fork_child(child)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    _, status = os.waitpid(pid, 0)
    FORKED.remove(pid)
    assert status == 0, f"the attacker process failed ({status:#x})"
    return out.split()


UIDS = [None] + ([65534] if os.geteuid() == 0 else [])


@pytest.mark.parametrize("uid", UIDS, ids=lambda u: "same-uid" if u is None else f"uid-{u}")
def test_a_stranger_cannot_write_a_value_a_rank_reads(uid):
    secret = new_secret()
    seal = Seal(secret)
    srv = StoreServer(secret)
    try:
        rank1 = StoreClient("127.0.0.1", srv.port, 5.0, secret=secret)
        where = (BLOCKED, "tp", 3, "all_reduce", "step 7")
        rank1.set("status/1", seal.dumps("status/1", where))
        # each is refused and closed, and no request is read: no answer to the set
        assert _attacker(srv.port, uid) == [kvstore.REFUSED.hex()] * 2
        # the rank's status is its own, and says where it was stuck
        assert last_status(rank1, 1, seal) == "in group 'tp' collective #3 all_reduce (tag 'step 7')"
    finally:
        srv.close()


def test_a_client_with_another_secret_is_refused_by_name():
    srv = StoreServer(new_secret())
    try:
        with pytest.raises(StoreRefused, match="does not hold the run's secret"):
            StoreClient("127.0.0.1", srv.port, 5.0, secret=new_secret(), connect_timeout=2)
    finally:
        srv.close()


def test_what_the_store_holds_is_bounded_in_all():
    secret = new_secret()
    srv = StoreServer(secret, bound=10_000)
    try:
        c = StoreClient("127.0.0.1", srv.port, 5.0, secret=secret)
        for i in range(9):                    # 9 x (5 + 1000) bytes fit
            c.set(f"key{i}", b"x" * 1000)
        with pytest.raises(StoreFull, match=r"'key9' \(1000 bytes\).*over its bound of 10000"):
            c.set("key9", b"x" * 1000)
        assert not c.check(["key9"]) and srv.held() == 9 * 1004
        c.set("key0", b"y" * 10)              # overwriting counts the new size only
        assert srv.held() == 8 * 1004 + 14
        assert c.delete_key("key1")
        c.set("key9", b"x" * 1000)            # room again
        with pytest.raises(StoreFull):
            c.add("k" * 2000, 1)              # a counter's key counts too
        assert c.add("n", 2) == 2
    finally:
        srv.close()


def test_connections_that_never_prove_themselves_are_bounded_and_dropped(monkeypatch):
    monkeypatch.setattr(kvstore, "HANDSHAKE_S", 1.0)
    secret = new_secret()
    srv = StoreServer(secret)
    socks = []
    try:
        for _ in range(kvstore.MAX_UNPROVEN + 20):
            socks.append(socket.create_connection(("127.0.0.1", srv.port), timeout=10))
        # every accepted one got a nonce; past the bound the server closed it at once
        got = []
        for s in socks:
            try:
                got.append(len(s.recv(32)))
            except OSError:
                got.append(0)
        assert got.count(32) == kvstore.MAX_UNPROVEN and got.count(0) == 20, got
        assert srv.connections() <= kvstore.MAX_UNPROVEN
        # the stalled ones are dropped at the handshake's end: a rank gets in
        for s in socks:
            s.settimeout(10)
            if s.recv(1) != b"":
                pytest.fail("an unproven connection was kept past the handshake")
        c = StoreClient("127.0.0.1", srv.port, 5.0, secret=secret)
        assert c.add("alive", 1) == 1
    finally:
        for s in socks:
            s.close()
        srv.close()
