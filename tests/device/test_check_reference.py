"""The device check's host reference (commsim/devicecheck/check.py `expected`) is the simulator's own
arithmetic: the simulated kernels give the same bytes on the same inputs, so a hardware run
that matches the reference matches the simulator bit for bit."""

from __future__ import annotations

import pytest

from commsim.driver import LAZY_ENABLE_PEER_ACCESS, check
from commsim.runtime.scheduler import Scheduler, wait_until
from commsim.kernels import collectives as K, workspace as W
from commsim.sim import SimFabric, spawn_driver
from commsim.topology.model import GpuRef
from commsim.topology.presets import build
from commsim.devicecheck import check as dc

CAP = 1 << 20


@pytest.mark.parametrize("dtype", dc.DTYPE_NAMES)
@pytest.mark.parametrize("n", [4096, 4099, 5])
def test_reference_equals_the_simulated_kernels(dtype, n):
    cluster = build("hgx-h100-8")
    fabric = SimFabric(cluster, seed=0)
    drivers = [spawn_driver(fabric, GpuRef(cluster.hosts[0].name, g)) for g in range(2)]
    handles: dict[int, bytes] = {}
    out: dict[tuple[str, int], bytes] = {}

    def rank(r: int) -> None:
        d = drivers[r]
        own = check("malloc", d.cudaMalloc(W.workspace_bytes(CAP)))
        check("memset", d.cudaMemset(own, 0, W.FLAGS_BYTES))
        handles[r] = check("ipc", d.cudaIpcGetMemHandle(own))
        wait_until(lambda: len(handles) == 2, "handles")
        peer = check("open", d.cudaIpcOpenMemHandle(handles[1 - r], LAZY_ENABLE_PEER_ACCESS))
        ptrs = [own, peer] if r == 0 else [peer, own]
        for rnd, kernel in enumerate(dc.KERNELS, 1):
            x = dc._inputs(r, n, dtype, rnd)
            check("htod", d.memcpy_htod(own + W.DATA, dc._np_bytes(x)))
            fn = getattr(K, kernel)
            check(kernel, d.launch_kernel(fn, *dc.kernel_args(kernel, ptrs, r, n, dtype, CAP, rnd)))
            nb = dc.out_bytes(kernel, n, x.element_size(), 2)
            out[(kernel, r)] = check("dtoh", d.memcpy_dtoh(own + W.DATA + CAP, nb)).tobytes()
        check("close", d.cudaIpcCloseMemHandle(peer))

    outs = Scheduler(0).run_ranks(2, rank)
    for o in outs:
        o.unwrap()
    for rnd, kernel in enumerate(dc.KERNELS, 1):
        xs = [dc._inputs(r, n, dtype, rnd) for r in range(2)]
        for r in range(2):
            assert out[(kernel, r)] == dc.expected(kernel, xs, r), (kernel, r)
