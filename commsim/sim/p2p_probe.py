"""The functional P2P probe serving stacks run before trusting `cuDeviceCanAccessPeer`
(row P4 of docs/fidelity-rules.md): vLLM's `gpu_p2p_access_check` starts two helper
processes, one exports a buffer over legacy IPC, the other opens it, writes a pattern through
the peer mapping, and the owner checks the bytes; the answer is cached per machine.

Here the helper processes are simulated processes of the same fabric, so their calls do not
count against the rank processes' injected faults (vLLM's run in child processes too), and
the verdict is cached on the fabric per GPU pair. It finds the two classes of P2P that is
reported but not real: an open that is refused (rows P1, P2) and writes that do not arrive
intact (row P3).

The verdict is a function of the host's ground truth (the pair's GPUs and links, the host's
container and driver: parts of an immutable Host), the rules switched off and the pair, given the
peer GPU has room for the probe's buffer: nothing else of a run's state reaches helper
processes that inject no faults. So it is also kept by that value, and a later fabric with
an equal host and pair takes it from there instead of re-running the round trip: a sweep spent a fifth of its time
re-probing the same pairs of the same machine shapes. A hit advances the fabric's pid and allocation counters and
its touched-bytes count as the real round trip does, so everything after it (pids,
addresses, handles, reports) is the same as with the probe run.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections import OrderedDict
from typing import Any

import numpy as np

from ..topology.model import GpuRef

PROBE_BYTES = 4096
_NO_ROOM = "the probe could not allocate on"
_PATTERN = (np.arange(PROBE_BYTES, dtype=np.uint32) * 2654435761 % 251).astype(np.uint8)


# Verdict tables, one per host without its GPUs and links (its name, container, driver, GPU
# count, ...), each mapping (disabled rules, GPU index, peer index, the two GPUs, the two
# links between them) -> _Verdict: a fault that changes one GPU or link (the usual machine
# fault, drawn anew per scenario) keeps every other pair's verdict. Found by the Host object's identity first (a preset's
# hosts are built once per shape), then by value (hashing a host's GPUs costs microseconds).
_by_host_id: dict[int, tuple[weakref.ref, dict]] = {}
_by_host_value: "OrderedDict[tuple, dict]" = OrderedDict()
HOSTS_KEPT = 1024               # by value; least recently used go first


class _Verdict:
    """A probe's answer and what running it did to the fabric's counters."""

    __slots__ = ("text", "pids", "aids", "touched")

    def __init__(self, text: str, pids: int, aids: int, touched: int):
        self.text, self.pids, self.aids, self.touched = text, pids, aids, touched


def _verdicts(host: Any) -> dict:
    k = id(host)
    ent = _by_host_id.get(k)
    if ent is not None and ent[0]() is host:
        return ent[1]
    # Every field but the links and GPUs (the pair's own are in the pair's key; a fault
    # usually changes one GPU), so a field added to Host is part of the key by itself.
    value = tuple(getattr(host, f.name) for f in dataclasses.fields(host)
                  if f.name not in ("links", "gpus")) + (len(host.gpus),)
    table = _by_host_value.get(value)
    if table is None:
        table = _by_host_value[value] = {}
        while len(_by_host_value) > HOSTS_KEPT:
            _by_host_value.popitem(last=False)
    else:
        _by_host_value.move_to_end(value)

    def gone(ref: weakref.ref, k: int = k) -> None:
        if _by_host_id.get(k, (None,))[0] is ref:
            del _by_host_id[k]
    _by_host_id[k] = (weakref.ref(host, gone), table)
    return table


def probe_pair(fabric, me: GpuRef, peer: GpuRef) -> str:
    """"" when a process on `me` can open `peer`'s IPC handle and write to it intact; else
    what went wrong, naming the call and its code. Cached on the fabric, and per host
    value (see the module doc)."""
    cache = fabric.__dict__.setdefault("_p2p_probe_cache", {})
    key = (me, peer)
    if key in cache:
        return cache[key]
    host = fabric.cluster.host(me.host)
    shared = _verdicts(host)
    i, j = me.index, peer.index
    # Whether the fabric's memory counts touched bytes is part of the key: a verdict moves
    # that count as its round trip did, and one from a fabric that did not count has none.
    counting = hasattr(fabric.memory, "touched")
    skey = (fabric.disabled_rules, counting, i, j, host.gpus[i], host.gpus[j], host.links[i][j],
            host.links[j][i])
    v = shared.get(skey)
    # The one piece of run state the round trip can meet: a peer GPU too full for the probe's
    # buffer (cudaMalloc's own test, before any fd reaping, which only frees). Then it runs.
    if v is not None and (fabric.device_bytes_used(peer) + PROBE_BYTES
                          <= fabric.cluster.gpu(peer).memory_bytes):
        fabric._next_pid += v.pids
        fabric._next_aid += v.aids
        if counting:
            fabric.memory.touched += v.touched
        cache[key] = v.text
        return v.text
    touched = lambda: getattr(fabric.memory, "touched", 0)
    pid0, aid0, touched0, flags0 = fabric._next_pid, fabric._next_aid, touched(), len(fabric.flags)
    cache[key] = text = _run(fabric, me, peer)
    if len(fabric.flags) == flags0 and not text.startswith(_NO_ROOM):
        # Not kept: a probe that found no room (the run's state), or raised a flag (the
        # fabric's record of it must come from a real run).
        shared[skey] = _Verdict(text, fabric._next_pid - pid0, fabric._next_aid - aid0,
                                touched() - touched0)
    return text


def _run(fabric, me: GpuRef, peer: GpuRef) -> str:
    from . import spawn_driver

    owner = spawn_driver(fabric, peer)
    user = spawn_driver(fabric, me)
    try:
        err, ptr = owner.cudaMalloc(PROBE_BYTES)
        if int(err):
            return f"{_NO_ROOM} {peer} ({err.name})"
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
