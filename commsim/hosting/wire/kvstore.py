"""The key-value store of a hosted MPI run in procs mode: a server the exec launcher hosts on
127.0.0.1 only, and the ranks' client.

The client answers the calls `commsim.group.torch_dist.ProcessWorld` makes of torch's
TCPStore (set, get, multi_get, check, wait, add, delete_key, set_timeout), so the ranks of a
run launched by `--launcher mpirun` use commsim's sealed round protocol without importing
torch (an mpi4py program need not load it).

Trust (docs/processes.md): the server listens on loopback only, and any local user can
still connect to it, so nothing on the wire is ever unpickled by the store: the protocol is
length-prefixed byte strings, and the values are the ranks' sealed blobs (HMAC with the run's
secret, commsim.group.seal), checked by each reader before it unpickles. Request sizes are
bounded, so a stranger cannot make the launcher allocate without limit.

Wire: a request is one op byte, a u32 field count and the fields (u32 length + bytes); the
answer is a status byte (0 ok, 1 timed out), a count and fields.
"""

from __future__ import annotations

import socket
import socketserver
import struct
import threading
import time
from datetime import timedelta
from typing import Sequence

__all__ = ["StoreServer", "StoreClient", "StoreTimeout"]

MAX_FIELD = 64 << 20      # bytes in one field
MAX_FIELDS = 1 << 14      # fields in one request
MAX_MESSAGE = 256 << 20   # bytes in one request, all fields together
_U32 = struct.Struct("!I")
OK, TIMEOUT = 0, 1


class StoreTimeout(TimeoutError):
    """A wait or get on the store ended at its timeout with keys still missing."""


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionError("store connection closed")
        buf += chunk
    return bytes(buf)


def _send_msg(sock: socket.socket, head: int, fields: Sequence[bytes]) -> None:
    parts = [bytes([head]), _U32.pack(len(fields))]
    for f in fields:
        parts += [_U32.pack(len(f)), f]
    sock.sendall(b"".join(parts))


def _recv_msg(sock: socket.socket) -> tuple[int, list[bytes]]:
    head = _recv_exact(sock, 1)[0]
    (n,) = _U32.unpack(_recv_exact(sock, 4))
    if n > MAX_FIELDS:
        raise ValueError(f"store message with {n} fields")
    fields = []
    total = 0
    for _ in range(n):
        (size,) = _U32.unpack(_recv_exact(sock, 4))
        total += size
        if size > MAX_FIELD or total > MAX_MESSAGE:
            raise ValueError(f"store message over its bound ({size} bytes in a field, "
                             f"{total} in all)")
        fields.append(_recv_exact(sock, size))
    return head, fields


class _Data:
    def __init__(self) -> None:
        self.kv: dict[str, bytes] = {}
        self.cond = threading.Condition()

    def wait(self, keys: list[str], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while not all(k in self.kv for k in keys):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return True

    def serve(self, op: str, f: list[bytes]) -> tuple[int, list[bytes]]:
        if op == "S":
            with self.cond:
                self.kv[f[0].decode()] = f[1]
                self.cond.notify_all()
            return OK, []
        if op == "A":
            with self.cond:
                key = f[0].decode()
                n = int(self.kv.get(key, b"0")) + int(f[1])
                self.kv[key] = str(n).encode()
                self.cond.notify_all()
            return OK, [str(n).encode()]
        if op == "C":
            with self.cond:
                return OK, [b"1" if all(k.decode() in self.kv for k in f) else b"0"]
        if op == "D":
            with self.cond:
                return OK, [b"1" if self.kv.pop(f[0].decode(), None) is not None else b"0"]
        if op in ("W", "G"):
            keys = [k.decode() for k in f[1:]]
            if not self.wait(keys, int(f[0]) / 1000.0):
                return TIMEOUT, []
            if op == "W":
                return OK, []
            with self.cond:
                return OK, [self.kv[k] for k in keys]
        raise ValueError(f"unknown store op {op!r}")


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        data: _Data = self.server.data      # type: ignore[attr-defined]
        sock = self.request
        self.server.opened(1)               # type: ignore[attr-defined]
        try:
            while True:
                head, fields = _recv_msg(sock)
                status, out = data.serve(chr(head), fields)
                _send_msg(sock, status, out)
        except (ConnectionError, OSError, ValueError, IndexError, UnicodeDecodeError):
            return      # a client that left, or one that does not speak the protocol
        finally:
            self.server.opened(-1)          # type: ignore[attr-defined]


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = False
    connections = 0                         # clients connected now

    def opened(self, n: int) -> None:
        with _count_lock:
            self.connections += n


_count_lock = threading.Lock()


class StoreServer:
    """The run's store, on 127.0.0.1 and an ephemeral port, served by daemon threads."""

    def __init__(self) -> None:
        self._srv = _Server(("127.0.0.1", 0), _Handler)
        self._srv.data = _Data()            # type: ignore[attr-defined]
        self.port: int = self._srv.server_address[1]
        self._thread = threading.Thread(target=self._srv.serve_forever, args=(0.1,),
                                        name="commsim-mpi-store", daemon=True)
        self._thread.start()

    def connections(self) -> int:
        """How many clients are connected now (a host that must outlive its clients asks)."""
        return self._srv.connections

    def close(self) -> None:
        self._srv.shutdown()
        self._srv.server_close()
        self._thread.join(5)


class StoreClient:
    """A rank's connection to the run's store (the TCPStore calls ProcessWorld makes)."""

    def __init__(self, host: str, port: int, timeout: float, connect_timeout: float = 15.0) -> None:
        deadline = time.monotonic() + connect_timeout
        while True:
            try:
                self._sock = socket.create_connection((host, port), timeout=connect_timeout)
                break
            except OSError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)
        self._sock.settimeout(None)
        self._lock = threading.Lock()
        self._timeout = float(timeout)

    def _call(self, op: str, fields: Sequence[bytes]) -> tuple[int, list[bytes]]:
        with self._lock:
            _send_msg(self._sock, ord(op), fields)
            return _recv_msg(self._sock)

    def set_timeout(self, timeout: timedelta) -> None:
        self._timeout = timeout.total_seconds()

    def set(self, key: str, value: bytes | str) -> None:
        self._call("S", [key.encode(), value.encode() if isinstance(value, str) else bytes(value)])

    def add(self, key: str, amount: int) -> int:
        return int(self._call("A", [key.encode(), str(int(amount)).encode()])[1][0])

    def check(self, keys: list[str]) -> bool:
        return self._call("C", [k.encode() for k in keys])[1][0] == b"1"

    def delete_key(self, key: str) -> bool:
        return self._call("D", [key.encode()])[1][0] == b"1"

    def _waiting(self, op: str, keys: list[str], timeout: float) -> list[bytes]:
        ms = str(max(int(timeout * 1000), 0)).encode()
        status, out = self._call(op, [ms] + [k.encode() for k in keys])
        if status == TIMEOUT:
            raise StoreTimeout(f"store: keys {keys[:4]} not set within {timeout:g} s")
        return out

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._waiting("W", keys, self._timeout if timeout is None else timeout.total_seconds())

    def get(self, key: str) -> bytes:
        return self._waiting("G", [key], self._timeout)[0]

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self._waiting("G", list(keys), self._timeout)

    def close(self) -> None:
        self._sock.close()
