"""A ledger item names the line of user code that created it (worked out when read, from the
frame's instruction offset: commsim/sim/ledger.py), and a ledger still pickles whole (the
process rig sends one between processes)."""

from __future__ import annotations

import inspect
import pickle

from commsim.sim import SimFabric, spawn_driver
from commsim.topology import build_preset


def test_the_site_is_the_calling_line_and_survives_pickling() -> None:
    c = build_preset("hgx-h100-8")
    d = spawn_driver(SimFabric(c), next(iter(c.gpu_refs())))
    line = inspect.currentframe().f_lineno + 1
    err, ptr = d.cudaMalloc(4096)
    (item,) = list(d.ledger)
    assert item.site == f"test_ledger_site.py:{line} in {test_the_site_is_the_calling_line_and_survives_pickling.__name__}"
    copy = pickle.loads(pickle.dumps(d.ledger))
    assert copy.report() == d.ledger.report() and f":{line} in" in copy.report()
