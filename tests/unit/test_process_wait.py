"""A hosted process's driver waits: real-time polls that end named, never hang."""

import threading

import pytest

from commsim.hosting.state.process_wait import give_up_at, real_time_waiter
from commsim.runtime.diagnosis import HangDetected


def test_a_wait_that_peers_satisfy_returns():
    flag = threading.Event()
    threading.Timer(0.05, flag.set).start()
    real_time_waiter(float("inf"))(flag.is_set, "peer joins", None)
    assert flag.is_set()


def test_a_wait_nobody_satisfies_ends_naming_what_it_waited_for():
    with pytest.raises(HangDetected, match="cuMemMap of multicast object 7: 1 of 2 devices"):
        real_time_waiter(float("inf"))(lambda: False,
                                       "cuMemMap of multicast object 7: 1 of 2 devices", 0.05)


def test_waits_end_before_the_launcher_kills():
    assert give_up_at(100.0, 120.0) == 217.0
    assert give_up_at(100.0, 4.0) == 103.0
