"""mpi4py.MPI.Op: the predefined reduction operations, on Python objects and on buffers."""

from __future__ import annotations

import functools
import operator
from typing import Any, Callable

import numpy as np

from commsim.hosting.install.dispatch import not_simulated


def _loc(better: Callable[[Any, Any], bool]) -> Callable[[Any, Any], Any]:
    # MAXLOC/MINLOC on (value, location) pairs: ties go to the lower location (MPI-3.1 5.9.4).
    def pick(a: Any, b: Any) -> Any:
        if better(a[0], b[0]) or (a[0] == b[0] and a[1] <= b[1]):
            return a
        return b
    return pick


class Op:
    """mpi4py.MPI.Op: predefined operations. For Python objects mpi4py applies them with
    Python's operators (SUM: +, PROD: *, LAND: and, BAND: &, ...); for buffers elementwise."""

    def __init__(self, name: str, py: Callable[[Any, Any], Any], ufunc: Any) -> None:
        self.name = name
        self._py = py
        self._ufunc = ufunc

    def __call__(self, x: Any, y: Any) -> Any:
        return self._py(x, y)

    def __repr__(self) -> str:
        return f"<mpi4py.MPI.Op {self.name}>"

    def Is_commutative(self) -> bool:
        return True

    def fold(self, values: list[Any]) -> Any:
        return functools.reduce(self._py, values)     # in rank order

    def fold_arrays(self, arrays: list[Any]) -> Any:
        if self._ufunc is None:
            raise NotImplementedError(f"commsim hosting: mpi4py.MPI.{self.name} on buffers is "
                                      f"not simulated")
        return functools.reduce(self._ufunc, arrays)

    Create = staticmethod(not_simulated("mpi4py.MPI.Op.Create"))


SUM = Op("SUM", operator.add, np.add)
PROD = Op("PROD", operator.mul, np.multiply)
MAX = Op("MAX", lambda a, b: b if b > a else a, np.maximum)
MIN = Op("MIN", lambda a, b: b if b < a else a, np.minimum)
LAND = Op("LAND", lambda a, b: bool(a) and bool(b), np.logical_and)
LOR = Op("LOR", lambda a, b: bool(a) or bool(b), np.logical_or)
LXOR = Op("LXOR", lambda a, b: bool(a) != bool(b), np.logical_xor)
BAND = Op("BAND", operator.and_, np.bitwise_and)
BOR = Op("BOR", operator.or_, np.bitwise_or)
BXOR = Op("BXOR", operator.xor, np.bitwise_xor)
MAXLOC = Op("MAXLOC", _loc(operator.gt), None)
MINLOC = Op("MINLOC", _loc(operator.lt), None)
OPS = (SUM, PROD, MAX, MIN, LAND, LOR, LXOR, BAND, BOR, BXOR, MAXLOC, MINLOC)


def as_op(op: Any) -> Op:
    if isinstance(op, Op):
        return op
    raise TypeError(f"expecting an mpi4py.MPI.Op (MPI.SUM, MPI.MAX, ...), got {op!r}")
