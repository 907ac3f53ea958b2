"""The ranks of one in-process group share one GroupView: its derived facts (pair scans,
eligibility verdicts, NCCL's decision) are computed once per group, and a verdict is reused
only for equal params."""

from __future__ import annotations

from commsim.backends import get_backend
from commsim.communicator import Communicator
from commsim.group import LocalWorld
from commsim.policy import Policy
from commsim.sim import SimFabric, spawn_driver
from commsim.topology import build_preset


def test_one_view_per_group_and_one_verdict_per_params(monkeypatch):
    cluster = build_preset("hgx-h100-8")
    fabric = SimFabric(cluster, seed=0)
    drivers = [spawn_driver(fabric, g) for g in list(cluster.gpu_refs())[:4]]
    ipc = get_backend("ipc")
    asked: list[dict] = []
    real = ipc.__dict__["eligibility"].__func__

    def eligibility(cls, view, params):
        asked.append(dict(params))
        return real(cls, view, params)

    def rank(world):
        sub = world.new_subgroup([0, 1], "pair")
        comm = Communicator(world, drivers[world.rank], Policy(order=("ipc", "nccl")))
        view = comm.view
        comm.close()
        pair = None
        if sub is not None:
            c = Communicator(sub, drivers[world.rank], Policy(order=("ipc", "nccl")))
            pair = c.view
            c.close()
        return view, pair

    monkeypatch.setattr(ipc, "eligibility", classmethod(eligibility))
    outs = LocalWorld(4, seed=0).run(rank)
    assert all(o.ok for o in outs), [o.error for o in outs]
    views = [o.value[0] for o in outs]
    assert all(v is views[0] for v in views) and views[0].size == 4
    pairs = [o.value[1] for o in outs if o.value[1] is not None]
    assert len(pairs) == 2 and pairs[0] is pairs[1] and pairs[0] is not views[0]
    assert len(asked) == 2                      # once per group, not once per rank
    again = ipc.admitted(views[0], {**asked[0], "p2p_check": "flag"})
    assert again.ok and len(asked) == 3         # other params: computed anew
    assert ipc.admitted(views[0], dict(asked[0])) is ipc.admitted(views[0], asked[0])
    assert len(asked) == 3
