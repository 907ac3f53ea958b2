"""The uppercase (buffer) methods of the hosted mpi4py.MPI.Comm: Allgather, Bcast, Allreduce,
Send, Recv, Isend, Irecv on objects exposing the buffer interface (NumPy arrays, bytearray).

mpi4py's buffer arguments are a buffer, or a list/tuple whose first item is the buffer
([array, MPI.DOUBLE], [array, count, MPI.DOUBLE]); `MPI.IN_PLACE` as Allreduce's send buffer
reduces the receive buffer in place (mpi4py tutorial, "Communication of buffer-like
objects"). The bytes cross the communicator by value like everything else; a receive buffer
of the wrong size is MPI_ERR_TRUNCATE.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from commsim.hosting.surfaces.mpi.ops import SUM, as_op
from commsim.hosting.surfaces.mpi.results import ERR_TRUNCATE, Exception, Request


class InPlace:
    """mpi4py.MPI.IN_PLACE."""

    def __repr__(self) -> str:
        return "<mpi4py.MPI.IN_PLACE>"


IN_PLACE = InPlace()


def _buffer(spec: Any) -> Any:
    if isinstance(spec, (list, tuple)):
        if not spec:
            raise TypeError("a buffer specification needs at least the buffer")
        spec = spec[0]
    return spec


def _bytes(spec: Any) -> memoryview:
    try:
        return memoryview(_buffer(spec)).cast("B")
    except TypeError:
        raise TypeError(f"expecting a buffer-like object (a NumPy array, bytearray...), got "
                        f"{type(_buffer(spec)).__name__}") from None


def _array(spec: Any) -> np.ndarray:
    buf = _buffer(spec)
    return buf if isinstance(buf, np.ndarray) else np.frombuffer(buf, dtype=np.uint8)


def _fill(dst: memoryview, data: bytes, call: str) -> None:
    if dst.readonly:
        raise TypeError(f"Comm.{call}: the receive buffer is read-only")
    if len(data) != len(dst):
        raise Exception(ERR_TRUNCATE, f"Comm.{call}: {len(data)} bytes for a receive buffer "
                                      f"of {len(dst)}")
    dst[:] = data


def Allgather(self: Any, sendbuf: Any, recvbuf: Any) -> None:
    _, got = self._all("Allgather", None, bytes(_bytes(sendbuf)))
    _fill(_bytes(recvbuf), b"".join(got), "Allgather")


def Bcast(self: Any, buf: Any, root: int = 0) -> None:
    self._root(root, "Bcast")
    h = self._handle("Comm.Bcast")
    mine = bytes(_bytes(buf)) if h.rank == root else None
    data = self._all("Bcast", f"root={root}", mine)[1][root]
    if h.rank != root:
        _fill(_bytes(buf), data, "Bcast")


def Allreduce(self: Any, sendbuf: Any, recvbuf: Any, op: Any = None) -> None:
    o = as_op(SUM if op is None else op)
    src = recvbuf if sendbuf is IN_PLACE else sendbuf
    arr = np.ascontiguousarray(_array(src)).copy()
    _, got = self._all("Allreduce", f"op={o.name}", arr)
    out = o.fold_arrays(got)
    _fill(_bytes(recvbuf), np.ascontiguousarray(out, dtype=_array(recvbuf).dtype).tobytes(),
          "Allreduce")


def Send(self: Any, buf: Any, dest: int, tag: int = 0) -> None:
    self.send(bytes(_bytes(buf)), dest, tag)


def Recv(self: Any, buf: Any, source: int = -1, tag: int = -1, status: Any = None) -> None:
    data = self.recv(None, source, tag, status)
    if data is not None:
        _fill(_bytes(buf), data, "Recv")


def Isend(self: Any, buf: Any, dest: int, tag: int = 0) -> Any:
    Send(self, buf, dest, tag)         # eager, as the lowercase send (wire/ranks.py)
    return Request(done=True)


def Irecv(self: Any, buf: Any, source: int = -1, tag: int = -1) -> Any:
    self._handle("Comm.Irecv")
    return Request(lambda status: Recv(self, buf, source, tag, status))
