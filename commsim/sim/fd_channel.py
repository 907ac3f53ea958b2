"""The FdChannel of simulated processes: AF_UNIX + SCM_RIGHTS as the simulator models it.

An fd is a per-process kernel object; it travels only over a Unix-domain socket, whose path
lives in one host's filesystem, so it reaches only processes of the same host (row
V9) and, with a container per process, only its own container (row W6: the socket path
is in the container's private /tmp unless a volume shares it). Across hosts the peer's socket path does not exist: the sender sees the connect fail
(FlashInfer's fd_exchange reports "[fd_exchange] timed out connecting to <path>"). Fds in
flight wait in the fabric's mailbox (in process mode: the run's store).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from commsim.driver import FdTransportError
from commsim.runtime.scheduler import wait_until

if TYPE_CHECKING:
    from commsim.sim.driver import SimDriver


def socket_path(pid: int) -> str:
    return f"/tmp/symm_mem-{pid}"      # PyTorch's IpcChannel names its socket so


def _closed_if_exited(d: "SimDriver") -> None:
    """A process that has exited has no fds and no socket left: whatever it would send,
    receive or pull fails as a call on a closed descriptor does (EBADF), never with an
    exception of the simulator's own."""
    if not d.proc.alive:
        raise FdTransportError(9, f"EBADF: pid {d.proc.pid} has exited: its fds and its socket "
                                  f"are closed")


class SimFdChannel:
    def __init__(self, driver: "SimDriver"):
        self.driver = driver

    def send(self, fd: int, dst_pid: int) -> None:
        """sendmsg(SCM_RIGHTS) to the socket of process `dst_pid` (PyTorch IpcChannel).
        The OS resolves the socket path on the sender's host: a peer elsewhere is unreachable."""
        src = self.driver
        _closed_if_exited(src)
        target = src.fd_target(fd)
        if target is None:
            raise FdTransportError(9, f"EBADF: fd {fd} is not open in pid {src.proc.pid}")
        dst = src.fabric.processes.get(dst_pid)
        if dst is None or not dst.alive or \
                src.cluster.host(dst.host).process_namespace(dst_pid) != src.shm_namespace():
            raise FdTransportError(
                110, f"[fd_exchange] timed out connecting to {socket_path(dst_pid)}: no such socket "
                     f"on host {src.gethostname()}; POSIX fds reach only processes of one host (row V9)"
                     + (f" and container: pid {dst_pid} is in another container (row W6)"
                        if dst is not None and dst.host == src.proc.host else ""))
        src.fabric.fd_mailbox.setdefault((dst_pid, src.proc.pid), []).append(target)

    def receive(self, src_pid: int, timeout: float | None = None) -> int:
        """recvmsg(SCM_RIGHTS) of the next fd `src_pid` sent; blocks (via the runtime) until
        then, or raises GroupTimeout after `timeout` virtual seconds (FlashInfer's
        fd_exchange: 30 s)."""
        dst = self.driver
        box = dst.fabric.fd_mailbox
        key = (dst.proc.pid, src_pid)
        _closed_if_exited(dst)
        wait_until(lambda: bool(box.get(key)), f"recvmsg on {socket_path(dst.proc.pid)} from pid {src_pid}",
                   timeout)
        _closed_if_exited(dst)          # it may have exited while it waited
        return dst.receive_fd(box[key].pop(0))


    def pull(self, src_pid: int, fd: int) -> int:
        """pidfd_open(src_pid) + pidfd_getfd(fd): pull a copy of another process's fd (the fd
        exchange some symmetric-memory stacks use instead of SCM_RIGHTS). The pid must be in
        this host's pid namespace, and the caller needs ptrace access
        (PTRACE_MODE_ATTACH_REALCREDS): containers without CAP_SYS_PTRACE, or Yama
        ptrace_scope >= 1, answer EPERM (row W7; moby/moby#45622, man 2 pidfd_getfd)."""
        dst = self.driver
        _closed_if_exited(dst)
        src = dst.fabric.processes.get(src_pid)
        if src is None or not src.alive or \
                dst.cluster.host(src.host).process_namespace(src_pid) != dst.shm_namespace():
            # Another host, or another container of this host (row W6): the pid is not in this
            # pid namespace (man 2 pidfd_open: ESRCH; openucx/ucx#11978).
            raise FdTransportError(3, f"ESRCH: pidfd_open({src_pid}): no such process in the pid "
                                      f"namespace of pid {dst.proc.pid} on host {dst.gethostname()}")
        if not dst.cluster.host(dst.proc.host).container.pidfd_getfd:
            raise FdTransportError(1, f"EPERM: pidfd_getfd(pid {src_pid}, fd {fd}): Operation not "
                                      f"permitted: no ptrace access to the peer (container without "
                                      f"CAP_SYS_PTRACE or Yama ptrace_scope >= 1; row W7)")
        holder = dst.fabric.drivers.get(src_pid)
        target = holder.fd_target(fd) if holder is not None else None
        if target is None:
            raise FdTransportError(9, f"EBADF: fd {fd} is not open in pid {src_pid}")
        return dst.receive_fd(target)


def pass_fd(src: "SimDriver", fd: int, dst: "SimDriver") -> int:
    """Send `fd` from `src` to `dst` at once, both drivers in hand (the conformance rig);
    returns the fd number in the receiver."""
    target = src.fd_target(fd)
    if target is None:
        raise FdTransportError(9, f"EBADF: fd {fd} is not open in pid {src.proc.pid}")
    if not dst.proc.alive:
        # An exited process's socket is gone: connect() is refused and no fd (so no reference
        # to the memory) is ever taken on its behalf.
        raise FdTransportError(111, f"ECONNREFUSED: {socket_path(dst.proc.pid)}: pid "
                                    f"{dst.proc.pid} has exited")
    if src.shm_namespace() != dst.shm_namespace():
        where = (f"in another container of host {dst.gethostname()} (row W6)"
                 if dst.proc.host == src.proc.host else
                 f"on host {dst.gethostname()}, pid {src.proc.pid} on {src.gethostname()}")
        raise FdTransportError(
            110, f"[fd_exchange] timed out connecting to {socket_path(dst.proc.pid)}: pid "
                 f"{dst.proc.pid} is {where}; POSIX fds reach only processes of one host (row V9) "
                 f"and container (row W6)")
    return dst.receive_fd(target)
