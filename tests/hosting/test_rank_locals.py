"""`threading.local` per rank: in-process ranks share one OS thread, so a library's
module-level `threading.local()` (vLLM keeps its current stream in one) must hold one value
per rank, as it does when each rank is a process; outside a rank it is per thread, as real."""

from __future__ import annotations

import threading

from commsim.hosting.surfaces import rank_locals

from sim_ranks import ranks, run


def test_each_in_process_rank_sees_its_own_values_across_a_switch():
    rank_locals.install()
    try:
        tls = threading.local()

        class WithInit(threading.local):
            def __init__(self, start: int) -> None:
                self.count = start

        counted = WithInit(7)
        _, hosted_ranks = ranks("hgx-h100-8", [(0, 0), (0, 1), (0, 2)])

        def body(group):
            tls.stream = 100 + group.rank
            counted.count += group.rank
            group.barrier()                       # every rank writes before any reads back
            return tls.stream, counted.count, hasattr(tls, "missing")

        got = run(hosted_ranks, body)
        assert [o.value for o in got] == [(100, 7, False), (101, 8, False), (102, 9, False)]
        tls.outside = 1                           # outside a rank: this thread's own value
        seen = []
        t = threading.Thread(target=lambda: seen.append(hasattr(tls, "outside")))
        t.start()
        t.join()
        assert seen == [False] and tls.outside == 1
    finally:
        rank_locals.uninstall()
    assert threading.local is not rank_locals.RankLocal
