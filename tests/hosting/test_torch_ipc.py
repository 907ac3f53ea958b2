"""CUDA tensors between ranks by torch.multiprocessing's CUDA IPC (reduce_tensor /
rebuild_cuda_tensor, torch_ipc.py): through the ranks' simulated drivers, so legacy IPC's
rules hold (row L8: refused between the trays of a GB200 NVLink domain)."""

from __future__ import annotations

import gc

import pytest
import torch

from commsim.hosting.surfaces.torch.tensors import HostedCudaTensor
from hosting_helpers import PROGRAMS, hosted
from sim_ranks import module_surfaces, ranks, solo  # noqa: F401  (fixture)

pytestmark = pytest.mark.usefixtures("module_surfaces")


def test_a_peer_rebuilds_the_tensor_over_the_same_bytes_and_closes_it():
    _, (a, b) = ranks("hgx-h100-8", [(0, 2), (0, 5)])
    keep: list = []

    def share():
        from torch.multiprocessing.reductions import reduce_tensor
        t = torch.arange(16, dtype=torch.int32, device="cuda")
        keep.append(t)
        return reduce_tensor(t[4:]), t.data_ptr(), t.untyped_storage().nbytes()
    (func, args), ptr, nbytes = solo(a, share)
    handle, size, offset = args[7], args[8], args[9]
    assert isinstance(handle, bytes) and size == nbytes == 64 and args[3] == 4
    assert a.driver.cuPointerGetAttribute(11, ptr)[1] == ptr - offset   # the segment's base

    def take():
        t = func(*args)
        out = (type(t) is HostedCudaTensor, t.device, t.tolist(), len(b.driver._ipc_open))
        t.fill_(-1)                          # written through the mapping
        del t
        gc.collect()
        return out, len(b.driver._ipc_open)
    (kind, dev, vals, n_open), after = solo(b, take)
    assert kind and dev == torch.device("cuda", args[6]) and vals == list(range(4, 16))
    assert n_open == 1 and after == 0          # one mapping; closed with the last tensor
    assert solo(a, lambda: keep[0].tolist()) == list(range(4)) + [-1] * 12


def test_outside_a_rank_reduce_tensor_is_torchs_own():
    from torch.multiprocessing.reductions import rebuild_tensor, reduce_tensor
    func, _ = reduce_tensor(torch.ones(2))
    assert func is rebuild_tensor


@pytest.mark.parametrize("mode", ["inproc", "procs"])
def test_weight_sync_by_ipc_handles_on_one_node(mode):
    v, res, _ = hosted(PROGRAMS / "torch_mp_ipc.py", "hgx-h100-8", mode=mode, nproc_per_host=2)
    assert v.ok, v.format()
    assert sorted(res) == [0, 1]
    for rank, d in res.items():
        peer = (rank + 1) % 2
        assert d["device"] == f"cuda:{rank}" and d["same_mapping"], d
        assert d["seen"] == [8.0 * (peer + 1), 9.0 * (peer + 1), 10.0 * (peer + 1)], d
        assert d["written_by_left_peer"] == 1000.0 + (rank - 1) % 2, d


@pytest.mark.parametrize("mode", ["inproc", "procs"])
def test_weight_sync_by_ipc_handles_fails_across_two_trays(mode):
    """The seed reports' failure, through torch.multiprocessing this time (row L8)."""
    v, res, _ = hosted(PROGRAMS / "torch_mp_ipc.py", "gb200-nvl72:2", mode=mode,
                       nproc_per_host=1, visible="one")
    assert v.exit_code == 1 and not res
    for p in v.ranks:
        assert p.exception == "torch.AcceleratorError: CUDA error: invalid resource handle", v.format()
        e = p.first_cuda_error
        assert (e["api"], e["name"]) == ("cudaIpcOpenMemHandle", "cudaErrorInvalidResourceHandle")
