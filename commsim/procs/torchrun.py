"""Process mode under torchrun: `torchrun --nproc-per-node=N -m commsim.procs.torchrun SCENARIO`.

torchrun starts the ranks and the rendezvous (MASTER_ADDR/PORT, RANK, WORLD_SIZE); each rank
initialises the gloo default process group, takes the run's store from it, and runs its rank
of the scenario exactly as under `commsim run --procs`. Rank 0 gathers every rank's report,
prints the verdict and exits 1 when the scenario fails. N must equal the scenario's world size.

Without commsim's launcher nobody watches the processes: a rank that raises marks itself dead
(its peers fail at once, naming it), but one killed outright is found only at the timeout.
On exit, also on SIGTERM from torchrun after a peer failed, each rank unlinks the run's
shared-memory segments.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time

from commsim.group.seal import ForgedValue
from commsim.group.torch_dist import ProcessWorld
from commsim.scenario.runner import prepare
from commsim.scenario.schema import load
from commsim.sim import set_torch_threads, shm
from commsim.procs import worker


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)   # unwinds through the finally that sweeps shared memory


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="commsim.procs.torchrun", description=__doc__.split("\n")[0])
    ap.add_argument("scenario", help="scenario .toml file")
    ap.add_argument("--policy", default=None, help="override the scenario's policy")
    ap.add_argument("--seed", type=int, default=None, help="override the scenario's seed")
    ap.add_argument("--timeout", type=float, default=60.0,
                    help="seconds any one wait may take (default 60)")
    args = ap.parse_args(argv)
    set_torch_threads()
    signal.signal(signal.SIGTERM, _terminate)
    sc = load(args.scenario)
    world = ProcessWorld.from_env(timeout=args.timeout)
    if world.run_dir is None:
        # COMMSIM_RUN_SECRET was given: the device memory still needs this host's run directory.
        if world.rank == 0:
            world.run_dir = shm.new_prefix()
            world.store.set("prefix", world.run_dir)
        else:
            world.run_dir = world.store.get("prefix").decode(errors="replace")
            shm.check_run_dir(world.run_dir)
    prefix = world.shm_prefix = world.run_dir
    if world.size != sc.world_size:
        print(f"commsim.procs.torchrun: {args.scenario} has {sc.world_size} ranks but torchrun "
              f"started {world.size}; use --nproc-per-node={sc.world_size}", file=sys.stderr)
        shm.sweep(prefix)
        return 2
    clean_exit = False
    try:
        job = worker.Job(sc, world.rank, args.policy, args.seed, prefix, "", 0, args.timeout)
        report = worker.run_job(job, world)
        world.store.set(f"result/{world.rank}", world.seal.dumps(f"result/{world.rank}", report))
        world.finish()
        clean_exit = True
        return _report(sc, args, world) if world.rank == 0 else 0
    finally:
        # Rank 0 sweeps once every report is in; any rank sweeps when it is torn down early
        # (a peer may be gone, and nobody else may be left to do it).
        if world.rank == 0 or not clean_exit:
            shm.sweep(prefix)


def _report(sc, args, world: ProcessWorld) -> int:
    """Rank 0: every rank's report (or why there is none), the verdict, the exit status."""
    _, _, res = prepare(sc, args.policy, args.seed)
    deadline = time.monotonic() + args.timeout
    reports = []
    for r in range(world.size):
        key = f"result/{r}"
        while not world.store.check([key]) and time.monotonic() < deadline and r not in world.dead():
            time.sleep(0.05)
        try:
            reports.append(world.seal.loads(key, world.store.get(key))
                           if world.store.check([key]) else None)
        except ForgedValue:
            reports.append(None)
    worker.gather(res, reports, lambda r: "sent no report")
    print(f"{sc.name}: {'ok' if res.ok else 'FAIL'} ({world.size} processes under torchrun, "
          f"shared-memory prefix {world.shm_prefix})")
    for k, b in sorted(res.backends.items()):
        print(f"  group {k[0]} {k[1]} {k[2]} B {k[3]}: {b}")
    for f in res.failures:
        print(f"  FAIL: {f}")
    return 0 if res.ok else 1


if __name__ == "__main__":
    sys.exit(main())
