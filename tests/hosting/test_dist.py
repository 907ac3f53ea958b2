"""torch.distributed as a hosted program sees it: the real gloo in procs mode, the calls
answered per rank in inproc mode, with the same answers; hangs diagnosed; calls commsim does
not serve fail naming themselves."""

import functools
import operator

import pytest

from hosting_helpers import PROGRAMS, hosted


def _expected(rank: int, world: int) -> dict:
    group = [r for r in range(world) if r % 2 == rank % 2]
    return {
        "rank": rank, "world": world, "backend": "cpu:gloo,cuda:nccl", "group_ranks": group,
        "group_rank": group.index(rank), "group_size": len(group),
        "objs": [{"rank": r} for r in range(world)], "box": [f"from{world - 1}", (world - 1) * 10],
        "gathered": [r * r for r in range(world)] if rank == 0 else None, "sub": group,
        "sum": [float(sum(range(world))), float(world)], "max": [world - 1],
        "bits": {name: [functools.reduce(fn, (v(r) for r in range(world))) for v in
                        (lambda r: r + 1, lambda r: 6 | r)]
                 for name, fn in (("BAND", operator.and_), ("BOR", operator.or_),
                                  ("BXOR", operator.xor))},
        "refused": "Cannot use ReduceOp.BAND with non-integral dtype",
        "parts": [[float(r), float(-r)] for r in range(world)], "bcast": [0.0, 2.0, 4.0],
    }


@pytest.mark.parametrize("mode, per_host", [("inproc", 2), ("procs", 1)])
def test_served_calls_answer_like_gloo(mode, per_host):
    v, res, out = hosted(PROGRAMS / "dist_calls.py", "gb200-nvl72:2", mode=mode,
                         nproc_per_host=per_host)
    assert v.ok, v.format() + out
    n = 2 * per_host
    assert {r: res[r] for r in range(n)} == {r: _expected(r, n) for r in range(n)}
    # CPU tensors and objects of a "cpu:gloo,cuda:nccl" group are gloo's, and the verdict says so
    assert all(any("gloo" in n for n in p.notes) for p in v.ranks)


def test_inproc_replays_by_seed():
    a = hosted(PROGRAMS / "dist_calls.py", "hgx-h100-8", nproc_per_host=4, seed=5)[0]
    b = hosted(PROGRAMS / "dist_calls.py", "hgx-h100-8", nproc_per_host=4, seed=5)[0]
    c = hosted(PROGRAMS / "dist_calls.py", "hgx-h100-8", nproc_per_host=4, seed=6)[0]
    assert a.trace_hash == b.trace_hash != c.trace_hash


def test_inproc_hang_is_diagnosed():
    v, _, out = hosted(PROGRAMS / "lonely_barrier.py", "hgx-h100-8", nproc_per_host=2)
    assert not v.ok and v.exit_code == 1
    r0, r1 = v.ranks
    assert r0.status == "ok" and r1.status == "hang", v.format()
    assert "barrier" in r1.hang and "lonely_barrier.py" in r1.hang and "rank 0" in r1.hang


def test_inproc_mismatch_names_both_calls():
    v, _, out = hosted(PROGRAMS / "skip_barrier.py", "hgx-h100-8", nproc_per_host=2)
    assert not v.ok
    for p in v.ranks:
        assert "CollectiveMismatch" in p.exception and "all_gather_object" in p.exception
        assert "skip_barrier.py:8" in p.exception and "skip_barrier.py:11" in p.exception


def test_inproc_mismatch_names_the_operations_not_the_group_functions():
    v, _, out = hosted(PROGRAMS / "mismatched_ops.py", "hgx-h100-8", nproc_per_host=2)
    assert not v.ok
    for p in v.ranks:
        assert ("rank 1 called torch.distributed.all_gather() at mismatched_ops.py:10 in <module>"
                in p.exception), p.exception
        assert "rank 0 called torch.distributed.all_reduce(SUM) at mismatched_ops.py:7" in p.exception
        assert "combine_arrays" not in p.exception and "_reduce_parts" not in p.exception


def test_procs_hang_shows_where_each_rank_waits():
    v, _, out = hosted(PROGRAMS / "lonely_barrier.py", "hgx-h100-8", mode="procs",
                       nproc_per_host=2, timeout=15)
    assert not v.ok
    assert [p.status for p in v.ranks] == ["hang", "hang"], v.format()
    assert "lonely_barrier.py\", line 9" in v.ranks[0].hang, v.format()   # time.sleep
    assert "lonely_barrier.py\", line 11" in v.ranks[1].hang, v.format()  # dist.barrier


def test_unserved_call_fails_naming_itself():
    v, _, out = hosted(PROGRAMS / "not_simulated.py", "hgx-h100-8", nproc_per_host=2)
    assert not v.ok
    assert all(p.exception.startswith("NotImplementedError: commsim hosting: "
                                      "torch.distributed.all_to_all_single is not simulated")
               for p in v.ranks), v.format()


def test_batch_isend_irecv_takes_the_hosted_isend():
    # torch.distributed.isend and distributed_c10d.isend are one function to torch (P2POp
    # checks its op against c10d's by identity): the hosted surface keeps them one.
    v, res, out = hosted(PROGRAMS / "p2p_batch.py", "hgx-h100-8", mode="procs", nproc_per_host=2)
    assert v.ok, v.format() + out
    assert res == {r: {"rank": r, "got": [float((r - 1) % 2)] * 4, "same_isend": True} for r in range(2)}


def test_torch_submodules_see_the_hosted_functions():
    # Without it an inproc rank's init_device_mesh found the process group uninitialised,
    # called the real init_process_group and blocked in its TCPStore rendezvous for 30 min.
    v, res, out = hosted(PROGRAMS / "device_mesh_sees_init.py", "hgx-h100-8", nproc_per_host=2)
    assert v.ok, v.format() + out
    assert res == {r: {"rank": r, "before": False, "after": True} for r in range(2)}


@pytest.mark.parametrize("mode", ["inproc", "procs"])
def test_default_group_is_reachable_as_torch_names_it(mode):
    v, res, out = hosted(PROGRAMS / "world_group.py", "hgx-h100-8", mode=mode, nproc_per_host=2)
    assert v.ok, v.format() + out
    assert res == {r: {"rank": r, "before": True, "same": True, "size": 2, "group_rank": r,
                       "named": True, "is_process_group": True, "sub_is_process_group": True}
                   for r in range(2)}
    import torch.distributed as dist
    assert dist.group.WORLD is None       # outside the run: torch's own answer
