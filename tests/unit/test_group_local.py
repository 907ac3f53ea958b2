"""The in-process group layer: collectives, subgroups, determinism, and every hang mode."""

from __future__ import annotations

import threading

import pytest

from commsim.group import (CollectiveMismatch, Group, GroupError, GroupTimeout, HangDetected,
                           LocalWorld, RankFailed, Scheduler, current_rank, current_scheduler,
                           in_rank, now, sleep, wait_until, yield_now)


def values(outcomes):
    return [o.unwrap() for o in outcomes]


def errors(outcomes):
    return [o.error for o in outcomes]


# ---- collectives ---------------------------------------------------------------------------

@pytest.mark.parametrize("size", [1, 2, 8, 72])
def test_collectives_return_correct_values(size):
    def body(g):
        gathered = g.all_gather_object({"rank": g.rank, "sq": g.rank ** 2}, tag="gather")
        g.barrier(tag="sync")
        bcast = g.broadcast_object(["from", g.rank], src=size - 1, tag="bcast")
        total = g.all_reduce_object(g.rank, "sum", tag="sum")
        lo = g.all_reduce_object(g.rank, "min")
        hi = g.all_reduce_object(g.rank, "max")
        return gathered, bcast, total, lo, hi

    world = LocalWorld(size, seed=3)
    for rank, (gathered, bcast, total, lo, hi) in enumerate(values(world.run(body))):
        assert gathered == [{"rank": r, "sq": r * r} for r in range(size)]
        assert bcast == ["from", size - 1]
        assert total == size * (size - 1) // 2
        assert (lo, hi) == (0, size - 1)


def test_group_properties_and_protocol():
    world = LocalWorld(4, seed=0)
    g = world.group(2)
    assert isinstance(g, Group)
    assert (g.rank, g.size, g.name, g.global_ranks) == (2, 4, "world", (0, 1, 2, 3))
    assert world.group(2) is g


def test_subgroups_tp4_dp2_have_independent_sequences():
    def body(g):
        tp = [g.new_subgroup(list(range(i * 4, i * 4 + 4)), f"tp{i}", tag="make tp")
              for i in range(2)]
        dp = [g.new_subgroup([j, j + 4], f"dp{j}", tag="make dp") for j in range(4)]
        (my_tp,) = [t for t in tp if t is not None]
        (my_dp,) = [d for d in dp if d is not None]
        # Different numbers of collectives per group: sequences must not interfere.
        for _ in range(3):
            my_tp.barrier(tag="tp sync")
        tp_ranks = my_tp.all_gather_object(g.rank, tag="tp gather")
        dp_ranks = my_dp.all_gather_object(g.rank, tag="dp gather")
        world_sum = g.all_reduce_object(1, "sum", tag="world count")
        return (my_tp.name, my_tp.rank, my_tp.size, my_tp.global_ranks, tp_ranks,
                my_dp.name, my_dp.rank, my_dp.global_ranks, dp_ranks, world_sum)

    world = LocalWorld(8, seed=11)
    res = values(world.run(body))
    for r, (tpn, tpr, tps, tpg, tp_ranks, dpn, dpr, dpg, dp_ranks, ws) in enumerate(res):
        base = (r // 4) * 4
        assert (tpn, tpr, tps) == (f"tp{r // 4}", r % 4, 4)
        assert tpg == tuple(range(base, base + 4)) and tp_ranks == list(tpg)
        assert (dpn, dpr, dpg) == (f"dp{r % 4}", r // 4, (r % 4, r % 4 + 4))
        assert dp_ranks == list(dpg)
        assert ws == 8
    seqs = {(e[0], e[2], e[3]) for e in world.trace if e[0] == "all_gather_object"}
    assert ("all_gather_object", "tp0", 3) in seqs and ("all_gather_object", "dp0", 0) in seqs
    # 6 new_subgroup calls on the world are world #0..#5; the all_reduce is world #6.
    assert {e[3] for e in world.trace if e[0] == "all_reduce_object"} == {6}


def test_broadcast_from_nonzero_src_ignores_other_ranks_objects():
    def body(g):
        return g.broadcast_object({"key": "secret"} if g.rank == 2 else None, src=2)

    assert values(LocalWorld(5, seed=1).run(body)) == [{"key": "secret"}] * 5


def test_all_reduce_votes():
    def body(g):
        supported = g.rank != 3  # rank 3 cannot import the others' handles
        return (g.all_reduce_object(supported, "and", tag="vote: ipc"),
                g.all_reduce_object(not supported, "or", tag="vote: any unsupported"),
                g.all_reduce_object(True, "and", tag="vote: all yes"))

    assert values(LocalWorld(4, seed=2).run(body)) == [(False, True, True)] * 4


def test_invalid_arguments_raise_in_the_caller():
    def body(g):
        with pytest.raises(ValueError, match="op 'avg'"):
            g.all_reduce_object(1, "avg")
        with pytest.raises(ValueError, match="src 9"):
            g.broadcast_object(1, src=9)
        with pytest.raises(ValueError, match="distinct"):
            g.new_subgroup([0, 0], "dup")
        g.barrier()  # the rejected calls took no sequence number

    values(LocalWorld(2, seed=0).run(body))


def test_objects_are_copied_between_ranks():
    sent: dict[int, list] = {}

    def body(g):
        mine = [g.rank, [g.rank]]
        sent[g.rank] = mine
        got = g.all_gather_object(mine)
        got[0].append("mutated")
        got[1][1].append("mutated")
        b = g.broadcast_object(mine, src=0)
        b.append("mutated")
        g.barrier()
        return got, b

    res = values(LocalWorld(2, seed=5).run(body))
    assert sent == {0: [0, [0]], 1: [1, [1]]}
    assert res[0][0][0] is not res[1][0][0]  # each receiver has its own copy
    assert res[0][1] is not sent[0]


def test_unpicklable_object_names_the_rank():
    def body(g):
        obj = threading.Lock() if g.rank == 1 else "fine"
        g.all_gather_object(obj, tag="exchange handles")

    errs = errors(LocalWorld(3, seed=0).run(body))
    for e in errs:
        assert isinstance(e, GroupError)
        assert "the object of rank 1 does not pickle" in str(e)
        assert "exchange handles" in str(e)


# ---- scheduling and determinism ---------------------------------------------------------

def _interleaving_program(seed):
    order: list[tuple[int, int]] = []

    def rank_fn(r):
        for i in range(4):
            order.append((r, i))
            yield_now()

    sched = Scheduler(seed)
    values(sched.run_ranks(4, rank_fn))
    return sched.trace_hash(), order


def test_same_seed_same_trace_and_order():
    assert _interleaving_program(7) == _interleaving_program(7)


def test_different_seeds_give_different_orders():
    runs = [_interleaving_program(s) for s in range(10)]
    assert len({h for h, _ in runs}) > 1
    assert len({tuple(o) for _, o in runs}) > 1


def test_world_trace_records_collectives_and_replays():
    def body(g):
        g.all_gather_object(g.rank, tag="a")
        g.barrier(tag="b")

    w1, w2 = LocalWorld(4, seed=9), LocalWorld(4, seed=9)
    w1.run(body)
    w2.run(body)
    assert w1.trace_hash() == w2.trace_hash()
    evs = w1.scheduler.events()
    gathers = [e for e in evs if e.kind == "all_gather_object"]
    assert sorted(e.rank for e in gathers) == [0, 1, 2, 3]
    assert {(e.group, e.seq, e.tag) for e in gathers} == {("world", 0, "a")}


def test_wait_until_flag_set_by_another_rank():
    flags = [0, 0, 0]  # stands in for device memory shared by the ranks

    def rank_fn(r):
        if r == 0:
            wait_until(lambda: flags[1] == 1 and flags[2] == 1, "flags 1,2 set")
            return "saw both"
        for _ in range(r * 3):
            yield_now()
        flags[r] = 1
        return "set"

    for seed in range(5):
        flags[:] = [0, 0, 0]
        assert values(Scheduler(seed).run_ranks(3, rank_fn)) == ["saw both", "set", "set"]


def test_module_functions_find_the_scheduler():
    seen = {}

    def rank_fn(r):
        seen[r] = (in_rank(), current_rank(), current_scheduler() is sched)
        wait_until(lambda: seen.setdefault(f"pred{r}", current_rank()) is not None, "noop")
        return r

    sched = Scheduler(0)
    values(sched.run_ranks(3, rank_fn))
    assert seen[1] == (True, 1, True)
    assert current_scheduler() is None and current_rank() is None and not in_rank()
    # Outside a rank: yield and sleep do nothing, a false wait cannot ever become true.
    yield_now()
    sleep(1.0)
    wait_until(lambda: True, "already true")
    with pytest.raises(HangDetected, match="outside a rank"):
        wait_until(lambda: False, "never")


def test_predicate_sees_its_own_rank():
    ranks_seen = []
    go = [False]

    def rank_fn(r):
        if r == 0:
            for _ in range(3):
                yield_now()
            go[0] = True
        else:
            wait_until(lambda: ranks_seen.append(current_rank()) or go[0], "go")

    values(Scheduler(4).run_ranks(2, rank_fn))
    assert set(ranks_seen) == {1}


def test_sleep_advances_virtual_time_only():
    def rank_fn(r):
        sleep(2.5 * (r + 1))
        return now()

    sched = Scheduler(0)
    assert values(sched.run_ranks(3, rank_fn)) == [2.5, 5.0, 7.5]
    assert sched.now == 7.5


def test_scheduler_runs_once_and_collectives_need_a_rank():
    sched = Scheduler(0)
    sched.run([lambda: None])
    with pytest.raises(GroupError, match="runs once"):
        sched.run([lambda: None])
    world = LocalWorld(2, seed=0)
    with pytest.raises(GroupError, match="outside a rank"):
        world.group(0).barrier()


def test_using_another_ranks_handle_is_an_error():
    world = LocalWorld(2, seed=0)

    def body(g):
        world.group(1 - g.rank).barrier()

    for e in errors(world.run(body)):
        assert isinstance(e, GroupError) and "each rank must use its own handle" in str(e)


# ---- hang modes ------------------------------------------------------------------------

def test_one_rank_skips_a_barrier():
    def body(g):
        if g.rank != 3:
            g.barrier(tag="sync")

    outs = LocalWorld(4, seed=1).run(body)
    assert outs[3].ok
    for o in outs[:3]:
        assert isinstance(o.error, HangDetected) and not isinstance(o.error, GroupTimeout)
        msg = str(o.error)
        assert msg.startswith("hang in group 'world' collective #0 barrier (tag 'sync'): "
                              "ranks 0-2 arrived; rank 3 did not — rank 3 finished")
        d = o.error.diagnosis
        assert d.arrived == (0, 1, 2) and d.missing == (3,)
        assert d.state_of(3).status == "finished"


def test_rank_raises_before_all_gather_peers_are_told():
    def body(g):
        if g.rank == 2:
            raise ValueError("boom")
        g.all_gather_object(g.rank, tag="ipc.init: exchange handles")

    outs = LocalWorld(4, seed=2).run(body)
    assert isinstance(outs[2].error, ValueError)
    for r in (0, 1, 3):
        e = outs[r].error
        assert isinstance(e, RankFailed)
        assert e.failed_rank == 2 and isinstance(e.cause, ValueError)
        assert "rank 2 failed with ValueError('boom')" in str(e)
        assert "collective #0 all_gather_object (tag 'ipc.init: exchange handles')" in str(e)


def test_mismatched_collective_kinds_at_same_seq():
    def body(g):
        if g.rank == 2:
            g.all_gather_object("x", tag="gather handles")
        else:
            g.barrier(tag="sync")

    outs = LocalWorld(4, seed=3).run(body)
    for o in outs:
        e = o.error
        assert isinstance(e, CollectiveMismatch)
        msg = str(e)
        assert msg.startswith("collective mismatch in group 'world' #0: ")
        assert "called barrier (tag 'sync')" in msg
        assert "rank 2 called all_gather_object (tag 'gather handles')" in msg
    # The last arrival sees every rank listed.
    full = max((str(o.error) for o in outs), key=len)
    assert "ranks 0,1,3 called barrier" in full


@pytest.mark.parametrize("call, expect", [
    (lambda g: g.broadcast_object(1, src=g.rank % 2), "broadcast_object(src=0)"),
    (lambda g: g.all_reduce_object(1, "sum" if g.rank else "max"), "all_reduce_object(op='max')"),
])
def test_mismatched_src_or_op(call, expect):
    for o in LocalWorld(2, seed=0).run(call):
        assert isinstance(o.error, CollectiveMismatch) and expect in str(o.error)


def test_subgroup_then_world_with_mismatched_sequences():
    def body(g):
        tp = [g.new_subgroup([0, 1], "tp0"), g.new_subgroup([2, 3], "tp1")]
        mine = tp[g.rank // 2]
        if g.rank == 1:  # skips the tp barrier and goes straight to the world
            g.barrier(tag="world sync")
            mine.barrier(tag="tp sync")
        else:
            mine.barrier(tag="tp sync")
            g.barrier(tag="world sync")

    outs = LocalWorld(4, seed=4).run(body)
    e0 = outs[0].error
    assert isinstance(e0, HangDetected)
    assert str(e0).startswith(
        "hang in group 'tp0' collective #0 barrier (tag 'tp sync'): rank 0 arrived; rank 1 "
        "did not — rank 1 is blocked in barrier (tag 'world sync') of group 'world' #2")
    e1 = outs[1].error
    assert str(e1).startswith(
        "hang in group 'world' collective #2 barrier (tag 'world sync'): ranks 1-3 arrived; "
        "rank 0 did not — rank 0 is blocked in barrier (tag 'tp sync') of group 'tp0' #0")


def test_wait_until_never_satisfied():
    def rank_fn(r):
        if r == 1:
            wait_until(lambda: False, "peer 0 signal flag == 1 (one-shot kernel)")

    outs = Scheduler(0).run_ranks(2, rank_fn)
    e = outs[1].error
    assert isinstance(e, HangDetected)
    assert str(e) == ("hang: rank 1 is waiting until 'peer 0 signal flag == 1 (one-shot "
                      "kernel)' — rank 0 finished")
    assert e.diagnosis.what == "peer 0 signal flag == 1 (one-shot kernel)"


def test_hang_diagnosis_names_a_waiting_rank():
    def body(g):
        if g.rank == 1:
            wait_until(lambda: False, "flag from rank 0")
        g.barrier(tag="after kernel")

    outs = LocalWorld(2, seed=0).run(body)
    assert ("rank 1 is waiting until 'flag from rank 0'") in str(outs[0].error)


def test_timeout_in_virtual_time():
    caught = {}

    def body(g):
        if g.rank == 2:
            sleep(100.0)  # far slower than the peers are willing to wait
        try:
            g.barrier(timeout=5.0, tag="init")
        except GroupTimeout as exc:
            caught[g.rank] = exc  # peers survive the timeout (they do not fail)
        return now()

    outs = LocalWorld(3, seed=5).run(body)
    assert [o.value for o in outs[:2]] == [5.0, 5.0]
    for r in (0, 1):
        e = caught[r]
        assert isinstance(e, GroupTimeout)
        assert str(e).startswith("timeout after 5 s of virtual time (t=5) in group 'world' "
                                 "collective #0 barrier (tag 'init'): ranks 0,1 arrived; "
                                 "rank 2 did not — rank 2 is sleeping until t=100")
    # The slow rank arrives at t=100 to a collective its peers abandoned.
    e2 = caught[2]
    assert isinstance(e2, GroupTimeout) and "abandoned" in str(e2) and "t=100" in str(e2)


def test_peer_dying_of_a_timeout_fails_the_late_rank():
    def body(g):
        if g.rank == 1:
            sleep(10.0)
        g.barrier(timeout=1.0, tag="init")

    outs = LocalWorld(2, seed=0).run(body)
    assert isinstance(outs[0].error, GroupTimeout)
    assert isinstance(outs[1].error, RankFailed)
    assert str(outs[1].error).startswith("rank 0 failed with GroupTimeout(")


def test_wait_until_timeout():
    def rank_fn(r):
        wait_until(lambda: False, "never", timeout=0.25)

    sched = Scheduler(0)
    e = sched.run_ranks(1, rank_fn)[0].error
    assert isinstance(e, GroupTimeout) and "waiting until 'never'" in str(e)
    assert sched.now == 0.25


def test_wait_until_satisfied_by_a_sleeper_before_its_timeout():
    flag = [False]

    def rank_fn(r):
        if r == 0:
            sleep(1.0)
            flag[0] = True
        else:
            wait_until(lambda: flag[0], "flag", timeout=1.0)  # same instant: sleeper first
            return "ok"

    assert values(Scheduler(0).run_ranks(2, rank_fn)) == [None, "ok"]


def test_cleanup_in_finally_runs_a_barrier_among_survivors_after_hang():
    cleaned = []

    def body(g):
        survivors = g.new_subgroup([0, 1, 2], "survivors")
        try:
            if g.rank == 3:
                wait_until(lambda: False, "a flag nobody sets")
            else:
                g.barrier(tag="step")
        finally:
            if survivors is not None:
                survivors.barrier(tag="close")
                cleaned.append(g.rank)

    outs = LocalWorld(4, seed=6).run(body)
    assert sorted(cleaned) == [0, 1, 2]
    for o in outs[:3]:
        assert isinstance(o.error, HangDetected)
        assert "rank 3 is waiting until 'a flag nobody sets'" in str(o.error)
    assert isinstance(outs[3].error, HangDetected)


def test_cleanup_collective_that_hangs_again_is_diagnosed_again():
    def body(g):
        try:
            if g.rank != 0:
                g.barrier(tag="step")
        finally:
            if g.rank != 0:
                g.barrier(tag="close")  # rank 0 is gone: hangs a second time

    outs = LocalWorld(3, seed=0).run(body)
    for o in outs[1:]:
        assert isinstance(o.error, HangDetected)
        assert "barrier (tag 'close')" in str(o.error) and "rank 0 finished" in str(o.error)
        # the first hang is still visible as the exception's context
        assert "tag 'step'" in str(o.error.__context__)


def test_cleanup_after_failure_sees_rank_failed_at_once():
    def body(g):
        try:
            if g.rank == 0:
                raise RuntimeError("driver error")
            g.barrier(tag="step")
        finally:
            if g.rank != 0:
                g.barrier(tag="close")

    outs = LocalWorld(3, seed=0).run(body)
    for o in outs[1:]:
        assert isinstance(o.error, RankFailed)
        assert "rank 0 failed with RuntimeError('driver error')" in str(o.error)
        assert "barrier (tag 'close')" in str(o.error)


def test_ranks_that_keep_retrying_terminate_after_max_hang_rounds():
    def body(g):
        if g.rank == 0:
            return
        while True:  # swallows every hang and tries again, forever
            try:
                g.barrier(tag="retry")
            except HangDetected:
                pass

    world = LocalWorld(2, seed=0, max_hang_rounds=3)
    outs = world.run(body)
    e = outs[1].error
    assert isinstance(e, HangDetected) and "abandoned" in str(e)
    assert "exceeds max_hang_rounds=3" in str(e)


def test_max_steps_livelock_guard():
    def rank_fn(r):
        while True:  # spins on a condition that never holds, without wait_until
            yield_now()

    sched = Scheduler(0, max_steps=500)
    outs = sched.run_ranks(3, rank_fn)
    for o in outs:
        assert isinstance(o.error, HangDetected)
        assert str(o.error).startswith("livelock: ")
        assert "max_steps=500" in str(o.error)


def test_livelock_with_a_rank_that_swallows_errors_is_abandoned():
    def rank_fn(r):
        while True:
            try:
                yield_now()
            except HangDetected:
                pass

    outs = Scheduler(0, max_steps=100).run_ranks(2, rank_fn)
    for o in outs:
        assert isinstance(o.error, HangDetected) and "abandoned" in str(o.error)


def test_predicate_error_surfaces_in_the_waiter():
    def rank_fn(r):
        if r == 0:
            yield_now()
            return
        state = {"n": 0}

        def pred():
            state["n"] += 1
            if state["n"] > 1:
                raise KeyError("flag")
            return False

        wait_until(pred, "flag")

    outs = Scheduler(0).run_ranks(2, rank_fn)
    assert isinstance(outs[1].error, KeyError)


def test_blocking_inside_a_predicate_is_refused():
    calls = []

    def pred():
        calls.append(1)
        if len(calls) > 1:  # later checks run on the scheduler's behalf, not in the rank
            yield_now()
        return False

    def rank_fn(r):
        if r == 0:
            wait_until(pred, "bad predicate")
        else:
            for _ in range(3):
                yield_now()

    outs = Scheduler(1).run_ranks(2, rank_fn)
    assert isinstance(outs[0].error, GroupError)
    assert "inside a wait_until predicate" in str(outs[0].error)


def test_large_world_hang_message_stays_short():
    def body(g):
        if g.rank != 71:
            g.all_gather_object(g.rank, tag="ipc.register: exchange graph handles")

    outs = LocalWorld(72, seed=0).run(body)
    msg = str(outs[0].error)
    assert msg.startswith("hang in group 'world' collective #0 all_gather_object (tag "
                          "'ipc.register: exchange graph handles'): ranks 0-70 arrived; "
                          "rank 71 did not — rank 71 finished")
    assert len(msg) < 400
