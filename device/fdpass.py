"""POSIX fds between processes: AF_UNIX stream sockets with SCM_RIGHTS (reference §2.5).

The fd travels as ancillary data; the receiver gets a new fd number for the same open file
(here: the same cuMem allocation). A socket path lives in one host's filesystem, which is
why this route reaches only processes of one host (row V9).
"""

from __future__ import annotations

import socket


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
