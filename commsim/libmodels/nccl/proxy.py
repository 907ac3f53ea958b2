"""The proxy's Unix socket for process mode: how a cuMem POSIX fd reaches the rank that
imports it when ranks are OS processes (src/proxy.cc proxyGetFd + src/misc/ipcsocket.cc,
NVIDIA/nccl v2.27.3-1: the importer asks the owner's proxy thread over an abstract Unix
socket, and the proxy replies with the fd by SCM_RIGHTS). The fds are real (the simulated
driver's POSIX-fd handles are real descriptors), so they travel as on a GPU host.

In-process ranks share one OS process: their fds travel over the driver's own fd channel
(`calls.DriverCalls`), which a cooperative scheduler can wait on.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from typing import Any

from commsim.util.peercred import same_user


def _name(tag: str, pid: int) -> bytes:
    return f"\0commsim-nccl-{os.getuid()}-{tag}-{pid}".encode()


class ProxySocket:
    """One communicator's proxy socket in this process: fds posted for a peer pid are sent
    to it when it connects and names itself."""

    def __init__(self, tag: str, pid: int, timeout: float) -> None:
        self.tag, self.timeout = tag, timeout
        self.posted: dict[int, list[int]] = {}
        self.lock = threading.Condition()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(_name(tag, pid))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.open = True
        self.thread = threading.Thread(target=self._serve, daemon=True, name="nccl-proxy")
        self.thread.start()

    def post(self, fd: int, pid: int) -> None:
        with self.lock:
            self.posted.setdefault(pid, []).append(os.dup(fd))
            self.lock.notify_all()

    def _serve(self) -> None:
        while self.open:
            try:
                conn, _ = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            with conn:
                if not same_user(conn):
                    continue       # another user's process: it gets nothing, not even a reply
                conn.settimeout(self.timeout)
                pid = struct.unpack("<q", conn.recv(8))[0]
                with self.lock:
                    self.lock.wait_for(lambda: self.posted.get(pid) or not self.open, self.timeout)
                    fds = self.posted.get(pid) or []
                    fd = fds.pop(0) if fds else None
                if fd is None:
                    continue
                try:
                    socket.send_fds(conn, [b"f"], [fd])
                finally:
                    os.close(fd)

    def close(self) -> None:
        self.open = False
        with self.lock:
            self.lock.notify_all()
            for fds in self.posted.values():
                for fd in fds:
                    os.close(fd)
            self.posted.clear()
        self.thread.join(1.0)
        self.sock.close()


def fetch(tag: str, owner: int, me: int, timeout: float) -> int:
    """Ask `owner`'s proxy for the fd it posted for this process (pid `me`)."""
    deadline = time.monotonic() + timeout
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(_name(tag, owner))
            break
        except (ConnectionRefusedError, FileNotFoundError):
            s.close()
            if time.monotonic() > deadline:
                raise OSError(111, f"proxy of pid {owner} not listening") from None
            time.sleep(0.01)
    with s:
        if not same_user(s):
            # The name is public (abstract names are listed in /proc/net/unix): another user
            # may have bound it first to hand this rank an fd of its choosing.
            raise OSError(13, f"proxy socket of pid {owner} is held by another user (SO_PEERCRED)")
        s.settimeout(timeout)
        s.sendall(struct.pack("<q", me))
        _, fds, _, _ = socket.recv_fds(s, 1, 1)
        if not fds:
            raise OSError(104, f"proxy of pid {owner} sent no fd")
        return fds[0]


class ProcessFds:
    """DriverCalls' fd transport in process mode."""

    def __init__(self, tag: str, pid: int, timeout: float = 60.0) -> None:
        self.tag, self.pid, self.timeout = tag, pid, timeout
        self.proxy = ProxySocket(tag, pid, timeout)

    def send(self, fd: int, pid: int) -> None:
        self.proxy.post(fd, pid)

    def receive(self, pid: int) -> int:
        return fetch(self.tag, pid, self.pid, self.timeout)

    def close(self) -> None:
        self.proxy.close()


def process_transport(tag: str, driver: Any) -> ProcessFds:
    return ProcessFds(tag, driver.getpid())
