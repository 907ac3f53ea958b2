"""The device check for one GPU (scripts/device_check.sh): hardware against the simulator.

Two processes on GPU 0 (rank 0 is this process, rank 1 a spawned child):
1. legacy IPC: each cudaMallocs a workspace, the 64-byte handles cross a pipe, each opens
   the other's; every peer kernel (one-shot, two-shot, reduce-scatter, all-gather) runs in
   both processes at once over the mapped buffers, for float32 / float16 / bfloat16 and
   aligned and ragged sizes; results must equal the simulator's arithmetic bit for bit
   (float32 sums in rank order, rounded to the dtype);
2. POSIX fd: each cuMemCreates an FD-shareable workspace, the fd crosses a real AF_UNIX
   socket with SCM_RIGHTS, each imports and maps the other's; one-shot again, exact;
3. (rank 0) the fused all-reduce + RMSNorm kernel on one rank, against the float32 formula;
4. (rank 0) `commsim probe` of this machine; cuMemCreate(FABRIC) and a one-device
   cuMulticastCreate on the hardware must give the CUresult a SimDriver gives on the probed
   scenario; where multicast works, the multimem kernel runs over it;
5. (rank 0) bandwidth: the one-shot kernel over 2 x 64 MiB against a device-to-device copy
   of the same bytes (figures only, never a failure).
Prints a summary; exit 0 when everything agrees, 1 on any disagreement, 2 without a GPU,
3 on the watchdog (a hung kernel or process).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from commsim.kernels import workspace as W

Mi = 1 << 20
WATCHDOG_S = 240
DTYPE_NAMES = ("float32", "float16", "bfloat16")
KERNELS = ("one_shot_all_reduce", "two_shot_all_reduce", "reduce_scatter", "all_gather")
SIZES = (1 << 20, (1 << 20) + 3, 5)   # elements: aligned, ragged (scalar head/tail), tiny


@dataclass
class Result:
    name: str
    ok: bool
    detail: str = ""
    figures: dict[str, float] = field(default_factory=dict)


# ---- host-side reference: the simulator's arithmetic ---------------------------------------

def _torch_dtype(name: str) -> Any:
    import torch
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def _inputs(rank: int, n: int, dtype: str, salt: int) -> Any:
    import torch
    g = torch.Generator().manual_seed(1_000_003 * salt + 7919 * rank + n)
    return ((torch.rand(n, generator=g, dtype=torch.float32) - 0.5) * 8).to(_torch_dtype(dtype))


def _bytes(t: Any) -> bytes:
    import torch
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def expected(kernel: str, xs: list[Any], rank: int) -> bytes:
    """What commsim.kernels.collectives computes for `kernel` on inputs xs at `rank`."""
    import torch
    ws, n = len(xs), xs[0].numel()
    if kernel == "all_gather":
        return b"".join(_bytes(x) for x in xs)
    if kernel == "reduce_scatter":
        per = n // ws
        lo, hi = rank * per, (rank + 1) * per
    else:
        lo, hi = 0, n
    acc = torch.zeros(hi - lo, dtype=torch.float32)
    for x in xs:
        acc += x[lo:hi].float()
    return _bytes(acc.to(xs[0].dtype))


def out_bytes(kernel: str, n: int, esz: int, ws: int) -> int:
    if kernel == "all_gather":
        return n * esz * ws
    if kernel == "reduce_scatter":
        return (n // ws) * esz
    return n * esz


def kernel_args(kernel: str, ptrs: list[int], me: int, n: int, dtype: str, cap: int,
                rnd: int) -> tuple:
    if kernel == "all_gather":
        return (ptrs, me, n * _torch_dtype(dtype).itemsize, cap, rnd)
    return (ptrs, me, n, dtype, cap, rnd)


# ---- one rank ---------------------------------------------------------------------------------

class Rank:
    def __init__(self, rank: int, conn: Any, sock_dir: str, cap: int):
        from device.driver import CudaDriver

        self.rank, self.conn, self.sock_dir, self.cap = rank, conn, sock_dir, cap
        self.d = CudaDriver.create(0)
        self.results: list[Result] = []

    def swap(self, obj: Any) -> Any:
        """Exchange one object with the other rank (rank 0 sends first)."""
        if self.rank == 0:
            self.conn.send(obj)
            other = self.conn.recv()
        else:
            other = self.conn.recv()
            self.conn.send(obj)
        if isinstance(other, dict) and "error" in other:
            raise RuntimeError(f"rank {1 - self.rank} failed: {other['error']}")
        return other

    def ok(self, api: str, res: tuple) -> Any:
        from commsim.driver import check
        return check(api, res)

    def note(self, name: str, ok: bool, detail: str = "", **figures: float) -> None:
        self.results.append(Result(f"rank {self.rank}: {name}", ok, detail, figures))

    # -- the peer kernels over one pair of mapped workspaces --------------------------------
    def run_kernels(self, label: str, ptrs: list[int], rnd: int, kernels=KERNELS,
                    dtypes=DTYPE_NAMES, sizes=SIZES) -> int:
        d = self.d
        own = ptrs[self.rank]
        for dtype in dtypes:
            esz = _torch_dtype(dtype).itemsize
            for n in sizes:
                for kernel in kernels:
                    xs = [_inputs(r, n, dtype, rnd) for r in range(2)]
                    self.ok("cudaMemcpy", d.memcpy_htod(own + W.DATA, _np_bytes(xs[self.rank])))
                    rnd += 1
                    t0 = time.perf_counter()
                    res = d.launch_kernel(kernel, *kernel_args(kernel, ptrs, self.rank, n, dtype, self.cap, rnd))
                    dt = time.perf_counter() - t0
                    name = f"{label} {kernel} {dtype} n={n}"
                    if int(res[0]) != 0:
                        self.note(name, False, f"launch: {res[0]!r}")
                        continue
                    nb = out_bytes(kernel, n, esz, 2)
                    got = self.ok("cudaMemcpy", d.memcpy_dtoh(own + W.DATA + self.cap, nb)).tobytes()
                    want = expected(kernel, xs, self.rank)
                    diff = sum(1 for a, b in zip(got, want) if a != b) if got != want else 0
                    self.note(name, got == want, "exact" if got == want else f"{diff} of {nb} bytes differ",
                              seconds=dt)
        return rnd

    # -- 1. legacy IPC ------------------------------------------------------------------------
    def legacy_ipc(self) -> tuple[int, int, int]:
        from commsim.driver import LAZY_ENABLE_PEER_ACCESS
        d = self.d
        own = self.ok("cudaMalloc", d.cudaMalloc(W.workspace_bytes(self.cap)))
        self.ok("cudaMemset", d.cudaMemset(own, 0, W.FLAGS_BYTES))
        self.ok("cudaDeviceSynchronize", d.cudaDeviceSynchronize())   # zeroed before any peer signals
        mine = self.ok("cudaIpcGetMemHandle", d.cudaIpcGetMemHandle(own))
        theirs = self.swap(mine)
        peer = self.ok("cudaIpcOpenMemHandle", d.cudaIpcOpenMemHandle(theirs, LAZY_ENABLE_PEER_ACCESS))
        self.note("legacy IPC handle exchange", len(mine) == 64 and mine != theirs,
                  f"64-byte handles, peer mapped at {peer:#x}")
        ptrs = [own, peer] if self.rank == 0 else [peer, own]
        return own, peer, self.run_kernels("ipc", ptrs, 0)

    def close_ipc(self, own: int, peer: int) -> None:
        self.ok("cudaIpcCloseMemHandle", self.d.cudaIpcCloseMemHandle(peer))
        self.swap("closed")                       # close before free (row G7)
        self.ok("cudaFree", self.d.cudaFree(own))

    # -- 2. POSIX fd over AF_UNIX -------------------------------------------------------------
    def posix_fd(self) -> None:
        from commsim.driver import access_desc, alloc_prop

        from device import fd_channel
        from commsim.driver import FD
        d = self.d
        prop = alloc_prop(0, FD)
        gran = self.ok("cuMemGetAllocationGranularity", d.cuMemGetAllocationGranularity(prop, 1))
        size = -(-W.workspace_bytes(self.cap) // gran) * gran
        mine = self.ok("cuMemCreate", d.cuMemCreate(size, prop, 0))
        maps = []

        def map_handle(h: int) -> int:
            va = self.ok("cuMemAddressReserve", d.cuMemAddressReserve(size, 0, 0, 0))
            self.ok("cuMemMap", d.cuMemMap(va, size, 0, h, 0))
            self.ok("cuMemSetAccess", d.cuMemSetAccess(va, size, [access_desc(0)], 1))
            maps.append(va)
            return va

        own = map_handle(mine)
        self.ok("cudaMemset", d.cudaMemset(own, 0, W.FLAGS_BYTES))
        self.ok("cudaDeviceSynchronize", d.cudaDeviceSynchronize())
        fd = self.ok("cuMemExportToShareableHandle", d.cuMemExportToShareableHandle(mine, FD, 0))
        path = os.path.join(self.sock_dir, f"rank{self.rank}.sock")
        listener = fd_channel.listen(path)
        other_path = self.swap(path)
        if self.rank == 0:
            fd_channel.send_fd(other_path, fd)
            got = fd_channel.recv_fd(listener)
        else:
            got = fd_channel.recv_fd(listener)
            fd_channel.send_fd(other_path, fd)
        listener.close()
        theirs = self.ok("cuMemImportFromShareableHandle", d.cuMemImportFromShareableHandle(got, FD))
        d.close_fd(fd)
        d.close_fd(got)                        # the imported handle keeps the memory alive
        peer = map_handle(theirs)
        self.note("POSIX fd over AF_UNIX + SCM_RIGHTS", True, f"fd {fd} sent, fd {got} received")
        ptrs = [own, peer] if self.rank == 0 else [peer, own]
        self.run_kernels("posix-fd", ptrs, 0, kernels=("one_shot_all_reduce",),
                         sizes=(1 << 20,))
        self.swap("vmm done")
        for va in maps:
            self.ok("cuMemUnmap", d.cuMemUnmap(va, size))
            self.ok("cuMemAddressFree", d.cuMemAddressFree(va, size))
        self.ok("cuMemRelease", d.cuMemRelease(theirs))
        self.ok("cuMemRelease", d.cuMemRelease(mine))


def _np_bytes(t: Any) -> Any:
    import torch
    return t.contiguous().view(torch.uint8).numpy()


# ---- rank 0 only ------------------------------------------------------------------------------

def rmsnorm_check(r: Rank, own: int, rnd: int) -> int:
    import torch
    d = r.d
    rows, hidden, eps = 8, 4096, 1e-6
    for dtype in DTYPE_NAMES:
        td = _torch_dtype(dtype)
        x, res, w = (_inputs(k, rows * hidden, dtype, 99) for k in (0, 1, 2))
        nb = rows * hidden * td.itemsize
        bufs = [r.ok("cudaMalloc", d.cudaMalloc(nb)) for _ in range(3)]   # residual in, out, weight
        try:
            r.ok("cudaMemcpy", d.memcpy_htod(own + W.DATA, _np_bytes(x)))
            r.ok("cudaMemcpy", d.memcpy_htod(bufs[0], _np_bytes(res)))
            r.ok("cudaMemcpy", d.memcpy_htod(bufs[2], _np_bytes(w[:hidden])))
            rnd += 1
            err = d.launch_kernel("fused_all_reduce_rmsnorm", [own], 0, rows, hidden, dtype, r.cap,
                                  rnd, bufs[0], bufs[1], bufs[2], eps)[0]
            if int(err) != 0:
                r.note(f"fused rmsnorm {dtype}", False, f"launch: {err!r}")
                continue
            out = torch.from_numpy(r.ok("cudaMemcpy", d.memcpy_dtoh(own + W.DATA + r.cap, nb))).view(td)
            s = x.float().reshape(rows, hidden) + res.float().reshape(rows, hidden)
            ref = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * w[:hidden].float()
            err_max = float((out.float().reshape(rows, hidden) - ref).abs().max())
            tol = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 6e-2}[dtype] * float(ref.abs().max())
            r.note(f"fused rmsnorm {dtype} {rows}x{hidden}", err_max <= tol,
                   f"max |err| {err_max:.3g} (tolerance {tol:.3g})", max_abs_err=err_max)
        finally:
            for b in bufs:
                d.cudaFree(b)
    return rnd


def bandwidth(r: Rank, ptrs: list[int], rnd: int) -> int:
    """One-shot over this rank's and the (idle) peer's 64 MiB inputs vs a D2D copy of 64 MiB.
    The peer's flag slots in this workspace are pre-set to the maximum round, so the kernel
    runs alone: what is timed is its data movement, not a barrier with a time-sliced peer."""
    from cuda.bindings import runtime as cudart
    d = r.d
    own = ptrs[0]
    for which in (W.START, W.END):
        r.ok("cudaMemset", d.cudaMemset(own + which + 4, 0xFF, 4))
    n, iters = r.cap // 4, 20
    nbytes = n * 4

    def timed(fn: Callable[[], Any]) -> float:
        _, a = cudart.cudaEventCreate()
        _, b = cudart.cudaEventCreate()
        fn()
        r.ok("sync", cudart.cudaDeviceSynchronize())
        cudart.cudaEventRecord(a, 0)
        for _ in range(iters):
            fn()
        cudart.cudaEventRecord(b, 0)
        r.ok("sync", cudart.cudaEventSynchronize(b))
        _, ms = cudart.cudaEventElapsedTime(a, b)
        cudart.cudaEventDestroy(a)
        cudart.cudaEventDestroy(b)
        return ms / 1e3 / iters

    rounds = [rnd]

    def kernel() -> None:
        rounds[0] += 1
        r.ok("launch", d.launch_async("one_shot_all_reduce", ptrs, 0, n, "float32", r.cap, rounds[0]))

    def copy() -> None:   # async, like the kernel launches (CudaDriver.cudaMemcpy waits)
        r.ok("cudaMemcpyAsync", cudart.cudaMemcpyAsync(own + W.DATA + r.cap, own + W.DATA, nbytes,
                                                       cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice, 0))

    tk, tc = timed(kernel), timed(copy)
    k_gbs, c_gbs = 3 * nbytes / tk / 1e9, 2 * nbytes / tc / 1e9
    r.note("bandwidth one-shot vs D2D copy", True,
           f"one-shot 2 x {nbytes >> 20} MiB float32: {tk * 1e6:.0f} us, {k_gbs:.0f} GB/s "
           f"(2 reads + 1 write); cudaMemcpy D2D {nbytes >> 20} MiB: {tc * 1e6:.0f} us, "
           f"{c_gbs:.0f} GB/s (read + write); ratio {k_gbs / c_gbs:.2f}",
           kernel_us=tk * 1e6, kernel_gbs=k_gbs, copy_us=tc * 1e6, copy_gbs=c_gbs)
    return rounds[0]


def against_simulator(r: Rank, out_dir: str | None) -> None:
    from commsim.driver import alloc_prop

    from commsim.devicecheck import predict
    from device.build import nvrtc_version
    from commsim.driver import FABRIC
    from commsim.probe.machine import probe_machine
    from commsim.probe.scenario import scenario_text
    d = r.d
    text = scenario_text(probe_machine())
    if out_dir:
        with open(os.path.join(out_dir, "probe.toml"), "w") as f:
            f.write(text)
    r.note("commsim probe", True, f"scenario written ({len(text.splitlines())} lines); NVRTC "
                                  f"{'.'.join(map(str, nvrtc_version()))}")
    prop = alloc_prop(0, FABRIC)
    real, gran = d.cuMemGetAllocationGranularity(prop, 0)
    if int(real) == 0:
        real, h = d.cuMemCreate(gran, prop, 0)
        if int(real) == 0:
            d.cuMemRelease(h)
    sim = predict.fabric_create(text)
    r.note("fabric handle: cuMemCreate(FABRIC)", int(real) == int(sim),
           f"hardware {getattr(real, 'name', real)}, simulator on the probed scenario "
           f"{getattr(sim, 'name', sim)}")
    # one-device multicast: the attribute, then the object
    real_mc, mc_detail = multicast_one_device(r)
    sim_mc = predict.multicast_create(text)
    r.note("multicast: cuMulticastCreate(1 device)", int(real_mc) == int(sim_mc),
           f"hardware {getattr(real_mc, 'name', real_mc)}, simulator {getattr(sim_mc, 'name', sim_mc)}"
           + (f"; {mc_detail}" if mc_detail else ""))


def multicast_one_device(r: Rank) -> tuple[Any, str]:
    """cuMulticastCreate for a team of one; when it works, the multimem kernel over it (a
    reduction over one member is that member's data, exactly)."""
    from commsim.driver import access_desc, alloc_prop, multicast_prop
    d = r.d
    cap = 1 * Mi
    mg_err, mg = d.cuMulticastGetGranularity(multicast_prop(1, 0, 0), 1)
    if int(mg_err) != 0:
        return mg_err, "cuMulticastGetGranularity failed"
    size = -(-W.workspace_bytes(cap) // mg) * mg
    err, mc = d.cuMulticastCreate(multicast_prop(1, size, 0))
    if int(err) != 0:
        return err, ""
    detail, todo = "", []
    try:
        r.ok("cuMulticastAddDevice", d.cuMulticastAddDevice(mc, 0))
        uc = r.ok("cuMemCreate", d.cuMemCreate(size, alloc_prop(0, 0), 0))
        todo.append(lambda: d.cuMemRelease(uc))
        r.ok("cuMulticastBindMem", d.cuMulticastBindMem(mc, 0, uc, 0, size, 0))
        todo.append(lambda: d.cuMulticastUnbind(mc, 0, 0, size))
        vas = []
        for h in (uc, mc):
            va = r.ok("cuMemAddressReserve", d.cuMemAddressReserve(size, 0, 0, 0))
            todo.append(lambda va=va: d.cuMemAddressFree(va, size))
            r.ok("cuMemMap", d.cuMemMap(va, size, 0, h, 0))
            todo.append(lambda va=va: d.cuMemUnmap(va, size))
            r.ok("cuMemSetAccess", d.cuMemSetAccess(va, size, [access_desc(0)], 1))
            vas.append(va)
        uva, mva = vas
        r.ok("cudaMemset", d.cudaMemset(uva, 0, W.FLAGS_BYTES))
        fails = []
        for dtype in DTYPE_NAMES:
            x = _inputs(0, 12345, dtype, 5)
            r.ok("cudaMemcpy", d.memcpy_htod(uva + W.DATA, _np_bytes(x)))
            res = d.launch_kernel("multimem_all_reduce", mva, uva, 0, 1, x.numel(), dtype, cap, 1 + DTYPE_NAMES.index(dtype))
            if int(res[0]) != 0:
                fails.append(f"{dtype}: launch {res[0]!r}")
                continue
            got = r.ok("cudaMemcpy", d.memcpy_dtoh(uva + W.DATA + cap, x.numel() * x.element_size())).tobytes()
            if got != _bytes(x):
                fails.append(f"{dtype}: result differs")
        r.note("multimem kernel over a one-device multicast object", not fails,
               "; ".join(fails) or "exact for float32, float16, bfloat16")
    except Exception as e:   # CudaError of a set-up step: reported, the object is released
        detail = f"set-up after create failed: {e}"
        r.note("multimem kernel over a one-device multicast object", False, detail)
    finally:
        for undo in reversed(todo):
            undo()
        d.cuMemRelease(mc)
    return err, detail


# ---- the two processes ------------------------------------------------------------------------

def _watchdog(what: str) -> None:
    def fire(signum: int, frame: Any) -> None:
        print(f"device check: watchdog after {WATCHDOG_S} s in {what}: a kernel or the peer "
              f"process hangs", file=sys.stderr, flush=True)
        os._exit(3)
    signal.signal(signal.SIGALRM, fire)
    signal.alarm(WATCHDOG_S)


def peer_main(conn: Any, sock_dir: str, cap: int) -> None:
    """Rank 1, in the spawned child."""
    _watchdog("rank 1")
    try:
        r = Rank(1, conn, sock_dir, cap)
        own, peer, _ = r.legacy_ipc()
        conn.recv()                       # rank 0's bandwidth run, with this rank idle
        r.posix_fd()
        r.close_ipc(own, peer)
        conn.send([asdict(x) for x in r.results])
    except BaseException as e:
        conn.send({"error": f"{type(e).__name__}: {e}"})
        raise


def run(out_dir: str | None) -> list[Result]:
    _watchdog("rank 0")
    cap = 64 * Mi
    sock_dir = tempfile.mkdtemp(prefix="commsim-check-")
    ctx = multiprocessing.get_context("spawn")       # CUDA does not survive fork
    conn, child_end = ctx.Pipe()
    child = ctx.Process(target=peer_main, args=(child_end, sock_dir, cap), daemon=True)
    child.start()
    r = Rank(0, conn, sock_dir, cap)
    own, peer, rnd = r.legacy_ipc()
    rnd = bandwidth(r, [own, peer], rnd)
    conn.send("bandwidth done")
    r.posix_fd()
    r.close_ipc(own, peer)
    peer_results = conn.recv()
    child.join(30)
    if isinstance(peer_results, dict):
        r.note("rank 1", False, peer_results["error"])
        peer_results = []
    results = r.results + [Result(**x) for x in peer_results]
    # Single-process parts, after the pair is done (a fresh workspace for the fused kernel).
    ws = r.ok("cudaMalloc", r.d.cudaMalloc(r.W.workspace_bytes(r.cap)))
    r.ok("cudaMemset", r.d.cudaMemset(ws, 0, r.W.FLAGS_BYTES))
    r.results = []
    rmsnorm_check(r, ws, 0)
    r.d.cudaFree(ws)
    against_simulator(r, out_dir)
    results += r.results
    try:
        os.rmdir(sock_dir)
    except OSError:
        pass
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m commsim.devicecheck", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT"), help="folder for probe.toml and "
                   "device_check.json (default: $OUT when set)")
    args = p.parse_args(argv)
    from device.driver import unavailable_reason
    why = unavailable_reason(0)
    if why:
        print(f"device check: cannot run: {why}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        results = run(args.out)
    except Exception as e:   # a CudaError or a failed peer: say where, exit non-zero
        print(f"device check: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    bad = [x for x in results if not x.ok]
    for x in results:
        print(f"{'ok  ' if x.ok else 'FAIL'} {x.name}: {x.detail}")
    print(f"device check: {len(results) - len(bad)} passed, {len(bad)} failed "
          f"({time.perf_counter() - t0:.1f} s)")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "device_check.json"), "w") as f:
            json.dump([asdict(x) for x in results], f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
