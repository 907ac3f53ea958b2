"""The simulated NCCL's proxy socket (procs mode: cuMem POSIX fds between rank processes) against
another local user. Its abstract name is public (listed in /proc/net/unix), so both ends ask
the kernel who is on the other side (SO_PEERCRED): a proxy hands no fd to another user's
process, and a rank takes no fd from a listener another user bound first. Needs root to
become uid 65534 in a forked child; elsewhere it skips with that reason (a second process of
the same user is trusted, as everywhere in commsim)."""

from __future__ import annotations

import os
import select
import socket
import struct

import pytest

from commsim.libmodels.nccl.proxy import ProxySocket, _name, fetch

from .helpers import FORKED, fork_child

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="becoming another user needs root")


def _as_nobody(child) -> tuple[int, int]:
    """fork_child, the child having become uid 65534 first."""
    def as_nobody(w: int) -> None:
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        child(w)
    return fork_child(as_nobody)


def _read(r: int) -> bytes:
    out = b""
    while select.select([r], [], [], 30)[0]:
        chunk = os.read(r, 256)
        if not chunk:
            break
        out += chunk
    os.close(r)
    return out


def test_a_proxy_hands_no_fd_to_another_users_process():
    me, victim = os.getpid(), 4242
    proxy = ProxySocket("t1", me, timeout=5.0)
    secret_r, secret_w = os.pipe()
    os.write(secret_w, b"gpu memory")
    proxy.post(secret_r, victim)

    name = _name("t1", me)

    def child(w: int) -> None:
        # What fetch() sends, to the proxy's real name, claiming to be the victim's pid.
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(3)
        try:
            s.connect(name)
            s.sendall(struct.pack("<q", victim))
            _, fds, _, _ = socket.recv_fds(s, 1, 1)
            os.write(w, b"stole " + os.read(fds[0], 64) if fds else b"refused: no fd")
        except OSError as e:
            os.write(w, f"refused: {e}".encode())
    pid, r = _as_nobody(child)
    said = _read(r)
    os.waitpid(pid, 0)
    FORKED.remove(pid)
    proxy.close()
    for fd in (secret_r, secret_w):
        os.close(fd)
    assert not said.startswith(b"stole"), said
    assert said.startswith(b"refused"), said


def test_a_rank_takes_no_fd_from_a_listener_another_user_bound_first():
    owner = 5151
    name = _name("t2", owner)          # the victim's name (it carries the victim's uid)

    def child(w: int) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(name)
        s.listen(1)
        os.write(w, b"bound")
        s.settimeout(10)
        try:
            conn, _ = s.accept()
            conn.settimeout(2)
            r, _w = os.pipe()
            socket.send_fds(conn, [b"f"], [r])
        except OSError:
            pass
    pid, r = _as_nobody(child)
    assert select.select([r], [], [], 30)[0] and os.read(r, 5) == b"bound"
    with pytest.raises(OSError, match="held by another user"):
        fetch("t2", owner, os.getpid(), timeout=3.0)
    os.close(r)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    FORKED.remove(pid)
