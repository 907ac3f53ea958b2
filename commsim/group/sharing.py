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
from typing import Any

SCALARS = frozenset({int, float, bool, str, bytes, complex, type(None)})
_DEPTH = 6          # deeper nesting is copied: the walk stays cheap next to the pickle


def immutable(v: Any, depth: int = 0) -> bool:
    """Whether `v` can be shared between ranks: nothing in it can change."""
    t = type(v)
    if t in SCALARS or isinstance(v, enum.Enum):
        return True
    if depth >= _DEPTH:
        return False
    if t is tuple or t is frozenset:
        return all(immutable(x, depth + 1) for x in v)
    params = getattr(t, "__dataclass_params__", None)
    if params is None or not params.frozen or "<locals>" in t.__qualname__ or _custom_pickle(t):
        return False
    if getattr(v, "__dict__", None) and set(v.__dict__) - {f.name for f in dataclasses.fields(v)}:
        return False        # an attribute beyond the fields (set through object.__setattr__)
    return all(immutable(getattr(v, f.name), depth + 1) for f in dataclasses.fields(v))


def _custom_pickle(t: type) -> bool:
    """A class that pickles its own way may do something on the receiving side (re-open a
    handle, register itself): it is copied, so that still happens."""
    return (t.__reduce__ is not object.__reduce__ or t.__reduce_ex__ is not object.__reduce_ex__
            or getattr(t, "__setstate__", None) is not None)
