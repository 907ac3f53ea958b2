"""device.fd_channel.UnixFdChannel, the real FdChannel, on CPU: an fd crosses by SCM_RIGHTS
and arrives as a new descriptor of the same open file; fds are sorted by sender; a peer that
never listens is a clear FdTransportError. Each end is a real process: the channel
checks the kernel-reported pid of its peer."""

from __future__ import annotations

import os

import pytest

from commsim.driver import FdChannel, FdTransportError
from device.fd_channel import UnixFdChannel


def _pipe_with(data: bytes) -> tuple[int, int]:
    r, w = os.pipe()
    os.write(w, data)
    return r, w


@pytest.fixture(autouse=True)
def private_key(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _sender(text: bytes, dst: int, after: int | None = None) -> int:
    """A forked process that sends a pipe holding `text` to `dst` (once `after` is readable)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            if after is not None:
                os.read(after, 1)
            r, _ = _pipe_with(text)
            UnixFdChannel().send(r, dst, timeout=30)
            code = 0
        finally:
            os._exit(code)
    return pid


def test_fd_crosses_and_is_the_same_open_file():
    b = UnixFdChannel()
    go_r, go_w = os.pipe()
    c = _sender(b"from c", b.pid)
    a = _sender(b"from a", b.pid, after=go_r)     # sends after c's fd has arrived
    try:
        assert isinstance(b, FdChannel)
        with pytest.raises(FdTransportError):
            b.receive(a, timeout=0.5)             # meanwhile c's fd came and is kept for later
        os.write(go_w, b"x")
        got = b.receive(a, timeout=30)
        assert os.read(got, 16) == b"from a"
        got2 = b.receive(c, timeout=5)
        assert os.read(got2, 16) == b"from c"
        for fd in (got, got2):
            os.close(fd)
        assert [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in (a, c)] == [0, 0]
    finally:
        for fd in (go_r, go_w):
            os.close(fd)
        b.close()


def test_peer_that_never_listens_is_a_transport_error():
    ch = UnixFdChannel()
    try:
        r, w = os.pipe()
        with pytest.raises(FdTransportError, match="timed out connecting"):
            ch.send(r, 4_200_000 + os.getpid() % 1000, timeout=0.2)   # above any pid_max
        with pytest.raises(FdTransportError, match="no fd from pid"):
            ch.receive(12345, timeout=0.1)
        os.close(r)
        os.close(w)
    finally:
        ch.close()
