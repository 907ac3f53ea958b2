"""The two POSIX-fd exchange styles the libraries implement, as named transports over a
process's fd channel (sendmsg / recvmsg with SCM_RIGHTS). Rules FX1-FX6 of
docs/lifecycle-rules.md.

Both run over the driver's `FdChannel` (send to a pid, receive from a pid).

- `pytorch_ring` (PyTorch symmetric memory's IpcChannel): all-gather around a ring. Each rank
  sends to its successor, then blocks in `recvmsg` (no timeout) for its predecessor's fd, and
  forwards it. Across hosts the successor's socket path does not exist on the sender's host:
  that rank fails at once with `Failed to send fd: No such file or directory`; every other
  rank waits forever on its predecessor, which the runtime diagnoses as a hang naming who
  waits on whom.
- `flashinfer_mesh` (FlashInfer's fd_exchange): every rank connects to every peer's socket,
  retrying for 30 s. A peer on another host never appears: every rank with such a peer fails
  after 30 s with `[fd_exchange] timed out connecting to <path>`.

Both return fds[r] = rank r's fd in this process (own fd at the own rank). On failure every
fd this call received is closed; the caller still owns (and closes) its own fd.
"""

from __future__ import annotations

from typing import Any, Sequence

from commsim.driver import FdChannel, FdTransportError
from commsim.runtime.diagnosis import HangDetected, RankFailed
from commsim.runtime.scheduler import now, sleep

ENOENT = 2
ETIMEDOUT = 110
FLASHINFER_TIMEOUT = 30.0          # flashinfer/comm/fd_exchange.py _TIMEOUT_S


def channel_of(driver: Any) -> FdChannel:
    """The process's fd channel (the driver declares it: SCM_RIGHTS over a Unix socket)."""
    return driver.fd_channel()


def _close_received(driver: Any, fds: Sequence[int | None], own: int) -> None:
    for fd in fds:
        if fd is not None and fd != own:
            driver.close_fd(fd)


class _Transport:
    """Broadcast is the same shape in both libraries: the root sends to every other rank,
    the others receive from the root; the styles differ in `_send` and `_recv_root`."""

    def _send(self, ch: FdChannel, fd: int, rank: int, dst: int, pids: Sequence[int], hosts: Sequence[str]) -> None:
        raise NotImplementedError

    def _recv_root(self, ch: FdChannel, rank: int, root: int, pids: Sequence[int]) -> int:
        raise NotImplementedError

    def broadcast(self, driver: Any, rank: int, root: int, pids: Sequence[int], hosts: Sequence[str],
                  fd: int | None) -> int:
        ch = channel_of(driver)
        if rank != root:
            return self._recv_root(ch, rank, root, pids)
        for dst in range(len(pids)):
            if dst != root:
                self._send(ch, fd, rank, dst, pids, hosts)  # type: ignore[arg-type]
        return fd  # type: ignore[return-value]


class PyTorchRing(_Transport):
    """PyTorch `IpcChannel::all_gather_fds` / `broadcast_fds` (FX1-FX3)."""

    name = "pytorch_ring"

    @staticmethod
    def socket(pid: int) -> str:
        return f"/tmp/symm_mem-{pid}"

    def _send(self, ch: FdChannel, fd: int, rank: int, dst: int, pids: Sequence[int], hosts: Sequence[str]) -> None:
        try:
            ch.send(fd, pids[dst])
        except FdTransportError as e:
            # sendmsg on the datagram socket to a path absent on this host: ENOENT at once.
            raise FdTransportError(
                ENOENT, f"Failed to send fd: No such file or directory (rank {rank} on host "
                        f"{hosts[rank]} sending to rank {dst}'s socket {self.socket(pids[dst])} on "
                        f"host {hosts[dst]}; PyTorch IpcChannel, rule FX2): {e.strerror or e}") from e

    def _recv(self, ch: FdChannel, rank: int, src: int, whose: int, pids: Sequence[int]) -> int:
        try:
            return ch.receive(pids[src])           # recvmsg: no timeout (FX3)
        except (HangDetected, RankFailed) as e:
            # recvmsg blocks on whatever happens to the peers: a peer's death (which process
            # mode notices) does not end it either, so both read as the hang it is.
            raise HangDetected(f"rank {rank} waits in recvmsg on {self.socket(pids[rank])} for rank "
                               f"{whose}'s fd from rank {src}, its predecessor in PyTorch's fd ring, "
                               f"which will never send it (rule FX3)\n{e}", e.diagnosis) from e

    def all_gather(self, driver: Any, rank: int, pids: Sequence[int], hosts: Sequence[str], fd: int) -> list[int]:
        n, ch = len(pids), channel_of(driver)
        fds: list[int | None] = [None] * n
        fds[rank] = fd
        nxt, prev = (rank + 1) % n, (rank - 1) % n
        cur = fd
        try:
            for step in range(1, n):
                self._send(ch, cur, rank, nxt, pids, hosts)
                src = (rank - step) % n
                cur = self._recv(ch, rank, prev, src, pids)
                fds[src] = cur
        except BaseException:
            _close_received(driver, fds, fd)
            raise
        return fds  # type: ignore[return-value]

    def _recv_root(self, ch: FdChannel, rank: int, root: int, pids: Sequence[int]) -> int:
        return self._recv(ch, rank, root, root, pids)


class FlashInferMesh(_Transport):
    """FlashInfer `fd_exchange.exchange_fds` / `broadcast_fd` (FX4, FX5)."""

    name = "flashinfer_mesh"

    @staticmethod
    def socket(pid: int, rank: int) -> str:
        return f"/tmp/cuda_fd_xchg_{pid}_{rank}_/fd.sock"   # a private temp dir per rank

    def _send(self, ch: FdChannel, fd: int, rank: int, dst: int, pids: Sequence[int], hosts: Sequence[str]) -> None:
        start = now()
        try:
            ch.send(fd, pids[dst])
        except FdTransportError as e:
            # _connect_with_retry: connect fails (no such path on this host) and is retried
            # every 10 ms until 30 s have passed, then raises.
            sleep(max(0.0, FLASHINFER_TIMEOUT - (now() - start)))
            raise FdTransportError(ETIMEDOUT, f"[fd_exchange] timed out connecting to "
                                              f"{self.socket(pids[dst], dst)} (rank {rank} to rank "
                                              f"{dst}; rule FX4): {e.strerror or e}") from e

    def all_gather(self, driver: Any, rank: int, pids: Sequence[int], hosts: Sequence[str], fd: int) -> list[int]:
        n, ch = len(pids), channel_of(driver)
        fds: list[int | None] = [None] * n
        fds[rank] = fd
        try:
            for dst in range(n):
                if dst != rank:
                    self._send(ch, fd, rank, dst, pids, hosts)
            for src in range(n):
                if src != rank:
                    fds[src] = ch.receive(pids[src], timeout=FLASHINFER_TIMEOUT)
        except HangDetected as e:      # the accept thread's 30 s: ranks that never sent
            _close_received(driver, fds, fd)
            missing = [r for r in range(n) if fds[r] is None]
            raise FdTransportError(ETIMEDOUT, f"[fd_exchange] did not receive file descriptors from "
                                              f"ranks: {missing} (rule FX4)") from e
        except BaseException:
            _close_received(driver, fds, fd)
            raise
        return fds  # type: ignore[return-value]

    def _recv_root(self, ch: FdChannel, rank: int, root: int, pids: Sequence[int]) -> int:
        try:
            return ch.receive(pids[root], timeout=FLASHINFER_TIMEOUT)
        except HangDetected as e:
            raise FdTransportError(ETIMEDOUT, f"[fd_exchange] rank {rank} received no fd from root "
                                              f"{root} (accept timed out after 30 s; rule FX5)") from e


# The registry: a transport is declared once, here; policies name it by `fd_transport`.
TRANSPORTS: dict[str, _Transport] = {t.name: t for t in (PyTorchRing(), FlashInferMesh())}
DEFAULT = "pytorch_ring"


def transport(name: str) -> _Transport:
    t = TRANSPORTS.get(name)
    if t is None:
        raise ValueError(f"unknown fd transport {name!r}; known: {', '.join(TRANSPORTS)}")
    return t
