"""The functional P2P probe serving stacks run before trusting `cuDeviceCanAccessPeer`
(row P4 of docs/fidelity-rules.md): vLLM's `gpu_p2p_access_check` starts two helper
processes, one exports a buffer over legacy IPC, the other opens it, writes a pattern through
the peer mapping, and the owner checks the bytes; the answer is cached per machine.

Here the helper processes are simulated processes of the same fabric, so their calls do not
count against the rank processes' injected faults (vLLM's run in child processes too), and
the verdict is cached on the fabric per GPU pair. It finds the two classes of P2P that is
reported but not real: an open that is refused (rows P1, P2) and writes that do not arrive
intact (row P3).

The round trip reads, of the machine, only: the rules switched off, the host's container
capabilities (container_per_process: row W6), the link from the probing GPU to its peer (its
p2p, ipc_refused and peer_writes: rows L10, P1-P3) and room on the peer GPU for the buffer;
the helper processes inject no faults and start with nothing mapped, so no other rule of
their calls can answer differently (tests/unit/test_p2p_probe_cache.py changes every other
field of the host, its GPUs and links and finds the same outcome). So its outcome is kept by
that value, and a later pair with an equal value, in any fabric, takes it from there instead
of re-running the round trip: a sweep spent a fifth of its time re-probing equal pairs. The
message names the pair and is written for each. A hit advances the fabric's pid and
allocation counters and its touched-bytes count as the real round trip does, so everything
after it (pids, addresses, handles, reports) is the same as with the probe run.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable

import numpy as np

from commsim.driver import PROBE_WRITES_LOST
from commsim.topology.model import GpuRef

# (fabric, gpu) -> the driver of a new process on that GPU's host, current device `gpu`.
Spawn = Callable[[Any, GpuRef], Any]

PROBE_BYTES = 4096
_PATTERN = (np.arange(PROBE_BYTES, dtype=np.uint32) * 2654435761 % 251).astype(np.uint8)


# (switched-off rules, touched bytes counted?, container, link) -> _Verdict; least recently
# used go first past VERDICTS_KEPT (a sweep meets a few dozen values).
_verdicts: "OrderedDict[tuple, _Verdict]" = OrderedDict()
VERDICTS_KEPT = 4096

# A round trip's outcome, written for the pair it is about: "" is sound.
_NO_ROOM = "the probe could not allocate on"
_MESSAGES = {
    "sound": "",
    "no_room": _NO_ROOM + " {peer} ({detail})",
    "get": "cudaIpcGetMemHandle on {peer} returned {detail}",
    "open": "cudaIpcOpenMemHandle of {peer}'s buffer on {me} returned {detail} (rows L10, P1, P2)",
    "differ": ("{me} wrote " + str(PROBE_BYTES) + " B into {peer}'s buffer through the IPC mapping "
               "and {detail} B differ, " + PROBE_WRITES_LOST),
}


class _Verdict:
    """A probe's outcome (a key of _MESSAGES and its detail) and what running it did to the
    fabric's counters."""

    __slots__ = ("outcome", "pids", "aids", "touched")

    def __init__(self, outcome: tuple[str, str], pids: int, aids: int, touched: int):
        self.outcome, self.pids, self.aids, self.touched = outcome, pids, aids, touched


def _message(outcome: tuple[str, str], me: GpuRef, peer: GpuRef) -> str:
    kind, detail = outcome
    return _MESSAGES[kind].format(me=me, peer=peer, detail=detail)


def probe_pair(fabric, me: GpuRef, peer: GpuRef, spawn: Spawn) -> str:
    """"" when a process on `me` can open `peer`'s IPC handle and write to it intact; else
    what went wrong, naming the call and its code. Cached on the fabric, and by the value
    the round trip reads (see the module doc). `spawn(fabric, gpu)` starts a helper process
    on `gpu` and gives its driver (commsim.sim.spawn_driver; passed in because the driver
    is what calls this)."""
    cache = fabric.__dict__.setdefault("_p2p_probe_cache", {})
    key = (me, peer)
    if key in cache:
        return cache[key]
    host = fabric.cluster.host(me.host)
    # Whether the fabric's memory counts touched bytes is part of the key: a verdict moves
    # that count as its round trip did, and one from a fabric that did not count has none.
    counting = hasattr(fabric.memory, "touched")
    skey = (fabric.disabled_rules, counting, host.container, host.links[me.index][peer.index])
    v = _verdicts.get(skey)
    # The one piece of run state the round trip can meet: a peer GPU too full for the probe's
    # buffer (cudaMalloc's own test, before any fd reaping, which only frees). Then it runs.
    if v is not None and (fabric.device_bytes_used(peer) + PROBE_BYTES
                          <= fabric.cluster.gpu(peer).memory_bytes):
        _verdicts.move_to_end(skey)
        fabric._next_pid += v.pids
        fabric._next_aid += v.aids
        if counting:
            fabric.memory.touched += v.touched
        cache[key] = text = _message(v.outcome, me, peer)
        return text
    touched = lambda: getattr(fabric.memory, "touched", 0)
    pid0, aid0, touched0, flags0 = fabric._next_pid, fabric._next_aid, touched(), len(fabric.flags)
    outcome = _run(fabric, me, peer, spawn)
    if len(fabric.flags) == flags0 and outcome[0] != "no_room":
        # Not kept: a probe that found no room (the run's state), or raised a flag (the
        # fabric's record of it must come from a real run).
        _verdicts[skey] = _Verdict(outcome, fabric._next_pid - pid0, fabric._next_aid - aid0,
                                   touched() - touched0)
        while len(_verdicts) > VERDICTS_KEPT:
            _verdicts.popitem(last=False)
    cache[key] = text = _message(outcome, me, peer)
    return text


def _run(fabric, me: GpuRef, peer: GpuRef, spawn: Spawn) -> tuple[str, str]:
    """The round trip itself, in two helper processes; its outcome (see _MESSAGES)."""
    owner = spawn(fabric, peer)
    user = spawn(fabric, me)
    try:
        err, ptr = owner.cudaMalloc(PROBE_BYTES)
        if int(err):
            return "no_room", err.name
        owner.cudaMemset(ptr, 0, PROBE_BYTES)
        err, handle = owner.cudaIpcGetMemHandle(ptr)
        if int(err):
            return "get", err.name
        err, q = user.cudaIpcOpenMemHandle(handle, 1)
        if int(err):
            return "open", err.name
        user.memcpy_htod(q, _PATTERN)
        err, got = owner.memcpy_dtoh(ptr, PROBE_BYTES)
        user.cudaIpcCloseMemHandle(q)
        owner.cudaFree(ptr)
        if int(err) or not np.array_equal(got, _PATTERN):
            wrong = int(np.count_nonzero(got != _PATTERN)) if got is not None else PROBE_BYTES
            return "differ", str(wrong)
        return "sound", ""
    finally:
        fabric.exit_process(user.proc.pid)
        fabric.exit_process(owner.proc.pid)
