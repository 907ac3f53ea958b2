"""The collectives of the group layer by name, as a person reads a call ('broadcast_object(src=1)')
and the reductions all_reduce_object offers: shared by the in-process and the
torch.distributed groups (commsim/group/local.py, commsim/group/torch_dist.py)."""

from __future__ import annotations

import operator
from functools import reduce
from typing import Any

BARRIER = "barrier"
ALL_GATHER = "all_gather_object"
BROADCAST = "broadcast_object"
ALL_REDUCE = "all_reduce_object"
NEW_SUBGROUP = "new_subgroup"
COMBINE = "combine_arrays"


def label(kind: str, param: Any) -> str:
    """The call as a person reads it: 'broadcast_object(src=1)'."""
    if kind == BROADCAST:
        return f"{kind}(src={param})"
    if kind == ALL_REDUCE:
        return f"{kind}(op={param!r})"
    if kind == NEW_SUBGROUP:
        return f"{kind}(ranks={list(param[0])}, name={param[1]!r})"
    if kind == COMBINE:
        fn, args = param
        return f"{kind}(fn={getattr(fn, '__qualname__', fn)}, args={args!r})"
    return kind


def _arg(a: Any) -> str:
    """An argument as its program wrote it: an enum member by its name (SUM, not
    <RedOpType.SUM: 0>)."""
    name = getattr(a, "name", None)
    return name if isinstance(name, str) else repr(a)


def called(kind: str, param: Any, tag: str) -> str:
    """One side of a collective mismatch as the program made the call. A hosted library
    tags its data-path collective '<operation> at <the user's call site>'
    ('torch.distributed.all_reduce at prog.py:5 in main'): that, with the call's own
    arguments, is what the program called; the group's function behind it is not."""
    if kind == COMBINE and " at " in tag:
        _, args = param
        op, sep, where = tag.partition(" at ")
        return f"{op}({', '.join(_arg(a) for a in args)}){sep}{where}"
    return f"{label(kind, param)} (tag {tag!r})"


def reduce_values(op: str, values: list[Any]) -> Any:
    if op == "min":
        return min(values)
    if op == "max":
        return max(values)
    if op == "and":
        return all(values)
    if op == "or":
        return any(values)
    return reduce(operator.add, values)  # "sum": works for numbers and numpy arrays
