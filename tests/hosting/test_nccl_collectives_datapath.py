"""ncclAllGather, ncclReduceScatter and ncclBroadcast through the ctypes libnccl surface move
their bytes over the connections the simulated NCCL set up (libmodels/nccl/datapath.py), as
ncclAllReduce does: on a pair whose driver reports P2P but garbles peer writes (row P3) each
returns wrong bytes, and where the writes are dropped each hangs, diagnosed as NCCL's
watchdog would see it; on a sound machine each is exact."""

import ctypes

import numpy as np
import pytest
import torch

import sim_ranks as S
from sim_ranks import module_surfaces  # noqa: F401  (fixture)
from test_nccl_ctypes import _init, _lib
from test_nccl_machine_faults import H100, PAIR, _mutate, _values

from commsim.runtime.diagnosis import HangDetected
from commsim.scenario.model import Fault

N = 256                 # float32 elements per rank
FLOAT32, SUM = 7, 0     # ncclFloat32, ncclSum (nccl.h)


def _expected(op: str, rank: int, size: int) -> np.ndarray:
    parts = [np.arange(N, dtype=np.float32) + 100 * r for r in range(size)]
    if op == "ncclAllGather":
        return np.concatenate(parts)
    if op == "ncclBroadcast":
        return parts[0]
    full = [np.concatenate([p] * size) for p in parts]      # each rank sends size * N
    return sum(full)[rank * N:(rank + 1) * N]


def _call(lib, op: str, g, comm) -> tuple[int, np.ndarray]:
    mine = torch.arange(N, dtype=torch.float32, device="cuda") + 100 * g.rank
    if op == "ncclAllGather":
        out = torch.empty(N * g.size, dtype=torch.float32, device="cuda")
        code = lib.ncclAllGather(mine.data_ptr(), out.data_ptr(), N, FLOAT32, comm, None)
    elif op == "ncclReduceScatter":
        src = mine.repeat(g.size)
        out = torch.empty(N, dtype=torch.float32, device="cuda")
        code = lib.ncclReduceScatter(src.data_ptr(), out.data_ptr(), N, FLOAT32, SUM, comm, None)
    else:
        out = torch.empty(N, dtype=torch.float32, device="cuda")
        code = lib.ncclBroadcast(mine.data_ptr(), out.data_ptr(), N, FLOAT32, 0, comm, None)
    return code, out.cpu().numpy()


def _body(ops):
    def body(g):
        lib = _lib()
        code, comm = _init(lib, g)
        assert code == 0
        exact = {}
        for op in ops:
            rc, got = _call(lib, op, g, comm)
            exact[op] = rc == 0 and bool(np.array_equal(got, _expected(op, g.rank, g.size)))
        assert lib.ncclCommDestroy(comm) == 0
        return exact
    return body


OPS = ("ncclAllGather", "ncclReduceScatter", "ncclBroadcast")


def _run(body, *faults):
    _, ranks = S.ranks(H100, [(0, 0), (0, 1)], mutate=_mutate(*faults))
    return S.run(ranks, body)


def test_each_collective_is_exact_on_a_sound_machine(module_surfaces):
    for exact in _values(_run(_body(OPS))):
        assert exact == dict.fromkeys(OPS, True), exact


def test_garbled_peer_writes_reach_every_collective(module_surfaces):
    got = _values(_run(_body(OPS), Fault("p2p_writes_lost", cause="corrupt", **PAIR)))
    # Rank 1 reads rank 0's bytes over the garbled pair in every collective (the broadcast's
    # root is rank 0), rank 0 reads rank 1's in the all-gather and the reduce-scatter.
    assert got[1] == dict.fromkeys(OPS, False), got
    assert not got[0]["ncclAllGather"] and not got[0]["ncclReduceScatter"], got


@pytest.mark.parametrize("op", OPS)
def test_dropped_peer_writes_hang_every_collective(module_surfaces, op):
    outs = _run(_body((op,)), Fault("p2p_writes_lost", cause="dropped", **PAIR))
    errs = [o.error for o in outs]
    assert any(isinstance(e, HangDetected) for e in errs), errs
    text = " ".join(str(e) for e in errs)
    assert f"NCCL {op}" in text and "over P2P/CUMEM" in text, text
