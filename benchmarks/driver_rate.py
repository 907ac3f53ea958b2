"""Rate of the simulated driver's hot paths: IPC open/close pairs and device-to-device memcpy.

Usage: .venv/bin/python benchmarks/driver_rate.py [--pairs N] [--mib M] [--reps R]
Prints figures only (no assertions): machines are shared and noisy, so compare within a run.

- IPC: one process opens and closes a peer's cudaMalloc handle (same GB200 tray), N times.
- memcpy: cudaMemcpy DeviceToDevice of M MiB inside one process, against numpy.copyto on the
  very same bytes (the simulator's backing arrays); GB/s counts read + write bytes, as numpy's
  own benchmarks do. Target: the simulated copy reaches >= 50 % of numpy.copyto.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from commsim.driver import LAZY_ENABLE_PEER_ACCESS, check
from commsim.sim import SimFabric, set_torch_threads, spawn_driver
from commsim.topology.model import GpuRef
from commsim.topology.presets import build

DTOD = 3  # cudaMemcpyDeviceToDevice


def _best(fn, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def ipc_pairs_per_second(pairs: int, reps: int) -> float:
    c = build("gb200-nvl72:1")
    fabric = SimFabric(c)
    host = c.hosts[0].name
    exp, imp = spawn_driver(fabric, GpuRef(host, 0)), spawn_driver(fabric, GpuRef(host, 1))
    p = check("cudaMalloc", exp.cudaMalloc(1 << 20))
    h = check("cudaIpcGetMemHandle", exp.cudaIpcGetMemHandle(p))
    flags = int(LAZY_ENABLE_PEER_ACCESS)
    open_, close = imp.cudaIpcOpenMemHandle, imp.cudaIpcCloseMemHandle

    def loop():
        for _ in range(pairs):
            _, q = open_(h, flags)
            close(q)

    t = _best(loop, reps)
    assert not imp.ledger.summary()
    check("cudaFree", exp.cudaFree(p))
    return pairs / t


def memcpy_rates(mib: int, iters: int, reps: int) -> tuple[float, float]:
    c = build("hgx-h100-8")
    d = spawn_driver(SimFabric(c), GpuRef(c.hosts[0].name, 0))
    n = mib << 20
    src = check("cudaMalloc", d.cudaMalloc(n))
    dst = check("cudaMalloc", d.cudaMalloc(n))
    check("cudaMemset", d.cudaMemset(src, 0x5A, n))   # commit the pages of both buffers
    check("cudaMemset", d.cudaMemset(dst, 0, n))
    a_src, a_dst = d.view(src, n), d.view(dst, n)      # the same bytes, for numpy

    def sim():
        for _ in range(iters):
            d.cudaMemcpy(dst, src, n, DTOD)

    def ref():
        for _ in range(iters):
            np.copyto(a_dst, a_src)

    # interleave the two, so drift in the machine's load hits both alike
    t_sim, t_np = float("inf"), float("inf")
    for _ in range(reps):
        t_sim = min(t_sim, _best(sim, 1))
        t_np = min(t_np, _best(ref, 1))
    assert d.memcpy_dtoh(dst, 16)[1].tolist() == [0x5A] * 16
    moved = 2 * n * iters                              # read + write
    return moved / t_sim / 1e9, moved / t_np / 1e9


def main() -> None:
    set_torch_threads()   # as a run does (commsim.sim.set_torch_threads)
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=20_000)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    rate = ipc_pairs_per_second(args.pairs, args.reps)
    print(f"IPC open/close pairs per second: {rate:,.0f} ({1e6 / rate:.1f} us per pair)")
    sim, ref = memcpy_rates(args.mib, args.iters, args.reps)
    print(f"cudaMemcpy D2D {args.mib} MiB (read+write): {sim:.2f} GB/s simulated, "
          f"{ref:.2f} GB/s numpy.copyto, ratio {100 * sim / ref:.0f} % (target >= 50 %)")


if __name__ == "__main__":
    main()
