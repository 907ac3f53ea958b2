"""Cost of hosting: start-up per rank and one handle-exchange round, in both modes.

Usage: .venv/bin/python benchmarks/hosting_rate.py [--ranks N] [--rounds R]

- start-up: a hosted run of a program that only joins and leaves the process group
  (init_process_group / destroy_process_group), per rank; the baseline in procs mode is the
  same number of plain interpreters importing torch.distributed (what any rank pays), in
  inproc mode a LocalWorld barrier run of commsim's own group layer.
- handle exchange: one round of the FlashInfer-style set-up through the hosted surfaces
  (cudaMalloc, cudaIpcGetMemHandle over ctypes, torch.distributed.all_gather_object, open
  every peer, close, barrier, cudaFree), timed inside the program; the baseline is the same
  round written against commsim's core directly (LocalGroup + SimDriver, no hosting).
Figures only, as ratios within this run: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time

from commsim.launch.config import RunConfig
from commsim.launch.run import execute

HERE = os.path.dirname(os.path.abspath(__file__))

JOIN = """
import torch.distributed as dist
dist.init_process_group("gloo")
dist.destroy_process_group()
"""

ROUND = """
import ctypes, json, sys, time
import torch.distributed as dist
class H(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]
dist.init_process_group("gloo")
with open("/proc/self/maps") as f:
    lib = ctypes.CDLL(next(l.split()[-1] for l in f if "libcudart" in l))
rank, world = dist.get_rank(), dist.get_world_size()
lib.cudaSetDevice(rank % 4)
rounds = int(sys.argv[1])
dist.barrier()
t0 = time.perf_counter()
for _ in range(rounds):
    p, h = ctypes.c_void_p(), H()
    assert lib.cudaMalloc(ctypes.byref(p), 1 << 16) == 0
    assert lib.cudaIpcGetMemHandle(ctypes.byref(h), p) == 0
    hs = [None] * world
    dist.all_gather_object(hs, bytes(h))
    opened = []
    for r, b in enumerate(hs):
        if r != rank:
            q = ctypes.c_void_p()
            assert lib.cudaIpcOpenMemHandle(ctypes.byref(q), H.from_buffer_copy(b), 1) == 0
            opened.append(q)
    for q in opened:
        assert lib.cudaIpcCloseMemHandle(q) == 0
    dist.barrier()
    assert lib.cudaFree(p) == 0
print("RESULT " + json.dumps({"rank": rank, "s": (time.perf_counter() - t0) / rounds}))
dist.destroy_process_group()
"""


def _hosted(src: str, mode: str, ranks: int, *args: str) -> tuple[float, str]:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(src)
    try:
        out = io.StringIO()
        cfg = RunConfig(machine="gb200-nvl72:1", nproc_per_host=ranks, mode=mode,
                        command=[f.name, *args])
        t0 = time.perf_counter()
        v = execute(cfg, out=out, err=out)
        wall = time.perf_counter() - t0
        if not v.ok:
            raise SystemExit(v.format() + out.getvalue())
        return wall, out.getvalue()
    finally:
        os.unlink(f.name)


def _plain_interpreters(n: int) -> float:
    t0 = time.perf_counter()
    ps = [subprocess.Popen([sys.executable, "-c", "import torch.distributed"]) for _ in range(n)]
    for p in ps:
        p.wait()
    return time.perf_counter() - t0


def _core_startup(n: int) -> float:
    from commsim.group.local import LocalWorld
    t0 = time.perf_counter()
    LocalWorld(n, seed=0).run(lambda g: g.barrier(tag="join"))
    return time.perf_counter() - t0


def _core_round(n: int, rounds: int) -> float:
    """The same round against commsim's core: LocalGroup + SimDriver, no hosting."""
    from cuda.bindings import runtime as rt

    from commsim.group.local import LocalWorld
    from commsim.sim import SimFabric, spawn_driver
    from commsim.topology.presets import build
    cluster = build("gb200-nvl72:1")
    fabric = SimFabric(cluster, 0)
    gpus = list(cluster.gpu_refs())
    drivers = [spawn_driver(fabric, gpus[r]) for r in range(n)]
    times = []

    def body(g):
        d = drivers[g.rank]
        g.barrier(tag="start")
        t0 = time.perf_counter()
        for _ in range(rounds):
            _, p = d.cudaMalloc(1 << 16)
            _, h = d.cudaIpcGetMemHandle(p)
            hs = g.all_gather_object(h, tag="handles")
            opened = [d.cudaIpcOpenMemHandle(b, rt.cudaIpcMemLazyEnablePeerAccess)[1]
                      for r, b in enumerate(hs) if r != g.rank]
            for q in opened:
                d.cudaIpcCloseMemHandle(q)
            g.barrier(tag="done")
            d.cudaFree(p)
        times.append((time.perf_counter() - t0) / rounds)

    for o in LocalWorld(n, seed=0).run(body):
        o.unwrap()
    return max(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=50)
    args = ap.parse_args()
    n = args.ranks
    print(f"hosting_rate: {n} ranks on gb200-nvl72:1")
    for mode in ("inproc", "procs"):
        wall, _ = _hosted(JOIN, mode, n)
        base = _core_startup(n) if mode == "inproc" else _plain_interpreters(n)
        what = "LocalWorld barrier run" if mode == "inproc" else "plain interpreters importing torch.distributed"
        print(f"  start-up {mode:6}: {wall / n * 1e3:8.1f} ms per rank "
              f"({wall / base:6.1f}x the {what}: {base / n * 1e3:.1f} ms per rank)")
    core = _core_round(n, args.rounds)
    for mode in ("inproc", "procs"):
        _, out = _hosted(ROUND, mode, n, str(args.rounds))
        per = max(json.loads(line.split("RESULT ", 1)[1])["s"] for line in out.splitlines()
                  if "RESULT " in line)
        print(f"  handle exchange round {mode:6}: {per * 1e3:8.3f} ms "
              f"({per / core:6.1f}x commsim's core without hosting: {core * 1e3:.3f} ms)")


if __name__ == "__main__":
    main()
