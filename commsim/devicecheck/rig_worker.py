"""One process of the CUDA conformance rig: a CudaDriver serving calls over a pipe.

Legacy IPC refuses a handle opened in its own exporting process (row L9), so every placement
entry of a conformance case is its own OS process, as on the simulator. The rig (commsim/devicecheck/rig.py)
sends `(op, args)`; this loop answers `("ok", value)` or `("raise", exception)`. POSIX fds
really travel between these processes: each one listens on an AF_UNIX socket and receives
fds with SCM_RIGHTS.
"""

from __future__ import annotations

import os
import traceback
from typing import Any

import numpy as np


def _make_driver(factory: str, gpu: int) -> Any:
    """`module:callable` -> callable(gpu); the default builds a CudaDriver."""
    import importlib
    mod, _, attr = factory.partition(":")
    fn: Any = importlib.import_module(mod)
    for part in attr.split("."):
        fn = getattr(fn, part)
    return fn(gpu)


def _serve(conn: Any, gpu: int, sock_path: str, factory: str) -> None:
    from device import fd_channel, handles

    listener = fd_channel.listen(sock_path)
    try:
        drv = _make_driver(factory, gpu)
    except Exception as e:   # NoGpuError and the like: reported to the rig, then exit
        conn.send(("raise", e))
        return
    conn.send(("ok", os.getpid()))

    def kernel_read(ptr: int, n: int) -> tuple:
        err, tmp = drv.cudaMalloc(max(int(n), 1))
        if int(err) != 0:
            return err, None
        try:
            res = drv.launch_kernel("read_bytes", ptr, tmp, n)
            if int(res[0]) != 0:
                return res[0], None
            err, arr = drv.memcpy_dtoh(tmp, n)
            return err, (None if arr is None else arr.tobytes())
        finally:
            drv.cudaFree(tmp)

    def send_fd(path: str, fd: int) -> int:
        fd_channel.send_fd(path, fd)
        return 0

    def recv_fd() -> int:
        return fd_channel.recv_fd(listener)

    def discover() -> Any:
        from commsim.discovery import probe
        return probe(drv, 0)

    ops = {
        "kernel_read": kernel_read, "send_fd": send_fd, "recv_fd": recv_fd, "discover": discover,
        "write": lambda ptr, data: drv.memcpy_htod(ptr, np.frombuffer(bytes(data), np.uint8)),
        "read": lambda ptr, n: (lambda r: (r[0], None if r[1] is None else r[1].tobytes()))(
            drv.memcpy_dtoh(ptr, n)),
    }
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        op, args = msg
        if op == "exit":
            conn.send(("ok", None))
            return
        try:
            if op == "call":
                name, call_args = args
                value = getattr(drv, name)(*handles.rebuild(list(call_args)))
            else:
                value = ops[op](*args)
            conn.send(("ok", value))
        except Exception as e:
            e.args = e.args + (f"in rig worker pid {os.getpid()}:\n{traceback.format_exc()}",)
            try:
                conn.send(("raise", e))
            except Exception:
                conn.send(("raise", RuntimeError(repr(e))))


def main(conn: Any, gpu: int, sock_path: str,
         factory: str = "device.driver:CudaDriver.create") -> None:
    try:
        _serve(conn, gpu, sock_path, factory)
    finally:
        try:
            os.unlink(sock_path)
        except OSError:
            pass
