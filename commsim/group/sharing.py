"""What may cross an in-process group without a copy (commsim/group/local.py).

Objects cross a group by value: a receiver must never see a later change a sender makes, as
it could not across processes. A value that cannot change needs no copy to keep that
promise, and pickling a 576-rank discovery all-gather into every receiver was 576 x 576
objects rebuilt. Such a value is a scalar, an enum member, or a tuple, frozenset or frozen
dataclass made only of such values; its class is importable (no '<locals>' in its name), so
it would pickle across processes too, the check the copy used to make, and does not pickle
its own way.
"""

from __future__ import annotations

import dataclasses
import enum
import operator
from typing import Any, Callable

SCALARS = frozenset({int, float, bool, str, bytes, complex, type(None)})
_DEPTH = 6          # deeper nesting is copied: the walk stays cheap next to the pickle


class _Shape:
    """What `immutable` needs of a frozen dataclass: its field names, and a getter of the
    field values in one call."""

    __slots__ = ("names", "values")

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = frozenset(names)
        getter = operator.attrgetter(*names) if names else (lambda v: ())
        self.values: Callable[[Any], Any] = (
            (lambda v: (getter(v),)) if len(names) == 1 else getter)


# Per class: its _Shape, or None when its instances are never shared. A pure function of the
# class's declaration (the dataclass parameters and fields, its name, its pickling methods),
# which does not change once the class exists. Only importable classes are kept (a bounded
# set); '<locals>' classes are refused before the table is consulted.
_shapes: dict[type, _Shape | None] = {}


def _shape(t: type) -> _Shape | None:
    params = getattr(t, "__dataclass_params__", None)
    if params is None or not params.frozen or _custom_pickle(t):
        return None
    return _Shape(tuple(f.name for f in dataclasses.fields(t)))


def immutable(v: Any, depth: int = 0) -> bool:
    """Whether `v` can be shared between ranks: nothing in it can change."""
    t = type(v)
    if t in SCALARS or isinstance(v, enum.Enum):
        return True
    if depth >= _DEPTH:
        return False
    if t is tuple or t is frozenset:
        return all_immutable(v, depth + 1)
    shape = _shapes.get(t, _shapes)
    if shape is _shapes:
        if "<locals>" in t.__qualname__:
            return False
        shape = _shapes[t] = _shape(t)
    if shape is None:
        return False
    d = getattr(v, "__dict__", None)
    if d and not shape.names.issuperset(d):
        return False        # an attribute beyond the fields (set through object.__setattr__)
    return all_immutable(shape.values(v), depth + 1)


def all_immutable(items: Any, depth: int = 0) -> bool:
    """Whether every one of `items` (a collection: read twice) is `immutable` (at nesting
    `depth`)."""
    # Most are scalars (votes are None): one set test over their types, the walk only when
    # some are not.
    if SCALARS.issuperset(map(type, items)):
        return True
    return all(immutable(x, depth) for x in items if type(x) not in SCALARS)


def _custom_pickle(t: type) -> bool:
    """A class that pickles its own way may do something on the receiving side (re-open a
    handle, register itself): it is copied, so that still happens."""
    return (t.__reduce__ is not object.__reduce__ or t.__reduce_ex__ is not object.__reduce_ex__
            or getattr(t, "__setstate__", None) is not None)
