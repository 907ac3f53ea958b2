"""The Group interface: rank-to-rank exchange of small picklable objects (handles, host ids).

Two implementations fit it: `commsim.group.local.LocalGroup` (ranks as greenlets in one
process under a seeded scheduler) and `commsim.group.torch_dist.TorchDistGroup` (real
processes, through a torch.distributed store). The surface is therefore what torch.distributed's object collectives offer:
objects cross the group by value (pickled), ranks are group ranks, and a subgroup is created
collectively by every member of the parent.

Every collective takes `timeout` (seconds; virtual seconds in the local implementation,
None = wait forever, hangs are then found by deadlock detection) and `tag`, a short
description of the call site / lifecycle step ("ipc.init: exchange handles") that every
diagnosis repeats.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence, TypeVar, runtime_checkable

import numpy as np

T = TypeVar("T")

# Reductions all_reduce_object accepts. and/or are for votes ("does every rank support X?"):
# a collective allocation path is only taken when every rank agrees.
REDUCE_OPS = ("min", "max", "and", "or", "sum")


@runtime_checkable
class Group(Protocol):
    @property
    def rank(self) -> int:
        """This process's rank within the group (0 .. size-1)."""

    @property
    def size(self) -> int: ...

    @property
    def name(self) -> str: ...

    @property
    def global_ranks(self) -> tuple[int, ...]:
        """World rank of each group rank: global_ranks[group_rank]."""

    def all_gather_object(self, obj: Any, *, timeout: float | None = None,
                          tag: str = "") -> list[Any]:
        """Every rank's obj, indexed by group rank; each caller gets its own copies."""

    def broadcast_object(self, obj: Any, src: int, *, timeout: float | None = None,
                         tag: str = "") -> Any:
        """src's obj (src is a group rank); other ranks' obj is ignored."""

    def barrier(self, *, timeout: float | None = None, tag: str = "") -> None: ...

    def all_reduce_object(self, value: T, op: str, *, timeout: float | None = None,
                          tag: str = "") -> T:
        """Reduce the values of all ranks with op in REDUCE_OPS ('and'/'or' give a bool)."""

    def combine_arrays(self, arr: np.ndarray, fn: Callable[..., np.ndarray], args: tuple = (), *,
                       timeout: float | None = None, tag: str = "") -> np.ndarray:
        """fn([every rank's arr, by group rank], *args): one array, the same on every rank and
        read-only (copy it before writing). fn and args are part of the call and must be
        equal on every rank. The in-process group computes it once for all ranks, over the
        ranks' own arrays (no copy, no pickle); across processes each rank computes it over
        the all-gathered copies. This is how a simulated collective's data moves: a ring of
        object all-gathers cost ranks x message per rank."""

    def exchange(self, key: str, obj: Any, *, timeout: float | None = None,
                 tag: str = "") -> list[Any]:
        """A store-keyed all-gather: post obj under `key`, return every member's obj once all
        have posted. Ranks meet by key, not by call order (PyTorch's symmetric-memory
        rendezvous goes through the store this way), so ranks that compute different keys
        never meet: in-process that is a diagnosed hang, across processes a store timeout."""

    def new_subgroup(self, ranks: Sequence[int], name: str, *, timeout: float | None = None,
                     tag: str = "") -> "Group | None":
        """Collective over this group: every member calls it with the same ranks (group ranks
        of this group, in the order that defines the subgroup's ranks) and name; members get
        the subgroup, non-members None."""


def readonly(result: Any) -> Any:
    """`combine_arrays`' result as every rank gets it: an array no rank can write into."""
    if isinstance(result, np.ndarray):
        result = result.view()      # a view: fn may have returned an array a rank still owns
        result.flags.writeable = False
    return result
