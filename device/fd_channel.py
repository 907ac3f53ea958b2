"""POSIX fds between processes: AF_UNIX stream sockets with SCM_RIGHTS (row V9 of docs/driver-rules.md).

The fd travels as ancillary data; the receiver gets a new fd number for the same open file
(here: the same cuMem allocation). A socket reaches only processes of one host (row V9).

`UnixFdChannel` is the Driver protocol's FdChannel for real processes. Each process listens
on a socket in the abstract namespace (no file in /tmp to create, race or leave behind). That
namespace has no permissions: anyone may bind any free name, and /proc/net/unix shows every
bound one. So neither end trusts a name:
- the name is an HMAC of the pid under a key only this user can read (`key_path`), so another
  user cannot bind a peer's name before the peer does;
- the sender, once connected, asks the kernel who listens (SO_PEERCRED: the credentials of
  the process that called listen) and sends the fd only to the expected pid of its own uid;
- the receiver keeps an fd only from a sender of its own uid whose kernel-reported pid is the
  one its message names (a process cannot speak for another).
The path-based `listen` / `send_fd` / `recv_fd` below serve the device check and the rig,
which own their socket paths (in private mkdtemp directories); `send_fd` still refuses a
listener of another uid.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import secrets
import socket
import stat
import struct
import time
from functools import lru_cache
from pathlib import Path

from commsim.driver import FdTransportError
from commsim.util.peercred import peer_credentials

DEFAULT_TIMEOUT = 30.0      # FlashInfer's fd_exchange gives a peer 30 s to connect
_HEADER = struct.Struct("<q")   # the sender's pid
_KEY_BYTES = 32


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
        _, uid = peer_credentials(s)
        if uid != os.getuid():
            raise OSError(errno.EACCES, f"{path} is held by uid {uid}, not this user's "
                                        f"({os.getuid()}): fd {fd} not sent")
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



def key_path() -> Path:
    """This user's channel key: in the XDG cache directory, which is per user."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "commsim" / "fd-channel.key"


def channel_key() -> bytes:
    """The key every process of this user names its channel with, created on first use
    (0600 in a 0700 directory); refused unless it is this user's and nobody else's."""
    path = key_path()
    try:
        return _load_key(str(path))
    except FdTransportError:
        raise
    except OSError as e:
        raise FdTransportError(e.errno or errno.EIO, f"{path}: the fd channel key: {e.strerror or e}; "
                                                     f"set XDG_CACHE_HOME to a directory of this user's"
                                                     ) from None


@lru_cache(maxsize=4)
def _load_key(path: str) -> bytes:
    p = Path(path)
    p.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not p.exists():
        # Written whole under a name of its own, then linked into place: a process racing
        # this one either links first (and both read its key) or reads ours, never a part.
        tmp = p.with_name(f"{p.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, secrets.token_bytes(_KEY_BYTES))
        finally:
            os.close(fd)
        try:
            os.link(tmp, p)
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid() or st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise FdTransportError(errno.EACCES, f"{p}: the fd channel key must belong to uid "
                                                 f"{os.getuid()} with mode 0600 (it is uid "
                                                 f"{st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}); "
                                                 f"remove it and a new one is made")
        key = os.read(fd, _KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(key) != _KEY_BYTES:
        raise FdTransportError(errno.EINVAL, f"{p}: the fd channel key is {len(key)} bytes, not "
                                             f"{_KEY_BYTES}; remove it and a new one is made")
    return key


def channel_address(pid: int) -> str:
    """The abstract-namespace name (leading NUL) a process of this user with `pid` listens on."""
    tag = hmac.new(channel_key(), f"{os.getuid()}-{pid}".encode(), hashlib.sha256).hexdigest()
    return f"\0commsim-fd-{tag[:32]}"


class UnixFdChannel:
    """FdChannel over SCM_RIGHTS between processes of this host, keyed by pid."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._listener.bind(channel_address(self.pid))
        except OSError as e:
            self._listener.close()
            raise FdTransportError(e.errno or errno.EADDRINUSE,
                                   f"bind of this process's fd channel (pid {self.pid}): {e}; "
                                   f"another process holds its name") from None
        self._listener.listen(64)
        self._pending: dict[int, list[int]] = {}     # sender pid -> fds received, in order

    def send(self, fd: int, dst_pid: int, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Connect to `dst_pid`'s channel (retrying while the peer has not started listening
        yet, up to `timeout`) and send `fd` with this process's pid, if the kernel says the
        listener is `dst_pid` of this uid."""
        deadline = time.monotonic() + timeout
        addr = channel_address(dst_pid)
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.settimeout(max(0.1, deadline - time.monotonic()))
                s.connect(addr)
                pid, uid = peer_credentials(s)
                if (pid, uid) != (dst_pid, os.getuid()):
                    raise FdTransportError(errno.EACCES, f"the fd channel name of pid {dst_pid} is "
                                                         f"held by pid {pid} of uid {uid} (SO_PEERCRED): "
                                                         f"fd {fd} not sent")
                socket.send_fds(s, [_HEADER.pack(os.getpid())], [int(fd)])
                return
            except (ConnectionRefusedError, FileNotFoundError) as e:
                if time.monotonic() >= deadline:
                    raise FdTransportError(110, f"[fd_exchange] timed out connecting to the fd channel "
                                                f"of pid {dst_pid} after {timeout:g} s: {e}; POSIX fds "
                                                f"reach only processes of one host (row V9)") from None
                time.sleep(0.02)
            except FdTransportError:
                raise
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
        pid, uid = peer_credentials(peer)
        peer.settimeout(5.0)
        try:
            msg, fds, _, _ = socket.recv_fds(peer, _HEADER.size, 4)
        except OSError:
            return              # a peer that connects and sends nothing, or too slowly
        sender = _HEADER.unpack(msg)[0] if len(msg) == _HEADER.size else None
        if uid != os.getuid() or sender != pid or len(fds) != 1:
            for f in fds:       # another user's, a forged or a malformed message: drop its fds
                os.close(f)
            return
        self._pending.setdefault(sender, []).append(fds[0])

    def close(self) -> None:
        for fds in self._pending.values():
            for f in fds:
                os.close(f)
        self._pending.clear()
        self._listener.close()
