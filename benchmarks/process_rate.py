"""Process mode against thread mode (prints figures; no assertions).

    .venv/bin/python benchmarks/process_rate.py [--rounds N]

1. Start-up of 8 ranks until every rank has joined the world: thread mode (fabric, drivers,
   greenlet world, one barrier) vs process mode (store, 8 processes forked from the
   forkserver, rendezvous), the first process-mode start (the forkserver imports torch) apart.
2. TP 8 all-reduce rounds per second on one HGX host, 4 KiB bfloat16, ipc one-shot (kernel
   flags spin over shared memory in process mode) and nccl (objects through the store).
3. A whole scenario (hgx-h100-8.toml) end to end in both modes.
Compare figures as ratios within one run: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
from pathlib import Path

import torch

from commsim.communicator import Communicator
from commsim.group import LocalWorld
from commsim.policy import Policy
from commsim.sim import SimFabric, shm, set_torch_threads, spawn_driver
from commsim.topology import build_preset

ROOT = Path(__file__).resolve().parents[1]
N = 8


def _rounds(wg, driver, backend: str, rounds: int) -> float:
    """Rounds/s of `rounds` 4 KiB all-reduces after a warm-up; measured by rank 0."""
    comm = Communicator(wg, driver, Policy(order=(backend,)))
    x = torch.ones(2048, dtype=torch.bfloat16)
    for _ in range(5):
        comm.all_reduce(x)
    wg.barrier()
    t = time.perf_counter()
    for _ in range(rounds):
        y = comm.all_reduce(x)
    wg.barrier()
    dt = time.perf_counter() - t
    assert float(y[0]) == N and comm.chosen("all_reduce", 4096) == backend, comm.explain()
    comm.close()
    return rounds / dt


def thread_mode(backend: str, rounds: int) -> tuple[float, float]:
    t = time.perf_counter()
    cluster = build_preset("hgx-h100-8")
    fabric = SimFabric(cluster, seed=0)
    drivers = [spawn_driver(fabric, g) for g in cluster.gpu_refs()]
    world = LocalWorld(N, seed=0)
    started: list[float] = []

    def rank(wg):
        wg.barrier()
        if wg.rank == 0:
            started.append(time.perf_counter() - t)
        return _rounds(wg, drivers[wg.rank], backend, rounds)

    out = world.run(rank)
    return started[0], out[0].unwrap()


def _proc_rank(rank: int, port: int, prefix: str, secret: bytes, backend: str, rounds: int,
               t0: float) -> None:
    from commsim.group.torch_dist import ProcessWorld, connect_store
    from commsim.sim.process_fabric import ProcessFabric

    store = connect_store("127.0.0.1", port, 60)
    world = ProcessWorld(store, rank, N, secret=secret, timeout=60, shm_prefix=prefix)
    world.install_waiter()
    wg = world.join()
    joined = time.time() - t0
    cluster = build_preset("hgx-h100-8")
    refs = tuple(cluster.gpu_refs())
    fabric = ProcessFabric(cluster, 0, rank, refs, prefix, mailbox=world)
    rate = _rounds(wg, spawn_driver(fabric, refs[rank]), backend, rounds)
    fabric.exit_process(fabric._next_pid - 1)
    store.set(f"bench/{rank}", world.seal.dumps(f"bench/{rank}", (joined, rate)))
    world.finish()


def process_mode(ctx, backend: str, rounds: int) -> tuple[float, float]:
    from commsim.group.seal import Seal, new_secret
    from commsim.group.torch_dist import host_store
    store = host_store(300)
    prefix = shm.new_prefix()
    secret = new_secret()
    t0 = time.time()
    ps = [ctx.Process(target=_proc_rank, args=(r, store.port, prefix, secret, backend, rounds, t0))
          for r in range(N)]
    try:
        for p in ps:
            p.start()
        for p in ps:
            p.join(300)
        results = [Seal(secret).loads(f"bench/{r}", store.get(f"bench/{r}")) for r in range(N)]
    finally:
        for p in ps:
            if p.exitcode is None:
                p.kill()
        shm.sweep(prefix)
    return max(j for j, _ in results), results[0][1]


def main() -> None:
    set_torch_threads()   # as a run does (commsim.sim.set_torch_threads)
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=300)
    args = ap.parse_args()
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["commsim.procs.worker"])
    print(f"{N} ranks on {os.cpu_count()} cores; {args.rounds} rounds of a 4 KiB bf16 all-reduce")
    t = time.perf_counter()
    process_mode(ctx, "nccl", 5)
    print(f"process mode, first start (forkserver imports torch): {time.perf_counter() - t:6.2f} s "
          f"for a whole 5-round run")
    for backend in ("ipc", "nccl"):
        ts, tr = thread_mode(backend, args.rounds)
        ps, pr = process_mode(ctx, backend, args.rounds)
        print(f"{backend:>5}: start-up threads {ts * 1e3:8.1f} ms, processes {ps * 1e3:8.1f} ms "
              f"({ps / ts:5.0f}x); rounds/s threads {tr:6.0f}, processes {pr:6.0f} "
              f"(processes/threads {pr / tr:4.2f})")
    from commsim.procs.launcher import run_scenario_procs
    from commsim.scenario.runner import run_scenario
    from commsim.scenario.schema import load
    sc = load(ROOT / "scenarios/topologies/hgx-h100-8.toml")
    for label, fn in (("threads", lambda: run_scenario(sc)),
                      ("processes", lambda: run_scenario_procs(sc))):
        t = time.perf_counter()
        fn()
        print(f"scenario hgx-h100-8-tp8 ({label}): {time.perf_counter() - t:6.2f} s")


if __name__ == "__main__":
    main()
