"""The key-value store of a hosted MPI run in procs mode: a server the exec launcher hosts on
127.0.0.1 only, and the ranks' client.

The client answers the calls `commsim.group.torch_dist.ProcessWorld` makes of torch's
TCPStore (set, get, multi_get, check, wait, add, delete_key, set_timeout), so the ranks of a
run launched by `--launcher mpirun` use commsim's sealed round protocol without importing
torch (an mpi4py program need not load it).

Trust (docs/processes.md): the server listens on loopback only, and any local user can still
connect to it. So:
- a connection does nothing until it proves it holds the run's secret: the server sends a
  fresh nonce, the client answers HMAC-SHA256(key, nonce) with a key derived from the secret
  (which never travels), and a connection that answers wrong or not within HANDSHAKE_S is
  closed before any request is read. Every request is served only on a connection that
  passed, so a stranger can neither write a value a rank reads (a forged status would erase
  where a rank was stuck) nor read one; a TCP connection on loopback cannot be taken over by
  another process once established, so one proof per connection covers its requests;
- nothing on the wire is ever unpickled by the store: the protocol is length-prefixed byte
  strings, and the values are the ranks' sealed blobs (HMAC with the run's secret,
  commsim.group.seal), checked again by each reader before it unpickles;
- what the store holds is bounded per request (MAX_FIELD, MAX_MESSAGE) and in all
  (MAX_STORED: a set past it is refused with StoreFull), and so are its server threads
  (MAX_CONNECTIONS clients, of which at most MAX_UNPROVEN still in the handshake).

Wire: after the handshake, a request is one op byte, a u32 field count and the fields (u32
length + bytes); the answer is a status byte (0 ok, 1 timed out, 2 full), a count and fields.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import socketserver
import struct
import threading
import time
from datetime import timedelta
from typing import Sequence

__all__ = ["StoreServer", "StoreClient", "StoreTimeout", "StoreFull", "StoreRefused"]

MAX_FIELD = 64 << 20      # bytes in one field
MAX_FIELDS = 1 << 14      # fields in one request
MAX_MESSAGE = 256 << 20   # bytes in one request, all fields together
MAX_STORED = 1 << 30      # bytes of keys and values the store holds, all together
MAX_CONNECTIONS = 4096    # clients connected at once (one server thread each)
MAX_UNPROVEN = 64         # of them, still in the handshake
HANDSHAKE_S = 5.0         # seconds a new connection has to prove it holds the secret
NONCE = 32
_U32 = struct.Struct("!I")
OK, TIMEOUT, FULL = 0, 1, 2
PROVEN, REFUSED = b"\x00", b"\x01"


class StoreTimeout(TimeoutError):
    """A wait or get on the store ended at its timeout with keys still missing."""


class StoreFull(MemoryError):
    """A set refused because the store would hold more than MAX_STORED bytes in all."""


class StoreRefused(ConnectionError):
    """The server did not accept this client's proof of the run's secret."""


def auth_key(secret: bytes) -> bytes:
    """The key a connection proves itself with: derived, so the seal's key never is used
    for anything else."""
    return hmac.new(bytes(secret), b"commsim kvstore connection", hashlib.sha256).digest()


def _proof(key: bytes, nonce: bytes) -> bytes:
    return hmac.new(key, nonce, hashlib.sha256).digest()


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
    def __init__(self, bound: int) -> None:
        self.kv: dict[str, bytes] = {}
        self.cond = threading.Condition()
        self.bound = bound
        self.held = 0          # bytes of keys and values in kv

    def wait(self, keys: list[str], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while not all(k in self.kv for k in keys):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return True

    def _put(self, key: str, value: bytes) -> tuple[int, list[bytes]] | None:
        """Store `value` under `key` (caller holds cond); FULL with the reason when the store
        would hold more than its bound."""
        old = self.kv.get(key)
        held = self.held + len(value) - (len(old) if old is not None else -len(key))
        if held > self.bound:
            return FULL, [f"store full: setting {key[:80]!r} ({len(value)} bytes) would make it "
                          f"hold {held} bytes, over its bound of {self.bound}".encode()]
        self.kv[key] = value
        self.held = held
        self.cond.notify_all()
        return None

    def serve(self, op: str, f: list[bytes]) -> tuple[int, list[bytes]]:
        if op == "S":
            with self.cond:
                return self._put(f[0].decode(), f[1]) or (OK, [])
        if op == "A":
            with self.cond:
                key = f[0].decode()
                n = int(self.kv.get(key, b"0")) + int(f[1])
                return self._put(key, str(n).encode()) or (OK, [str(n).encode()])
        if op == "C":
            with self.cond:
                return OK, [b"1" if all(k.decode() in self.kv for k in f) else b"0"]
        if op == "D":
            with self.cond:
                key = f[0].decode()
                old = self.kv.pop(key, None)
                if old is not None:
                    self.held -= len(key) + len(old)
                return OK, [b"1" if old is not None else b"0"]
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
        srv: _Server = self.server          # type: ignore[assignment]
        sock = self.request
        try:
            if not srv.prove(sock):
                return
            while True:
                head, fields = _recv_msg(sock)
                status, out = srv.data.serve(chr(head), fields)
                _send_msg(sock, status, out)
        except (ConnectionError, OSError, ValueError, IndexError, UnicodeDecodeError):
            return      # a client that left, or one that does not speak the protocol
        finally:
            srv.left()


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = False
    request_queue_size = 128

    def __init__(self, key: bytes, bound: int) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.key = key
        self.data = _Data(bound)
        self.lock = threading.Lock()
        self.connections = 0                # clients with a thread now
        self.unproven = 0                   # of them, still in the handshake

    def process_request(self, request: socket.socket, client_address: object) -> None:
        # Over either bound the connection is closed at once, before a thread is started.
        with self.lock:
            if self.connections >= MAX_CONNECTIONS or self.unproven >= MAX_UNPROVEN:
                self.shutdown_request(request)
                return
            self.connections += 1
            self.unproven += 1
        super().process_request(request, client_address)

    def prove(self, sock: socket.socket) -> bool:
        """The handshake: True once the client has shown it holds the run's secret."""
        try:
            sock.settimeout(HANDSHAKE_S)
            nonce = secrets.token_bytes(NONCE)
            sock.sendall(nonce)
            ok = hmac.compare_digest(_recv_exact(sock, 32), _proof(self.key, nonce))
            sock.sendall(PROVEN if ok else REFUSED)
            sock.settimeout(None)
            return ok
        finally:
            with self.lock:
                self.unproven -= 1

    def left(self) -> None:
        with self.lock:
            self.connections -= 1


class StoreServer:
    """The run's store, on 127.0.0.1 and an ephemeral port, served by daemon threads to the
    clients that hold `secret`."""

    def __init__(self, secret: bytes, bound: int = MAX_STORED) -> None:
        self._srv = _Server(auth_key(secret), bound)
        self.port: int = self._srv.server_address[1]
        self._thread = threading.Thread(target=self._srv.serve_forever, args=(0.1,),
                                        name="commsim-mpi-store", daemon=True)
        self._thread.start()

    def connections(self) -> int:
        """How many clients are connected now (a host that must outlive its clients asks)."""
        return self._srv.connections

    def held(self) -> int:
        """Bytes of keys and values the store holds now."""
        return self._srv.data.held

    def close(self) -> None:
        self._srv.shutdown()
        self._srv.server_close()
        self._thread.join(5)


class StoreClient:
    """A rank's connection to the run's store (the TCPStore calls ProcessWorld makes)."""

    def __init__(self, host: str, port: int, timeout: float, *, secret: bytes,
                 connect_timeout: float = 15.0) -> None:
        key = auth_key(secret)
        deadline = time.monotonic() + connect_timeout
        while True:
            try:
                self._sock = self._connect(host, port, key, connect_timeout)
                break
            except StoreRefused:
                raise
            except OSError:
                # not listening yet, or over its bound of connections for now
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)
        self._lock = threading.Lock()
        self._timeout = float(timeout)

    @staticmethod
    def _connect(host: str, port: int, key: bytes, timeout: float) -> socket.socket:
        sock = socket.create_connection((host, port), timeout=timeout)
        try:
            nonce = _recv_exact(sock, NONCE)
            sock.sendall(_proof(key, nonce))
            if _recv_exact(sock, 1) != PROVEN:
                raise StoreRefused(f"the store at {host}:{port} refused this client: it does "
                                   f"not hold the run's secret")
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)
        return sock

    def _call(self, op: str, fields: Sequence[bytes]) -> tuple[int, list[bytes]]:
        with self._lock:
            _send_msg(self._sock, ord(op), fields)
            status, out = _recv_msg(self._sock)
        if status == FULL:
            raise StoreFull(out[0].decode(errors="replace") if out else "store full")
        return status, out

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
