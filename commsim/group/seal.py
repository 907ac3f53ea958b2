"""Authenticated pickles for the run's store.

The store is a TCP server on loopback: any local user can connect to it and set keys. A value
is unpickled only after its HMAC-SHA256, keyed by a per-run secret that never goes through the
store (the launcher hands it to its ranks in their start-up arguments; under torchrun it is a
0600 file of the run's private directory), checks out for that exact key. A forged or moved
value is refused with ForgedValue, never executed.
"""

from __future__ import annotations

import hashlib
import hmac
import pickle
import secrets
from typing import Any

MAC_BYTES = 32


class ForgedValue(Exception):
    """A store value that does not carry this run's authentication: written by someone else."""


def new_secret() -> bytes:
    return secrets.token_bytes(32)


class Seal:
    """pickle + HMAC bound to the store key the value is written under."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("a run secret has at least 16 bytes")
        self._secret = bytes(secret)

    def _mac(self, key: str, body: bytes) -> bytes:
        return hmac.new(self._secret, key.encode() + b"\x00" + body, hashlib.sha256).digest()

    def dumps(self, key: str, obj: Any) -> bytes:
        body = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
        return self._mac(key, body) + body

    def loads(self, key: str, blob: bytes) -> Any:
        """The object sealed under `key`; ForgedValue when the blob was not sealed by this run
        for this key (nothing of it is unpickled then)."""
        mac, body = blob[:MAC_BYTES], blob[MAC_BYTES:]
        if len(mac) != MAC_BYTES or not hmac.compare_digest(mac, self._mac(key, body)):
            raise ForgedValue(f"store key {key!r}: the value is not authenticated by this run's "
                              f"secret (written by another process on this machine?); refused "
                              f"without unpickling it")
        return pickle.loads(body)
