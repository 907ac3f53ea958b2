"""The communicator tests again, with every rank's driver behind a strict proxy that exposes
only the members of the Driver protocol (commsim/driver.py) and, for the fd channel, only the
FdChannel protocol's: a backend that reached past the protocol into the simulator (its
memory views, its process, its fabric) fails here with AttributeError."""

from __future__ import annotations

from typing import Any

import pytest

import commsim.scenario.runner as runner
from commsim.communicator import Communicator
from commsim.driver import Driver, FdChannel

from test_communicator import *  # noqa: F401,F403  (the tests this module reruns)
from test_communicator import CASES, scenario


def _members(proto: type) -> frozenset[str]:
    return frozenset(n for n in dir(proto) if not n.startswith("_"))


DRIVER_MEMBERS = _members(Driver)
CHANNEL_MEMBERS = _members(FdChannel)
CALLS: dict[str, int] = {}


class Strict:
    """Forwards the members of one protocol to `inner`; anything else is an AttributeError."""

    def __init__(self, inner: Any, members: frozenset[str], what: str):
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_members", members)
        object.__setattr__(self, "_what", what)

    def __getattr__(self, name: str) -> Any:
        if name not in self._members:
            raise AttributeError(f"{name!r} is not a member of the {self._what} protocol")
        CALLS[name] = CALLS.get(name, 0) + 1
        value = getattr(self._inner, name)
        if name == "fd_channel":
            return lambda: Strict(value(), CHANNEL_MEMBERS, "FdChannel")
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"the {self._what} protocol has no settable {name!r}")

    def __hash__(self) -> int:          # backends key per-driver state by the driver object
        return hash(self._inner)

    def __eq__(self, other: object) -> bool:
        return self is other


def _strict_communicator(group: Any, driver: Any, policy: Any = None) -> Communicator:
    return Communicator(group, Strict(driver, DRIVER_MEMBERS, "Driver"), policy)


@pytest.fixture(autouse=True)
def protocol_only(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(runner, "Communicator", _strict_communicator)
    yield


def test_the_proxy_refuses_what_the_protocol_lacks_and_is_used():
    from commsim.sim import SimFabric, spawn_driver
    from commsim.topology import build_preset
    c = build_preset("hgx-h100-8")
    d = Strict(spawn_driver(SimFabric(c, 0), next(iter(c.gpu_refs()))), DRIVER_MEMBERS, "Driver")
    for name in ("view", "proc", "fabric", "ledger", "receive_fd", "multimem_views"):
        with pytest.raises(AttributeError, match="not a member of the Driver protocol"):
            getattr(d, name)
    assert {"memcpy_htod", "memcpy_dtoh", "launch_kernel", "close_fd", "fd_channel"} <= DRIVER_MEMBERS
    with pytest.raises(AttributeError):
        d.fd_channel().fd_target
    CALLS.clear()
    res = runner.run_scenario(scenario("hgx-h100-8", sizes=(4096, 10 << 20)))
    assert res.ok and not res.errors, res.errors
    # Through the proxy: set-up, the data path and the multicast fd exchange.
    assert CALLS.get("launch_kernel") and CALLS.get("memcpy_htod") and CALLS.get("fd_channel")
    assert len(CASES) >= 8
