"""Per-worker memoization of what is a pure function of a generated machine and its faults.

A sweep worker regenerates and judges thousands of scenarios, and many share a machine (35
preset shapes; 2,000 ids of the default mix hold 728 distinct machines, most without a
machine fault). What is kept here is a pure function of its key, and the key is a canonical
form of every input the value depends on:
- `machine((shape, versions, faults), make)`: the Cluster of preset shape `shape` with the
  plan's component versions (driver, CUDA, torch, NCCL) and its machine faults applied in
  order. A Fault is a frozen dataclass of every parameter of the fault (kind, host, GPU,
  pair, state ...), so the triple names the machine; the preset table and the fault rules
  are code, fixed in a process. One Cluster object per distinct machine, so the caches keyed
  by a cluster object (GroupFacts.of, P2P probe verdicts) hit across scenarios.
- `group_truth(cluster, gpus, order, make)`: a group's legal backends on a machine this memo
  built: a function of the machine's key, the group's GPUs and the policy order (the backend
  registry and each backend's rule are code). A machine it did not build (a scenario file's)
  has no canonical key here and is computed each time.
- `nccl_outcome(cluster, gpus, env, auto, make)`: what NCCL must do on a group
  (scenario/nccl_truth.py), a function of the machine's key, the group's GPUs, the NCCL_*
  variables and the policy's NCCL_MNNVL_ENABLE advice (`auto`), kept like a group's truth.
All are bounded (least recently used first out). `COMMSIM_SWEEP_MEMO=0` or `disabled()`
switches the memo off: a sweep gives the same digest for every id either way
(tests/sweep/test_memo.py; benchmarks/sweep_memo_check.py over 2,000 ids).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from contextlib import contextmanager
from typing import Any, Callable, Hashable, Iterator, TypeVar

T = TypeVar("T")
MACHINES_KEPT = 1024
TRUTHS_KEPT = 8192

_on = os.environ.get("COMMSIM_SWEEP_MEMO", "1") != "0"
_machines: "OrderedDict[Hashable, Any]" = OrderedDict()
_key_of: dict[int, Hashable] = {}        # id of a cluster _machines holds -> its key
_truths: "OrderedDict[Hashable, Any]" = OrderedDict()
stats = {"machine_hits": 0, "machine_misses": 0, "truth_hits": 0, "truth_misses": 0}


def enabled() -> bool:
    return _on


def clear() -> None:
    _machines.clear()
    _key_of.clear()
    _truths.clear()


@contextmanager
def disabled() -> Iterator[None]:
    """Compute everything afresh inside the block (what a worker did before the memo)."""
    global _on
    was, _on = _on, False
    clear()
    try:
        yield
    finally:
        _on = was


def _lookup(table: "OrderedDict[Hashable, Any]", key: Hashable, what: str) -> Any:
    got = table.get(key, _lookup)
    if got is _lookup:
        stats[f"{what}_misses"] += 1
        return _lookup
    stats[f"{what}_hits"] += 1
    table.move_to_end(key)
    return got


def machine(key: tuple, make: Callable[[], T]) -> T:
    """The machine `key` names: (shape, versions, machine faults in the order applied)."""
    if not _on:
        return make()
    got = _lookup(_machines, key, "machine")
    if got is not _lookup:
        return got
    got = _machines[key] = make()
    _key_of[id(got)] = key
    while len(_machines) > MACHINES_KEPT:
        _, old = _machines.popitem(last=False)
        _key_of.pop(id(old), None)
    return got


def group_truth(cluster: Any, gpus: tuple, order: tuple[str, ...] | None,
                make: Callable[[], T]) -> T:
    """`make()` (a group's truth on `cluster`) once per machine key, GPUs and order."""
    return _of_machine(cluster, (gpus, order), make)


def nccl_outcome(cluster: Any, gpus: tuple, env: tuple[tuple[str, str], ...], auto: bool,
                 make: Callable[[], T]) -> T:
    """`make()` (NCCL's outcome on a group of `cluster`) once per machine key, GPUs,
    NCCL_* variables and `auto`."""
    return _of_machine(cluster, ("nccl", gpus, env, auto), make)


def _of_machine(cluster: Any, key: tuple, make: Callable[[], T]) -> T:
    """`make()`, a pure function of the machine this memo built and of `key`, once."""
    mkey = _key_of.get(id(cluster)) if _on else None
    if mkey is None or _machines.get(mkey) is not cluster:
        return make()
    key = (mkey,) + key
    got = _lookup(_truths, key, "truth")
    if got is not _lookup:
        return got
    got = _truths[key] = make()
    while len(_truths) > TRUTHS_KEPT:
        _truths.popitem(last=False)
    return got
