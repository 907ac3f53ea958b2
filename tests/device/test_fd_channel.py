"""device.fd_channel.UnixFdChannel, the real FdChannel, on CPU: an fd crosses by SCM_RIGHTS
and arrives as a new descriptor of the same open file; fds are sorted by sender; a peer that
never listens is a clear FdTransportError."""

from __future__ import annotations

import os

import pytest

from commsim.driver import FdChannel, FdTransportError
from device.fd_channel import UnixFdChannel


def _pipe_with(data: bytes) -> tuple[int, int]:
    r, w = os.pipe()
    os.write(w, data)
    return r, w


def test_fd_crosses_and_is_the_same_open_file():
    base = 4_000_000 + os.getpid() % 1000 * 10        # pids no real process here has
    a, b, c = UnixFdChannel(base + 1), UnixFdChannel(base + 2), UnixFdChannel(base + 3)
    try:
        assert isinstance(a, FdChannel)
        r1, w1 = _pipe_with(b"from a")
        r2, w2 = _pipe_with(b"from c")
        c.send(r2, b.pid)            # another sender's fd arrives first and is kept for later
        a.send(r1, b.pid)
        got = b.receive(a.pid, timeout=5)
        assert got not in (r1, r2) and os.read(got, 16) == b"from a"
        got2 = b.receive(c.pid, timeout=5)
        assert os.read(got2, 16) == b"from c"
        for fd in (r1, w1, r2, w2, got, got2):
            os.close(fd)
    finally:
        for ch in (a, b, c):
            ch.close()


def test_peer_that_never_listens_is_a_transport_error():
    ch = UnixFdChannel(4_100_000 + os.getpid() % 1000)
    try:
        r, w = os.pipe()
        with pytest.raises(FdTransportError, match="timed out connecting"):
            ch.send(r, 4_200_000 + os.getpid() % 1000, timeout=0.2)
        with pytest.raises(FdTransportError, match="no fd from pid"):
            ch.receive(12345, timeout=0.1)
        os.close(r)
        os.close(w)
    finally:
        ch.close()
