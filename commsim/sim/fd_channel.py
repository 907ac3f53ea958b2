"""The FdChannel of simulated processes: AF_UNIX + SCM_RIGHTS as the simulator models it.

An fd is a per-process kernel object; it travels only over a Unix-domain socket, whose path
lives in one host's filesystem, so it reaches only processes of the same host (reference §2.5,
row V9). Across hosts the peer's socket path does not exist: the sender sees the connect fail
(FlashInfer's fd_exchange reports "[fd_exchange] timed out connecting to <path>"). Fds in
flight wait in the fabric's mailbox (in process mode: the run's store).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..driver import FdTransportError
from ..runtime.scheduler import wait_until

if TYPE_CHECKING:
    from .driver import SimDriver


def socket_path(pid: int) -> str:
    return f"/tmp/symm_mem-{pid}"      # PyTorch's IpcChannel names its socket so (§2.5)


class SimFdChannel:
    def __init__(self, driver: "SimDriver"):
        self.driver = driver

    def send(self, fd: int, dst_pid: int) -> None:
        """sendmsg(SCM_RIGHTS) to the socket of process `dst_pid` (PyTorch IpcChannel, §2.5).
        The OS resolves the socket path on the sender's host: a peer elsewhere is unreachable."""
        src = self.driver
        target = src.fd_target(fd)
        if target is None:
            raise FdTransportError(9, f"EBADF: fd {fd} is not open in pid {src.proc.pid}")
        dst = src.fabric.processes.get(dst_pid)
        if dst is None or not dst.alive or \
                src.cluster.host(dst.host).shm_namespace != src.shm_namespace():
            raise FdTransportError(
                110, f"[fd_exchange] timed out connecting to {socket_path(dst_pid)}: no such socket "
                     f"on host {src.gethostname()}; POSIX fds reach only processes of one host (row V9)")
        src.fabric.fd_mailbox.setdefault((dst_pid, src.proc.pid), []).append(target)

    def receive(self, src_pid: int, timeout: float | None = None) -> int:
        """recvmsg(SCM_RIGHTS) of the next fd `src_pid` sent; blocks (via the runtime) until
        then, or raises GroupTimeout after `timeout` virtual seconds (FlashInfer's
        fd_exchange: 30 s)."""
        dst = self.driver
        box = dst.fabric.fd_mailbox
        key = (dst.proc.pid, src_pid)
        wait_until(lambda: bool(box.get(key)), f"recvmsg on {socket_path(dst.proc.pid)} from pid {src_pid}",
                   timeout)
        return dst.receive_fd(box[key].pop(0))


def pass_fd(src: "SimDriver", fd: int, dst: "SimDriver") -> int:
    """Send `fd` from `src` to `dst` at once, both drivers in hand (the conformance rig);
    returns the fd number in the receiver."""
    target = src.fd_target(fd)
    if target is None:
        raise FdTransportError(9, f"EBADF: fd {fd} is not open in pid {src.proc.pid}")
    if src.shm_namespace() != dst.shm_namespace():
        raise FdTransportError(
            110, f"[fd_exchange] timed out connecting to {socket_path(dst.proc.pid)}: pid "
                 f"{dst.proc.pid} is on host {dst.gethostname()}, pid {src.proc.pid} on "
                 f"{src.gethostname()}; POSIX fds reach only processes of one host (reference "
                 f"§2.5, row V9)")
    return dst.receive_fd(target)
