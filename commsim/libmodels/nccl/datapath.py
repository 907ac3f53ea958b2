"""NCCL's collectives on the connections set-up made: every byte a peer contributes moves
through the connection NCCL chose for the pair, so what the machine does to those bytes is
what the collective gets.

Per step (at most CAP bytes of the message) each rank writes its part into every peer's
receive buffer through its own mapping of it (P2P: a kernel on the rank's device writing
through the mapped peer pointer, the path on which a machine loses or garbles peer writes;
SHM: the shared segment), then a flag word with the step number, as NCCL's protocols signal a peer
(src/device/prims_simple.h: data stores, then the tail flag). NET bytes travel over the
bootstrap's sockets (the group). Each rank waits for every peer's flag in its own buffer,
reads the data, and a barrier ends the step (the head flag that lets a sender reuse the
buffer). The reduction is the caller's (`combine`: every rank's bytes in rank order).

So a pair whose peer writes never land leaves its receiver waiting for a flag that never
comes: the runtime diagnoses the hang, naming NCCL and the pair, as NCCL's and torch's
watchdogs would see a collective that never completes; writes that land garbled
(with the flag intact) give a wrong result, which an oracle compares against a reference.
The algorithm is one-shot (every rank reads every peer's input), not NCCL's ring or tree:
which pairs carry bytes is the same for an all-reduce, the order of the additions is not
(UNCONFIRMED how much the low bits of a float sum differ).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from commsim.libmodels.nccl.comm import NcclComm
from commsim.libmodels.nccl.errors import cuda_failure
from commsim.libmodels.nccl.transports import CAP, FLAG
from commsim.runtime.scheduler import wait_until


def _on_device(comm: NcclComm, kernel: Callable[..., Any], *args: Any) -> Any:
    """`kernel(ctx, *args)` launched on this rank's device (the Driver protocol's
    launch_kernel: its KernelContext reads and writes device memory, a peer's mapping
    included, as the machine lets it); its value. A fault is NCCL's unhandled CUDA error."""
    box: list[Any] = []
    out = comm.calls.driver.launch_kernel(lambda ctx, *a: box.append(kernel(ctx, *a)), *args)
    code = out[0] if isinstance(out, tuple) else out
    if int(code) != 0:
        raise cuda_failure(comm.log, "ncclKernel", code)
    return box[0]


def _flag_k(ctx: Any, ptr: int) -> int:
    return int(ctx.array(ptr, np.uint32, 1)[0])


def _write_k(ctx: Any, ptr: int, chunk: np.ndarray, word: np.ndarray) -> None:
    if chunk.size:
        ctx.array(ptr + FLAG, np.uint8, chunk.size)[...] = chunk
    ctx.array(ptr, np.uint8, 4)[...] = word


def _read_k(ctx: Any, ptr: int, n: int) -> np.ndarray:
    return np.array(ctx.array(ptr + FLAG, np.uint8, n))


def _flag(comm: NcclComm, conn: Any) -> int:
    if conn.kind == "P2P":
        return _on_device(comm, _flag_k, conn.recv)
    return int(np.asarray(conn.recv[:4]).view(np.uint32)[0])


def _write(comm: NcclComm, conn: Any, chunk: np.ndarray, step: int) -> None:
    word = np.array([step], np.uint32).view(np.uint8)
    if conn.kind == "P2P":
        _on_device(comm, _write_k, conn.send, chunk, word)
    else:
        conn.send[FLAG:FLAG + chunk.size] = chunk
        conn.send[:4] = word


def _read(comm: NcclComm, conn: Any, n: int) -> np.ndarray:
    if conn.kind == "P2P":
        return _on_device(comm, _read_k, conn.recv, n) if n else np.empty(0, np.uint8)
    return np.array(conn.recv[FLAG:FLAG + n])


def exchange(comm: NcclComm, data: np.ndarray, api: str) -> list[np.ndarray]:
    """Every rank's bytes (the same size on every rank), in rank order, each as it arrived
    here over its pair's connection."""
    comm.connect()          # at the first collective under runtime connect (comm.py)
    data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    parts: list[list[np.ndarray]] = [[] for _ in range(comm.nranks)]
    net = sorted(p for p, c in comm.conns.items() if c.kind == "NET")
    direct = sorted(p for p, c in comm.conns.items() if c.kind != "NET")
    any_net = any(t.kind == "NET" for t in comm.decision.transports)
    for lo in range(0, max(data.size, 1), CAP):
        chunk = data[lo:lo + CAP]
        comm.step += 1
        step = comm.step
        for p in direct:
            _write(comm, comm.conns[p], chunk, step)
        # NET bytes over the bootstrap's sockets; a communicator where no pair uses NET
        # (every rank knows the search's transports) makes no such round.
        got = comm.group.all_gather_object(chunk.tobytes() if net else None,
                                           tag=f"{api}: NET step {step}") if any_net else ()
        parts[comm.rank].append(chunk)
        for p in net:
            parts[p].append(np.frombuffer(got[p], np.uint8))
        for p in direct:
            conn = comm.conns[p]
            wait_until(lambda conn=conn: _flag(comm, conn) == step,
                       f"NCCL {api} on comm rank {comm.rank}/{comm.nranks}: waiting for rank "
                       f"{p}'s data over {conn.via} (step {step}); the collective does not "
                       f"complete (NCCL watchdog: timeout)")
            parts[p].append(_read(comm, conn, chunk.size))
        comm.group.barrier(tag=f"{api}: step {step} consumed")
    return [np.concatenate(ps) if ps else np.empty(0, np.uint8) for ps in parts]


def all_reduce(comm: NcclComm, data: np.ndarray, combine: Callable[[list[np.ndarray]], np.ndarray],
               api: str = "ncclAllReduce") -> np.ndarray:
    """The reduction of every rank's bytes as they arrived here (`combine` over rank order)."""
    return combine(exchange(comm, data, api))
