"""The functional P2P probe serving stacks run before trusting `cuDeviceCanAccessPeer`
(row P4 of docs/fidelity-rules.md): vLLM's `gpu_p2p_access_check` starts two helper
processes, one exports a buffer over legacy IPC, the other opens it, writes a pattern through
the peer mapping, and the owner checks the bytes; the answer is cached per machine.

Here the helper processes are simulated processes of the same fabric, so their calls do not
count against the rank processes' injected faults (vLLM's run in child processes too), and
the verdict is cached on the fabric per GPU pair. It finds the two classes of P2P that is
reported but not real: an open that is refused (rows P1, P2) and writes that do not arrive
intact (row P3).
"""

from __future__ import annotations

import numpy as np

from ..topology.model import GpuRef

PROBE_BYTES = 4096
_PATTERN = (np.arange(PROBE_BYTES, dtype=np.uint32) * 2654435761 % 251).astype(np.uint8)


def probe_pair(fabric, me: GpuRef, peer: GpuRef) -> str:
    """"" when a process on `me` can open `peer`'s IPC handle and write to it intact; else
    what went wrong, naming the call and its code. Cached on the fabric."""
    cache = fabric.__dict__.setdefault("_p2p_probe_cache", {})
    key = (me, peer)
    if key not in cache:
        cache[key] = _run(fabric, me, peer)
    return cache[key]


def _run(fabric, me: GpuRef, peer: GpuRef) -> str:
    from . import spawn_driver

    owner = spawn_driver(fabric, peer)
    user = spawn_driver(fabric, me)
    try:
        err, ptr = owner.cudaMalloc(PROBE_BYTES)
        if int(err):
            return f"the probe could not allocate on {peer} ({err.name})"
        owner.cudaMemset(ptr, 0, PROBE_BYTES)
        err, handle = owner.cudaIpcGetMemHandle(ptr)
        if int(err):
            return f"cudaIpcGetMemHandle on {peer} returned {err.name}"
        err, q = user.cudaIpcOpenMemHandle(handle, 1)
        if int(err):
            return (f"cudaIpcOpenMemHandle of {peer}'s buffer on {me} returned {err.name} "
                    f"(rows L10, P1, P2)")
        user.memcpy_htod(q, _PATTERN)
        err, got = owner.memcpy_dtoh(ptr, PROBE_BYTES)
        user.cudaIpcCloseMemHandle(q)
        owner.cudaFree(ptr)
        if int(err) or not np.array_equal(got, _PATTERN):
            wrong = int(np.count_nonzero(got != _PATTERN)) if got is not None else PROBE_BYTES
            return (f"{me} wrote {PROBE_BYTES} B into {peer}'s buffer through the IPC mapping "
                    f"and {wrong} B differ, with every call returning success (row P3)")
        return ""
    finally:
        fabric.exit_process(user.proc.pid)
        fabric.exit_process(owner.proc.pid)
