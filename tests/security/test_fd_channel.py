"""The real fd channel (device/fd_channel.py) against another local user. Before: the sender
connected to the guessable abstract name `\\0commsim-fd-<uid>-<pid>` and sent without asking
who listened, so a user who bound a peer's name first received the fd (and read the GPU
memory behind it). Now the name is an HMAC under a key only this user can read, the sender
sends only to the pid it means of its own uid (SO_PEERCRED of the listener), and the receiver
keeps only fds whose sender is who its message says.

The attacker is a forked child that drops to uid 65534 (nobody) where the test runs as root;
elsewhere setuid is refused and it stays this uid, which is the same attack by a second
process: the pid check alone must then stop it."""

from __future__ import annotations

import os
import re
import select
import socket
import stat
import struct

import pytest

from commsim.driver import FdTransportError
from device import fd_channel
from device.fd_channel import UnixFdChannel, channel_address, key_path

from .helpers import FORKED, fork_child

NOBODY = 65534
_forked = FORKED


@pytest.fixture(autouse=True)
def private_key(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    yield key_path()
    while _forked:                  # a failed test leaves no child waiting for ever
        pid = _forked.pop()
        try:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def _drop_privileges() -> None:
    """Become another user where the machine allows it (root can); else stay this one."""
    try:
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    except PermissionError:
        pass


_fork = fork_child


def _report(r: int, limit: float = 30) -> bytes:
    out = b""
    while select.select([r], [], [], limit)[0]:
        chunk = os.read(r, 4096)
        if not chunk:
            break
        out += chunk
    os.close(r)
    return out


def _reap(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    _forked.remove(pid)
    return os.waitstatus_to_exitcode(status)


def _squat(name: str, report_ready: int | None = None):
    """A child that binds `name` first, takes one connection and reports what came with it."""
    def child(w: int) -> None:
        _drop_privileges()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(name)
        s.listen(4)
        os.write(w, f"uid={os.getuid()};".encode())
        s.settimeout(20)
        try:
            peer, _ = s.accept()
        except socket.timeout:
            os.write(w, b"no connection")
            return
        peer.settimeout(5)
        try:
            msg, fds, _, _ = socket.recv_fds(peer, 64, 4)
        except OSError:
            msg, fds = b"", []
        data = os.read(fds[0], 64) if fds else b""
        os.write(w, f"fds={len(fds)};data={data!r}".encode())
    return child


def _wait_for(r: int, token: bytes) -> bytes:
    seen = b""
    while token not in seen:
        assert select.select([r], [], [], 30)[0], f"child never said {token!r}: {seen!r}"
        chunk = os.read(r, 256)
        assert chunk, f"child ended before {token!r}: {seen!r}"
        seen += chunk
    return seen


def test_a_squatted_name_gets_no_fd_and_the_real_peer_does():
    secret_r, secret_w = os.pipe()
    os.write(secret_w, b"gpu memory")

    go_r, go_w = os.pipe()
    sender = os.getpid()

    def victim(w: int) -> None:
        os.read(go_r, 1)                  # opens its channel only when told
        ch = UnixFdChannel()
        os.write(w, b"listening;")
        fd = ch.receive(sender, timeout=30)
        os.write(w, os.read(fd, 64))
        ch.close()

    victim_pid, victim_out = _fork(victim)
    squatter_pid, squatter_out = _fork(_squat(channel_address(victim_pid)))
    ready = _wait_for(squatter_out, b";")     # another user (root here) or another process
    ch = UnixFdChannel()
    try:
        with pytest.raises(FdTransportError, match=rf"held by pid {squatter_pid} .*SO_PEERCRED.*not sent"):
            ch.send(secret_r, victim_pid, timeout=10)
        stolen = ready + _report(squatter_out)
        assert _reap(squatter_pid) == 0
        assert b"fds=0;data=b''" in stolen, stolen

        os.write(go_w, b"x")              # the name is free again: the intended peer binds it
        _wait_for(victim_out, b"listening;")
        ch.send(secret_r, victim_pid, timeout=30)
        assert _report(victim_out) == b"gpu memory"
        assert _reap(victim_pid) == 0
    finally:
        ch.close()
        for fd in (secret_r, secret_w, go_r, go_w):
            os.close(fd)
    assert os.getuid() != 0 or ready == f"uid={NOBODY};".encode(), ready


def test_a_process_whose_name_is_held_cannot_open_its_channel():
    squatter_pid, out = _fork(_squat(channel_address(os.getpid())))
    _wait_for(out, b";")
    with pytest.raises(FdTransportError, match="another process holds its name"):
        UnixFdChannel()
    os.kill(squatter_pid, 9)
    _reap(squatter_pid)
    os.close(out)


def _send_as(name: str, claimed_pid: int, other_user: bool):
    """A child that sends a pipe fd to `name`, its message claiming to come from `claimed_pid`."""
    def child(w: int) -> None:
        if other_user:
            _drop_privileges()
        r, pw = os.pipe()
        os.write(pw, b"forged")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(name)
        socket.send_fds(s, [struct.pack("<q", claimed_pid)], [r])
        s.close()
        os.write(w, b"sent")
    return child


def test_the_receiver_keeps_only_fds_from_who_the_message_names():
    ch = UnixFdChannel()
    try:
        genuine_pid, genuine_out = _fork(lambda w: None)        # a pid of this uid to impersonate
        _reap(genuine_pid)
        os.close(genuine_out)
        for other_user in (True, False):
            pid, out = _fork(_send_as(channel_address(os.getpid()), genuine_pid, other_user))
            assert _report(out) == b"sent"
            assert _reap(pid) == 0
        with pytest.raises(FdTransportError, match=f"no fd from pid {genuine_pid}"):
            ch.receive(genuine_pid, timeout=1)
        assert not ch._pending, "a forged fd was kept"

        def honest(w: int) -> None:
            r, pw = os.pipe()
            os.write(pw, b"honest")
            UnixFdChannel().send(r, ch.pid, timeout=10)
        pid, out = _fork(honest)
        fd = ch.receive(pid, timeout=30)
        assert os.read(fd, 16) == b"honest"
        os.close(fd)
        assert _reap(pid) == 0
        os.close(out)
    finally:
        ch.close()


def test_the_name_is_unguessable_without_the_users_key(private_key, tmp_path, monkeypatch):
    name = channel_address(12345)
    assert re.fullmatch("\0commsim-fd-[0-9a-f]{32}", name)
    st = private_key.stat()
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid()
    assert stat.S_IMODE(private_key.parent.stat().st_mode) == 0o700

    def read_key(w: int) -> None:
        _drop_privileges()
        try:
            open(private_key, "rb").read()
            os.write(w, b"read")
        except PermissionError:
            os.write(w, b"refused")
    pid, out = _fork(read_key)
    got = _report(out)
    _reap(pid)
    if os.getuid() == 0:
        assert got == b"refused"

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "other"))
    assert channel_address(12345) != name            # another key, another name


def test_a_key_others_can_read_is_refused(private_key):
    channel_address(1)
    private_key.chmod(0o644)
    fd_channel._load_key.cache_clear()
    with pytest.raises(FdTransportError, match=r"fd-channel.key: .* mode 0600 .*remove it"):
        channel_address(1)
