"""NCCL's calls into the driver, one place: each is recorded in the communicator's trace
(name and result) and a failure becomes NCCL's error with its WARN, as CUDACHECK / CUCHECK
do (src/include/checks.h, src/include/cudawrap.h, NVIDIA/nccl v2.27.3-1)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from commsim.driver import FdTransportError
from commsim.libmodels.nccl.errors import NcclError, NcclLog, SYSTEM, cuda_failure


@dataclass
class DriverCalls:
    driver: Any
    log: NcclLog
    trace: list[tuple[str, int]] = field(default_factory=list)    # (api, result code)
    fds: Any = None     # how fds travel between processes: the driver's fd channel, or a
                        # proxy socket when ranks are OS processes (proxy.py)

    def _channel(self) -> Any:
        return self.fds if self.fds is not None else self.driver.fd_channel()

    def call(self, api: str, *args: Any) -> Any:
        """The call's result (cuda-python's `(err, value...)`), recorded, not checked."""
        out = getattr(self.driver, api)(*args)
        out = out if isinstance(out, tuple) else (out,)
        self.trace.append((api, int(out[0])))
        return out

    def check(self, api: str, *args: Any) -> Any:
        """The call's value; a failure is NCCL's ncclUnhandledCudaError with its WARN."""
        out = self.call(api, *args)
        if int(out[0]) != 0:
            raise cuda_failure(self.log, api, out[0])
        return None if len(out) == 1 else out[1] if len(out) == 2 else out[1:]

    def send_fd(self, fd: int, pid: int) -> None:
        """The proxy's reply over its Unix socket (src/misc/ipcsocket.cc ncclIpcSocketSendFd):
        a peer the socket cannot reach is ncclSystemError with the UDS WARN."""
        self.trace.append(("sendmsg(SCM_RIGHTS)", 0))
        try:
            self._channel().send(fd, pid)
        except FdTransportError as e:
            self.trace[-1] = ("sendmsg(SCM_RIGHTS)", e.errno or -1)
            warn = f"UDS: Sending data over socket nccl-socket-{pid} failed : {e.strerror or e} ({e.errno})"
            self.log.warn(warn)
            raise NcclError(SYSTEM, warn, "sendmsg") from None

    def receive_fd(self, pid: int) -> int:
        self.trace.append(("recvmsg(SCM_RIGHTS)", 0))
        try:
            return self._channel().receive(pid)
        except OSError as e:
            warn = f"UDS: Receiving data over socket failed : {e.errno}"
            self.log.warn(warn)
            raise NcclError(SYSTEM, warn, "recvmsg") from None
