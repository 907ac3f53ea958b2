"""What a patched name answers: the fake in a hosted rank, the real thing everywhere else.

A patched function stays patched for the life of the interpreter's installation, but only a
hosted rank is simulated: the launcher's own threads, a test runner or Ray in the same
interpreter see the machine's real modules, as without commsim. `rank_of` says who runs the
call (`hosting.state.session.hosted`, or a narrower one such as "an inproc rank"); the
install layer knows no rank itself. An API commsim does not serve fails loudly in a hosted
rank, naming the call (`not_simulated`)."""

from __future__ import annotations

import functools
from typing import Any, Callable

__all__ = ["RankOf", "per_rank", "per_rank_class", "PerRankObject", "not_simulated"]

RankOf = Callable[[], Any]          # the running rank, or None where nothing is hosted


def not_simulated(call: str, hint: str = "") -> Callable[..., Any]:
    """A stand-in for an API commsim does not simulate: calling it fails loudly, naming it
    (and, with `hint`, what to do instead)."""
    message = f"commsim hosting: {call} is not simulated" + (f" {hint}" if hint else "")

    def stand_in(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(message)
    stand_in.__name__ = stand_in.__qualname__ = call.rsplit(".", 1)[-1]
    return stand_in


def per_rank(name: str, hosted: Callable[..., Any], real: Callable[..., Any] | None, rank_of: RankOf,
             *, with_rank: bool = False) -> Callable[..., Any]:
    """A function that calls `hosted` in a hosted rank (with the rank first when
    `with_rank`), `real` elsewhere; it carries real's name, doc and module."""
    def call(*args: Any, **kwargs: Any) -> Any:
        r = rank_of()
        if r is None:
            return real(*args, **kwargs)
        return hosted(r, *args, **kwargs) if with_rank else hosted(*args, **kwargs)
    if real is not None:
        functools.update_wrapper(call, real)
    call.__name__ = name
    return call


class _PerRankClass(type):
    """A class whose construction gives the hosted object in a hosted rank, the real one
    elsewhere (`torch.cuda.Stream(...)`, `torch.cuda.device(...)`); isinstance accepts both."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        impl = cls._hosted if cls._rank_of() is not None else cls._real
        return impl(*args, **kwargs)

    def __instancecheck__(cls, obj: Any) -> bool:
        kinds = tuple(k for k in (cls._hosted, cls._real) if isinstance(k, type))
        return isinstance(obj, kinds)


def per_rank_class(name: str, hosted: Any, real: Any, rank_of: RankOf) -> type:
    return _PerRankClass(name, (), {"_hosted": hosted, "_real": real,
                                    "_rank_of": staticmethod(rank_of)})


class PerRankObject:
    """An object whose attributes are `hosted`'s in a hosted rank, `real`'s elsewhere (a
    binding module object a library keeps, such as torch.cuda.nvtx._nvtx)."""

    def __init__(self, hosted: Any, real: Any, rank_of: RankOf):
        self._hosted = hosted
        self._real = real
        self._rank_of = rank_of

    def __getattr__(self, name: str) -> Any:
        return getattr(self._hosted if self._rank_of() is not None else self._real, name)
