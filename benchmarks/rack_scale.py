"""Rack scale on a laptop: every target of issue 19, printed as a figure or a ratio from one
run (prints; never asserts a speed).

    .venv/bin/python benchmarks/rack_scale.py [--sweep-count N] [--skip-576] [--limit-mb MB]
                                              [--only rack|ar256|ladder|sweep|datapath ...]

1. The shipped full-rack scenario (scenarios/topologies/gb200-nvl72.toml): wall and peak RSS
   (target <= 2 s, <= 600 MB).
2. A 72-rank 256 MiB bfloat16 all-reduce: peak RSS (target <= 3 GB).
3. The scale ladder, 8 / 72 / 144 / 576 ranks (commsim/topology/scale.py), each: init, three
   checked all-reduces (4, 16 and 64 KiB bfloat16), graph capture, close: wall, peak RSS,
   the memory estimate of `scenario check` and host bytes per simulated byte touched
   (target for 576: <= 30 s).
4. Sweep, default mix, 2 worker processes: scenarios/s (target >= 500/s).
5. Data path, 8 ranks float32 1-64 MiB: the kernels' reduction against numpy doing the same
   8-way sum of the same bytes (target >= 0.8), and the whole all-reduce (staging, both
   kernel phases, copy-out) against that sum.

Wall and CPU seconds are both printed: on the shared 2-core machine the two differ when other
work competes for the cores. Every scenario runs in a child process of its own, so its peak RSS is its own (os.wait4);
a child whose RSS passes --limit-mb is killed and reported, never allowed to swap the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20
SECTIONS = ("rack", "ar256", "ladder", "sweep", "datapath")


# -- children -------------------------------------------------------------------------------------
def _ladder_scenario(n: int):
    from commsim.scenario.model import Group, Scenario, Workload
    from commsim.topology.scale import ladder_cluster
    c = ladder_cluster(n)
    refs = tuple(c.gpu_refs())
    return Scenario(name=f"ladder-{n}", cluster=c, placement=refs,
                    groups=(Group("world", tuple(range(n))),),
                    workload=Workload(ops=("all_reduce",), sizes=(4096, 16384, 65536),
                                      dtypes=("bfloat16",), graph_capture=True))


def _ar256_scenario():
    from commsim.scenario.model import Group, Scenario, Workload
    from commsim.topology import build_preset
    c = build_preset("gb200-nvl72")
    refs = tuple(c.gpu_refs())
    return Scenario(name="ar256", cluster=c, placement=refs, groups=(Group("world", tuple(range(72))),),
                    workload=Workload(ops=("all_reduce",), sizes=(256 * MiB,), dtypes=("bfloat16",)))


def child(kind: str, arg: str) -> None:
    import resource

    from commsim.scenario import runner
    from commsim.scenario.memory_estimate import estimate_host_bytes
    from commsim.sim import fabric as F

    if kind == "file":
        from commsim.scenario.schema import load
        sc = load(arg)
    elif kind == "ladder":
        sc = _ladder_scenario(int(arg))
    else:
        sc = _ar256_scenario()
    providers = []
    orig = F.MemoryProvider.__init__

    def init(self):   # note every provider, to read what its allocations touched
        orig(self)
        providers.append(self)

    F.MemoryProvider.__init__ = init
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t, c = time.perf_counter(), time.process_time()
    res = runner.run_scenario(sc)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    print(json.dumps({"ok": res.ok, "failures": res.failures[:2], "wall": wall, "cpu": cpu,
                      "backends": sorted(set(res.backends.values())), "rss_before": before,
                      "touched": sum(p.touched for p in providers),
                      "estimate": estimate_host_bytes(sc).total}))


def run_child(kind: str, arg: str, limit_mb: int) -> dict:
    """The child's JSON line plus its own peak RSS; killed past `limit_mb` of RSS."""
    p = subprocess.Popen([sys.executable, __file__, "--child", kind, arg], stdout=subprocess.PIPE,
                         text=True, cwd=ROOT)
    killed = False
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        try:
            with open(f"/proc/{p.pid}/status") as f:
                rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))
        except (OSError, StopIteration):
            rss = 0
        if rss > limit_mb * 1024:
            p.kill()
            killed = True
        time.sleep(0.05)
    out = p.stdout.read() if p.stdout else ""
    p.returncode = os.waitstatus_to_exitcode(status)
    try:
        d = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        d = {"ok": False, "failures": [f"child exited {p.returncode}"
                                       + (f": killed past {limit_mb} MB RSS" if killed else "")]}
    d["peak_rss"] = ru.ru_maxrss * 1024
    return d


def _mb(b: float) -> str:
    return f"{b / 1e6:7.0f} MB"


def _line(label: str, d: dict) -> str:
    if not d.get("ok"):
        return f"{label}: FAILED {d.get('failures')}"
    grown = max(d["peak_rss"] - d["rss_before"], 0)
    per = f"{grown / d['touched']:.2f}" if d.get("touched") else "n/a"
    return (f"{label}: {d['wall']:6.2f} s wall ({d['cpu']:.2f} s CPU), peak RSS {_mb(d['peak_rss'])}, estimate "
            f"{_mb(d['estimate'])}, simulated bytes touched {_mb(d['touched'])}, host bytes per "
            f"touched byte {per} ({', '.join(d['backends'])})")


# -- in-process figures ---------------------------------------------------------------------------
def sweep_rate(count: int) -> None:
    """Wall rate with 2 worker processes, and the CPU cost per scenario in this process (the
    rate two quiet cores would give is 2 / that cost; the wall rate shows the contention)."""
    from commsim.scenario.sweep import run_sweep, select_ids
    ids = select_ids(count, seed=0)
    run_sweep(ids[:10], jobs=1)
    t = time.perf_counter()
    rep = run_sweep(ids, jobs=2)
    dt = time.perf_counter() - t
    sub = ids[: max(count // 4, 1)]
    c = time.process_time()
    run_sweep(sub, jobs=1)
    per = (time.process_time() - c) / len(sub)
    print(f"sweep, default mix, 2 jobs, {count} scenarios: {count / dt:6.1f} scenarios/s wall "
          f"({len(rep.failed)} failed); {per * 1e3:.1f} ms CPU per scenario in process, so "
          f"{2 / per:.0f}/s on 2 quiet cores; target >= 500/s")


def datapath(reps: int = 3, order: tuple[str, ...] = ("ipc", "nccl")) -> None:
    """8 ranks on HGX, float32, 1-64 MiB, under the backend order `order`: the kernels' sum
    (time inside the reduction) and the whole all-reduce, each against numpy's 8-way sum."""
    import numpy as np
    import torch

    from commsim.communicator import Communicator
    from commsim.group import LocalWorld
    from commsim.policy import Policy
    from commsim.sim import SimFabric, spawn_driver
    from commsim.kernels import collectives as K
    from commsim.topology import build_preset

    spent = [0.0, 0]
    inner = K._reduce

    def timed_reduce(srcs, dtype, out=None):
        t = time.perf_counter()
        res = inner(srcs, dtype, out)
        spent[0] += time.perf_counter() - t
        spent[1] += sum(s.nbytes for s in srcs)
        return res

    K._reduce = timed_reduce
    print(f"{'size':>6} {'alg':>18} {'kernel sum GB/s':>16} {'all-reduce GB/s':>16} "
          f"{'numpy GB/s':>11} {'kernel/numpy':>13} {'all-reduce/numpy':>17}")
    try:
        for mb in (1, 4, 16, 64):
            size = mb * MiB
            c = build_preset("hgx-h100-8")
            fabric = SimFabric(c)
            drivers = [spawn_driver(fabric, g) for g in c.gpu_refs()]
            pol = Policy(order=order, params={"max_size": 128 * MiB, "multicast_max_size": 128 * MiB,
                                              "symm_max_size": 128 * MiB})
            times, names = [], []

            def rank(g):
                comm = Communicator(g, drivers[g.rank], pol)
                x = torch.ones(size // 4, dtype=torch.float32)
                comm.all_reduce(x)
                g.barrier()
                if g.rank == 0:
                    spent[:] = [0.0, 0]
                t = time.perf_counter()
                for _ in range(reps):
                    comm.all_reduce(x)
                g.barrier()
                if g.rank == 0:
                    times.append((time.perf_counter() - t) / reps)
                    ch = next(iter(comm.choices.values()))
                    names.append(f"{ch.backend}/{ch.algorithm}")
                comm.close()

            LocalWorld(8, 0).run(rank)
            kern = spent[1] / spent[0] / 1e9
            whole = 8 * size / times[0] / 1e9
            bufs = [np.ones(size // 4, np.float32) for _ in range(8)]
            t = time.perf_counter()
            for _ in range(reps):
                acc = bufs[0].copy()
                for b in bufs[1:]:
                    acc += b
            ref = 8 * size / ((time.perf_counter() - t) / reps) / 1e9
            print(f"{mb:>4}Mi {names[0]:>18} {kern:16.2f} {whole:16.2f} {ref:11.2f} "
                  f"{kern / ref:13.2f} {whole / ref:17.2f}")
    finally:
        K._reduce = inner


def ladder(skip_576: bool, limit_mb: int) -> None:
    print("\nscale ladder (init, 3 checked all-reduces, capture, close); target for 576: <= 30 s:")
    print("| ranks | wall (s) | CPU (s) | peak RSS (MB) | estimate (MB) | backends |")
    print("| ---: | ---: | ---: | ---: | ---: | --- |")
    for n in (8, 72, 144) + (() if skip_576 else (576,)):
        d = run_child("ladder", str(n), limit_mb)
        if d.get("ok"):
            print(f"| {n} | {d['wall']:.2f} | {d['cpu']:.2f} | {d['peak_rss'] / 1e6:.0f} | {d['estimate'] / 1e6:.0f} | "
                  f"{', '.join(d['backends'])} |")
        else:
            print(f"| {n} | failed: {d.get('failures')} | | | | |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--sweep-count", type=int, default=1000, help="scenarios for the sweep rate (default 1000)")
    ap.add_argument("--skip-576", action="store_true", help="leave out the 576-rank rung")
    ap.add_argument("--limit-mb", type=int, default=6000, help="kill a child past this RSS (default 6000)")
    ap.add_argument("--only", action="append", choices=SECTIONS, metavar="SECTION",
                    help=f"run only this section ({', '.join(SECTIONS)}); repeat for several")
    a = ap.parse_args()
    if a.child:
        child(*a.child)
        return
    run = set(a.only or SECTIONS)
    print(f"CPUs: {os.cpu_count()}")
    if "rack" in run:
        rack = run_child("file", os.path.join(ROOT, "scenarios/topologies/gb200-nvl72.toml"), a.limit_mb)
        print(_line("full rack (gb200-nvl72.toml)", rack) + "; target <= 2 s, <= 600 MB")
    if "ar256" in run:
        ar = run_child("ar256", "-", a.limit_mb)
        print(_line("72-rank 256 MiB all-reduce", ar) + "; target <= 3 GB")
    if "ladder" in run:
        ladder(a.skip_576, a.limit_mb)
    if "sweep" in run:
        print()
        sweep_rate(a.sweep_count)
    if "datapath" in run:
        print()
        datapath()


if __name__ == "__main__":
    main()
