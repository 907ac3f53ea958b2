"""The Group interface (commsim/group/base.py) over torch.distributed object collectives.

For real processes (torchrun): handles, host ids and votes cross the group pickled, through a
gloo process group, exactly as LocalGroup passes them between simulated ranks. `timeout` is
accepted for the interface; torch.distributed applies the process group's own timeout.
"""

from __future__ import annotations

import operator
import pickle
from datetime import timedelta
from functools import reduce
from typing import Any, Sequence

import torch.distributed as dist

_REDUCE = {"min": min, "max": max, "sum": operator.add,
           "and": lambda a, b: bool(a) and bool(b), "or": lambda a, b: bool(a) or bool(b)}


class TorchGroup:
    def __init__(self, pg: Any = None, name: str = "world",
                 global_ranks: Sequence[int] | None = None):
        self._pg = pg   # None: the default (world) group
        self._name = name
        self._global = tuple(global_ranks) if global_ranks is not None else \
            tuple(range(dist.get_world_size()))

    @property
    def rank(self) -> int:
        return dist.get_rank(self._pg)

    @property
    def size(self) -> int:
        return dist.get_world_size(self._pg)

    @property
    def name(self) -> str:
        return self._name

    @property
    def global_ranks(self) -> tuple[int, ...]:
        return self._global

    def all_gather_object(self, obj: Any, *, timeout: float | None = None, tag: str = "") -> list[Any]:
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=self._pg)
        return out

    def broadcast_object(self, obj: Any, src: int, *, timeout: float | None = None,
                         tag: str = "") -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=self._global[src], group=self._pg)
        return box[0]

    def barrier(self, *, timeout: float | None = None, tag: str = "") -> None:
        dist.barrier(group=self._pg)

    def all_reduce_object(self, value: Any, op: str, *, timeout: float | None = None,
                          tag: str = "") -> Any:
        if op not in _REDUCE:
            raise ValueError(f"reduce op {op!r}: accepted {', '.join(_REDUCE)}")
        return reduce(_REDUCE[op], self.all_gather_object(value, tag=tag))

    def exchange(self, key: str, obj: Any, *, timeout: float | None = None,
                 tag: str = "") -> list[Any]:
        """Through the default TCPStore, as PyTorch's symmetric-memory rendezvous does: each
        rank sets `<group>/<key>/<rank>` and waits for every member's key. torch has no public
        accessor for the default store, hence the private one."""
        store = dist.distributed_c10d._get_default_store()
        keys = [f"commsim/{self._name}/{key}/{r}" for r in range(self.size)]
        store.set(keys[self.rank], pickle.dumps(obj))
        if timeout is None:
            store.wait(keys)
        else:
            store.wait(keys, timedelta(seconds=timeout))
        return [pickle.loads(store.get(k)) for k in keys]

    def new_subgroup(self, ranks: Sequence[int], name: str, *, timeout: float | None = None,
                     tag: str = "") -> "TorchGroup | None":
        members = tuple(self._global[r] for r in ranks)
        pg = dist.new_group(list(members), backend="gloo")   # collective over the world
        return TorchGroup(pg, name, members) if self.rank in ranks else None
