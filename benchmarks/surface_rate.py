"""Cost of the hosted module surfaces per call, against the rank's SimDriver called directly.

Usage: .venv/bin/python benchmarks/surface_rate.py [--calls N] [--reps R]
Prints figures only (no assertions): machines are shared and noisy, so compare within a run.

Each row is one round trip a hosted program makes, timed as the best of R runs of N calls,
and its ratio to the same work on the SimDriver (the baseline, in the same process):
- cudaMalloc + cudaFree of 4 KiB through `cuda.bindings.runtime` (the stand-in module);
- the same through ctypes libcudart (a wrapper with restype/argtypes and byref);
- cudaDeviceCanAccessPeer through both;
- pynvml nvmlDeviceGetHandleByIndex + nvmlDeviceGetNvLinkState (no SimDriver twin: absolute).
"""

from __future__ import annotations

import argparse
import ctypes
import time

from commsim.hosting.surfaces.cuda import bindings as cuda_bindings
from commsim.hosting.surfaces.cuda import cudart
from commsim.hosting.surfaces import nvml
from commsim.hosting.state import session
from commsim.sim import SimFabric, spawn_driver
from commsim.topology.model import GpuRef
from commsim.topology.presets import build


def _best(fn, calls: int, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, time.perf_counter() - t0)
    return best / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    for m in (cuda_bindings, cudart, nvml):
        m.install()
    c = build("hgx-h100-8")
    fabric = SimFabric(c)
    d = spawn_driver(fabric, GpuRef(c.hosts[0].name, 0))
    rank = session.HostedRank(0, 1, 0, 1, c.hosts[0].name, d, c, d.proc.gpus, "")
    with session.bound(rank):
        from cuda.bindings import runtime as rt
        import pynvml
        path = cudart.mapped_path()
        lib = ctypes.CDLL(path)
        lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        lib.cudaFree.argtypes = [ctypes.c_void_p]
        lib.cudaDeviceCanAccessPeer.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]
        p = ctypes.c_void_p()
        can = ctypes.c_int()

        def direct_alloc():
            d.cudaFree(d.cudaMalloc(4096)[1])

        def hosted_alloc():
            rt.cudaFree(rt.cudaMalloc(4096)[1])

        def ctypes_alloc():
            lib.cudaMalloc(ctypes.byref(p), 4096)
            lib.cudaFree(p)

        pynvml.nvmlInit()

        def nvml_link():
            pynvml.nvmlDeviceGetNvLinkState(pynvml.nvmlDeviceGetHandleByIndex(3), 0)

        rows = [
            ("malloc+free", direct_alloc, hosted_alloc, ctypes_alloc),
            ("can-access-peer", lambda: d.cudaDeviceCanAccessPeer(0, 1),
             lambda: rt.cudaDeviceCanAccessPeer(0, 1),
             lambda: lib.cudaDeviceCanAccessPeer(ctypes.byref(can), 0, 1)),
        ]
        print(f"{'call':18} {'SimDriver':>11} {'cuda-python':>12} {'ratio':>6} {'ctypes':>10} {'ratio':>6}")
        for name, base, hosted_fn, ctypes_fn in rows:
            t0 = _best(base, a.calls, a.reps)
            t1 = _best(hosted_fn, a.calls, a.reps)
            t2 = _best(ctypes_fn, a.calls, a.reps)
            print(f"{name:18} {t0 * 1e6:9.1f}us {t1 * 1e6:10.1f}us {t1 / t0:6.2f} "
                  f"{t2 * 1e6:8.1f}us {t2 / t0:6.2f}")
        t = _best(nvml_link, a.calls, a.reps)
        print(f"{'nvml link state':18} {'':>11} {'':>12} {'':>6} {t * 1e6:8.1f}us  (pynvml, absolute)")
        pynvml.nvmlShutdown()
    for m in (nvml, cudart, cuda_bindings):
        m.uninstall()


if __name__ == "__main__":
    main()
