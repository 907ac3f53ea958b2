"""Values nothing can change cross an in-process group shared, not pickled
(commsim/group/sharing.py); anything that could change is still copied."""

from __future__ import annotations

import dataclasses
import enum

import pytest

from commsim.group import GroupError, LocalWorld
from commsim.group.sharing import immutable


class Colour(enum.Enum):
    RED = 1


@dataclasses.dataclass(frozen=True)
class Info:
    rank: int
    p2p: tuple[bool | None, ...]
    uuid: bytes
    colour: Colour = Colour.RED


@dataclasses.dataclass(frozen=True)
class Holder:
    items: list


@dataclasses.dataclass
class Loose:
    rank: int


@dataclasses.dataclass(frozen=True)
class Reopens:
    fd: int

    def __reduce__(self):           # a class that acts on the receiving side
        return (Reopens, (self.fd + 1,))


def test_what_counts_as_immutable():
    assert immutable(Info(1, (True, None), b"x"))
    assert immutable((1, "a", frozenset({2}), (Info(0, (), b""),)))
    assert not immutable(Holder([1]))                 # frozen, but holds a list
    assert not immutable(Loose(1))                    # not frozen
    assert not immutable((1, [2]))
    assert not immutable({"a": 1})
    assert not immutable(Reopens(3))                  # pickles its own way: copied
    odd = Info(1, (), b"")
    object.__setattr__(odd, "extra", [1])             # an attribute beyond the fields
    assert not immutable(odd)

    @dataclasses.dataclass(frozen=True)
    class Local:
        x: int
    assert not immutable(Local(1))                    # would not pickle across processes


def test_immutable_values_are_shared_mutable_ones_copied():
    def body(g):
        shared = g.all_gather_object(Info(g.rank, (True,) * g.rank, bytes([g.rank])))
        copied = g.all_gather_object(Holder([g.rank]))
        assert g.all_gather_object(Reopens(g.rank)) == [Reopens(1), Reopens(2), Reopens(3)]
        b = g.broadcast_object((Info(g.rank, (), b""), "x"), src=1)
        return shared, copied, b

    out = [o.unwrap() for o in LocalWorld(3, seed=1).run(body)]
    for shared, copied, b in out:
        assert [i.rank for i in shared] == [0, 1, 2] and shared[2].p2p == (True, True)
        assert [h.items for h in copied] == [[0], [1], [2]]
        assert b[0].rank == 1
    assert all(out[0][0][k] is out[1][0][k] for k in range(3))       # one object
    assert out[0][2] is out[2][2]
    assert out[0][1][0] is not out[1][1][0]                           # each its own copy
    out[0][1][0].items.append("mutated")
    assert out[1][1][0].items == [0]


def test_a_local_frozen_class_still_fails_as_unpicklable():
    @dataclasses.dataclass(frozen=True)
    class Local:
        x: int

    errs = [o.error for o in LocalWorld(2, seed=0).run(lambda g: g.all_gather_object(Local(g.rank)))]
    for e in errs:
        assert isinstance(e, GroupError) and "does not pickle" in str(e)


@pytest.mark.parametrize("obj", [Info(0, (), b"k"), (1, 2), Colour.RED])
def test_exchange_shares_immutable_values(obj):
    out = [o.unwrap() for o in LocalWorld(2, seed=0).run(lambda g: g.exchange("k", obj))]
    assert out[0][0] is obj and out[1][1] is obj
