"""combine_arrays, the group layer's data path (commsim/group/local.py): computed once over the
ranks' own arrays (no copy, no pickle), one read-only result shared by every rank; and the
nccl backend built on it (commsim/backends/nccl.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from commsim.communicator import Communicator
from commsim.group import CollectiveMismatch, GroupError, LocalWorld
from commsim.policy import Policy
from commsim.sim import SimFabric, spawn_driver
from commsim.topology import build_preset


def _sum(parts, scale):
    return np.sum(np.stack(parts), axis=0) * scale


def test_result_is_computed_once_over_the_ranks_own_arrays():
    n = 6
    mine = [np.arange(5, dtype=np.int64) + 10 * r for r in range(n)]
    seen = []

    def fn(parts, scale):
        seen.append(list(parts))
        return _sum(parts, scale)

    def body(g):
        return g.combine_arrays(mine[g.rank], fn, (2,), tag="sum")

    out = [o.unwrap() for o in LocalWorld(n, seed=1).run(body)]
    assert len(seen) == 1                                    # once for the whole group
    assert all(p is a for p, a in zip(seen[0], mine))       # the ranks' arrays themselves
    expect = 2 * sum(mine)
    for res in out:
        assert res is out[0]                                 # one result, shared
        np.testing.assert_array_equal(res, expect)
        assert not res.flags.writeable
        with pytest.raises(ValueError):
            res[0] = 1
    assert all(a.flags.writeable for a in mine)              # inputs untouched


def test_a_result_that_is_an_input_does_not_make_that_input_read_only():
    mine = [np.full(3, r) for r in range(3)]

    def first(parts):
        return parts[0]

    out = [o.unwrap() for o in LocalWorld(3, seed=0).run(
        lambda g: g.combine_arrays(mine[g.rank], first))]
    assert np.shares_memory(out[1], mine[0]) and not out[1].flags.writeable
    assert mine[0].flags.writeable


def test_different_functions_or_args_are_a_collective_mismatch():
    def body(g):
        return g.combine_arrays(np.zeros(2), _sum, (g.rank % 2,), tag="sum")

    errs = [o.error for o in LocalWorld(2, seed=2).run(body)]
    assert all(isinstance(e, CollectiveMismatch) for e in errs), errs
    full = max(map(str, errs), key=len)
    assert "combine_arrays(fn=_sum, args=(0,))" in full and "combine_arrays(fn=_sum, args=(1,))" in full


def test_an_error_in_the_function_reaches_every_rank():
    def fn(parts):
        raise ValueError("shapes differ")

    errs = [o.error for o in LocalWorld(3, seed=0).run(
        lambda g: g.combine_arrays(np.zeros(g.rank + 1), fn, tag="bad"))]
    assert all(isinstance(e, GroupError) and "shapes differ" in str(e) for e in errs), errs
    assert "does not pickle" not in str(errs[0])


def test_a_non_array_is_refused_in_the_caller():
    err = LocalWorld(1, seed=0).run(lambda g: g.combine_arrays([1, 2], _sum, (1,)))[0].error
    assert isinstance(err, TypeError) and "numpy array" in str(err)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter"])
def test_nccl_collectives_through_combine(op, dtype):
    """Exact results (small integers), each rank's output its own writable tensor."""
    n = 8
    c = build_preset("hgx-h100-8")
    fabric = SimFabric(c)
    drivers = [spawn_driver(fabric, g) for g in c.gpu_refs()]
    inputs = [torch.arange(16, dtype=torch.float32).reshape(4, 4).to(dtype) + r for r in range(n)]

    def body(g):
        comm = Communicator(g, drivers[g.rank], Policy(order=("nccl",)))
        y = getattr(comm, op)(inputs[g.rank])
        assert comm.chosen(op, inputs[g.rank].numel() * inputs[g.rank].element_size(),
                           str(dtype).removeprefix("torch.")) == "nccl"
        comm.close()
        return y

    outs = [o.unwrap() for o in LocalWorld(n, seed=4).run(body)]
    total = sum(t.float() for t in inputs)
    for r, y in enumerate(outs):
        assert y.dtype == dtype
        if op == "all_reduce":
            assert y.shape == (4, 4) and torch.equal(y.float(), total)
        elif op == "all_gather":
            assert y.shape == (32, 4) and torch.equal(y, torch.cat(inputs))
        else:
            assert torch.equal(y.float(), total.reshape(-1)[2 * r:2 * r + 2])
        y.add_(1)   # writable, and no other rank's output moves with it
    assert len({y.untyped_storage().data_ptr() for y in outs}) == n
