"""POSIX fds between processes: AF_UNIX stream sockets with SCM_RIGHTS (reference §2.5).

The fd travels as ancillary data; the receiver gets a new fd number for the same open file
(here: the same cuMem allocation). A socket reaches only processes of one host (row V9).

`UnixFdChannel` is the Driver protocol's FdChannel for real processes. Each process listens
on a socket in the abstract namespace (no file in /tmp to create, race or leave behind), named
by its uid and pid so a peer that knows the pid finds it; the receiver accepts only a sender
of its own uid (SO_PEERCRED), so another local user can neither inject an fd nor learn one.
The path-based `listen` / `send_fd` / `recv_fd` below serve the device check and the rig,
which own their socket paths.
"""

from __future__ import annotations

import os
import socket
import struct
import time

from commsim.driver import FdTransportError

DEFAULT_TIMEOUT = 30.0      # FlashInfer's fd_exchange gives a peer 30 s to connect
_HEADER = struct.Struct("<q")   # the sender's pid


def listen(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(8)
    return s


def send_fd(path: str, fd: int, timeout: float = 30.0) -> None:
    """sendmsg(SCM_RIGHTS) of `fd` to the process listening on `path`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        socket.send_fds(s, [b"fd"], [int(fd)])


def recv_fd(listener: socket.socket, timeout: float = 30.0) -> int:
    """Accept one connection on `listener` and return the fd it carried."""
    listener.settimeout(timeout)
    peer, _ = listener.accept()
    with peer:
        peer.settimeout(timeout)
        _, fds, _, _ = socket.recv_fds(peer, 16, 1)
    if not fds:
        raise OSError("recvmsg: no fd came with the message (SCM_RIGHTS)")
    return fds[0]


def channel_address(pid: int, uid: int | None = None) -> str:
    """The abstract-namespace name a process with `pid` listens on (leading NUL)."""
    return f"\0commsim-fd-{os.getuid() if uid is None else uid}-{pid}"


class UnixFdChannel:
    """FdChannel over SCM_RIGHTS between processes of this host, keyed by pid."""

    def __init__(self, pid: int | None = None):
        self.pid = os.getpid() if pid is None else pid
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(channel_address(self.pid))
        self._listener.listen(64)
        self._pending: dict[int, list[int]] = {}     # sender pid -> fds received, in order

    def send(self, fd: int, dst_pid: int, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Connect to `dst_pid`'s channel (retrying while the peer has not started listening
        yet, up to `timeout`) and send `fd` with this process's pid."""
        deadline = time.monotonic() + timeout
        addr = channel_address(dst_pid)
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.settimeout(max(0.1, deadline - time.monotonic()))
                s.connect(addr)
                socket.send_fds(s, [_HEADER.pack(self.pid)], [int(fd)])
                return
            except (ConnectionRefusedError, FileNotFoundError) as e:
                if time.monotonic() >= deadline:
                    raise FdTransportError(110, f"[fd_exchange] timed out connecting to the fd channel "
                                                f"of pid {dst_pid} after {timeout:g} s: {e}; POSIX fds "
                                                f"reach only processes of one host (row V9)") from None
                time.sleep(0.02)
            except OSError as e:
                raise FdTransportError(e.errno or 5, f"sendmsg(SCM_RIGHTS) of fd {fd} to pid {dst_pid}: "
                                                     f"{e}") from None
            finally:
                s.close()

    def receive(self, src_pid: int, timeout: float | None = None) -> int:
        """The next fd `src_pid` sent; fds of other senders that arrive first are kept."""
        deadline = time.monotonic() + (DEFAULT_TIMEOUT if timeout is None else timeout)
        while not self._pending.get(src_pid):
            left = deadline - time.monotonic()
            if left <= 0:
                raise FdTransportError(110, f"recvmsg: no fd from pid {src_pid} within the timeout")
            self._listener.settimeout(left)
            try:
                peer, _ = self._listener.accept()
            except socket.timeout:
                continue
            with peer:
                self._take(peer)
        return self._pending[src_pid].pop(0)

    def _take(self, peer: socket.socket) -> None:
        creds = peer.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _, uid, _ = struct.unpack("3i", creds)
        peer.settimeout(5.0)
        msg, fds, _, _ = socket.recv_fds(peer, _HEADER.size, 4)
        if uid != os.getuid() or len(msg) != _HEADER.size or len(fds) != 1:
            for f in fds:           # another user's (or a malformed) message: drop its fds
                os.close(f)
            return
        (sender,) = _HEADER.unpack(msg)
        self._pending.setdefault(sender, []).append(fds[0])

    def close(self) -> None:
        for fds in self._pending.values():
            for f in fds:
                os.close(f)
        self._pending.clear()
        self._listener.close()
