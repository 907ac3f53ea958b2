"""Who is on the other end of a local Unix socket, as the kernel recorded it: every local
channel checks it at both ends (a listener another user bound first, or another user's
process connecting, is refused before anything is sent)."""

from __future__ import annotations

import os
import socket
import struct

__all__ = ["peer_credentials", "same_user"]

_CRED = struct.Struct("3i")     # struct ucred: pid, uid, gid (man 7 unix, SO_PEERCRED)


def peer_credentials(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the other end: for a connecting socket those of the process that called
    listen(), for an accepted one those of the connecting process (man 7 unix, SO_PEERCRED)."""
    pid, uid, _ = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
    return pid, uid


def same_user(sock: socket.socket) -> bool:
    return peer_credentials(sock)[1] == os.getuid()
