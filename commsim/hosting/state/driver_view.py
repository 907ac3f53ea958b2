"""The driver a hosted rank's surfaces call: the rank's SimDriver, watched.

Every `cu*` / `cuda*` call that returns a non-success code is reported to the rank's events
(the verdict's "first CUDA error", with the call site in the user's code), whichever surface
made it (cuda.bindings, libcudart through ctypes, torch.cuda). Everything else passes through.
"""

from __future__ import annotations

from typing import Any

from commsim.driver import error_name, error_string
from commsim.hosting.state.session import RankEvents, user_site


class HostedDriver:
    def __init__(self, inner: Any, events: RankEvents) -> None:
        self._inner = inner
        self._events = events

    @property
    def inner(self) -> Any:
        return self._inner

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if not (name.startswith("cu") and callable(value)):
            return value
        events = self._events

        def call(*args: Any, **kwargs: Any) -> Any:
            res = value(*args, **kwargs)
            if isinstance(res, tuple) and res:
                try:
                    code = int(res[0])
                except (TypeError, ValueError):
                    code = 0
                if code != 0:
                    events.cuda_error(name, code, error_name(res[0]), error_string(res[0]),
                                      user_site(2), refusal_of(self._inner))
            return res
        call.__name__ = name
        self.__dict__[name] = call      # bound once: later lookups skip __getattr__
        return call

    def __repr__(self) -> str:
        return f"<hosted {self._inner!r}>"


def refusal_of(driver: Any) -> Any:
    """Why the driver's last failing call failed (SimDriver.refusal), without building a
    driver that was never built (a LazyDriver no call reached yet)."""
    if isinstance(driver, LazyDriver):
        driver = driver.built
    if isinstance(driver, HostedDriver):
        driver = driver.inner
    return getattr(driver, "refusal", None) if driver is not None else None


class LazyDriver:
    """A process's driver, built on first use (procs mode): building maps shared memory and
    imports torch, which a process that never touches CUDA (a resource tracker, a worker that
    only computes) should not pay for. Forwards everything to the built HostedDriver."""

    def __init__(self, build: Any) -> None:
        self.__dict__["_build"] = build
        self.__dict__["_built"] = None

    @property
    def built(self) -> Any:
        return self.__dict__["_built"]

    def _get(self) -> Any:
        d = self.__dict__["_built"]
        if d is None:
            d = self.__dict__["_built"] = self.__dict__["_build"]()
        return d

    def __getattr__(self, name: str) -> Any:
        return getattr(self._get(), name)

    def __repr__(self) -> str:
        return f"<lazy hosted driver {'(built)' if self.built is not None else '(not built)'}>"
