"""libnccl through ctypes, as vLLM's pynccl loads it: a vLLM-style program under `commsim exec`
in both modes (numbers checked on every rank), NCCL's init failure where the machine's NCCL
model says init fails, misuse answered with the codes NCCL returns, every datatype and
reduction against a numpy reference, groups, send/recv, windows, and collectives recorded in
a CUDA graph capture and run by its replays."""

import ctypes
import os
import functools
import runpy

import numpy as np
import pytest
import torch

import sim_ranks as S
from commsim.launch.torch_build import version_fields
from hosting_helpers import PROGRAMS, hosted
from sim_ranks import module_surfaces  # noqa: F401  (fixture)

PROG = PROGRAMS / "pynccl_allreduce.py"
IMEX_MISSING = S.__file__.rsplit("/tests/", 1)[0] + "/scenarios/regressions/nccl-mnnvl-imex-missing.toml"
NCCL_SYSTEM_ERROR = "NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)"


def test_vllm_style_wrapper_moves_the_bytes():
    """In-process ranks across two GB200 trays (procs mode: the mode-agreement test, where
    the program checks its own numbers)."""
    expected = runpy.run_path(str(PROG))["expected"]
    v, res, out = hosted(PROG, "gb200-nvl72:2", nproc_per_host=2)
    assert v.ok, v.format() + out
    assert res == {r: expected(r, 4, "2.29.7") for r in range(4)}


def test_init_fails_with_the_machines_nccl_error(monkeypatch):
    """GB200 trays with IMEX missing on one: NCCL's MNNVL check fails on that tray's ranks
    (their FABRIC import through the driver fails: ncclSystemError), the other tray's ranks
    learn it as ncclRemoteError, and NCCL_MNNVL_ENABLE=0 lets the same program through."""
    v, _, out = _scenario_run()
    assert not v.ok
    text = v.format(verbose=True)
    # the failing tray's four ranks, and the other tray's four
    assert text.count(f"RuntimeError: {NCCL_SYSTEM_ERROR}") >= 4, text
    assert text.count("RuntimeError: NCCL error: remote process exited or there was a network "
                      "error") >= 4, text
    assert "ncclCommInitRank -> ncclSystemError" in text and "NCCL_MNNVL_ENABLE=0" in text
    monkeypatch.setenv("NCCL_MNNVL_ENABLE", "0")
    v, res, out = _scenario_run()
    assert v.ok, v.format() + out
    assert all(res[r]["all_reduce_ok"] for r in range(8))


def _scenario_run() -> tuple:
    import io

    from commsim.launch.config import RunConfig
    from commsim.launch.run import execute
    from hosting_helpers import results
    out = io.StringIO()
    cfg = RunConfig(scenario=IMEX_MISSING, mode="inproc", command=[str(PROG)])
    v = execute(cfg, out=out, err=out)
    return v, results(out.getvalue()), out.getvalue()


def test_misuse_is_the_wrappers_nccl_error():
    v, _, out = hosted(PROG, "hgx-h100-8", "--misuse", mode="inproc", nproc_per_host=2)
    text = v.format(verbose=True)
    assert not v.ok
    assert text.count("RuntimeError: NCCL error: invalid argument (run with NCCL_DEBUG=WARN "
                      "for details)") == 2 + 1, text      # each rank's line, the root cause's
    assert "ncclAllReduce -> ncclInvalidArgument: ncclAllReduce : invalid type 99" in text


# ---- in-process ranks built by hand (sim_ranks) -------------------------------------------

class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


P, I, Z = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
SIGS = {
    "ncclCommInitRank": [ctypes.POINTER(P), I, UniqueId, I],
    "ncclAllReduce": [P, P, Z, I, I, P, P], "ncclReduce": [P, P, Z, I, I, I, P, P],
    "ncclAllGather": [P, P, Z, I, P, P], "ncclReduceScatter": [P, P, Z, I, I, P, P],
    "ncclBroadcast": [P, P, Z, I, I, P, P], "ncclSend": [P, Z, I, I, P, P],
    "ncclRecv": [P, Z, I, I, P, P], "ncclCommDestroy": [P],
}


def _lib():
    lib = ctypes.CDLL("libnccl.so.2")
    for name, argtypes in SIGS.items():
        getattr(lib, name).argtypes = argtypes
    lib.ncclGetErrorString.restype = ctypes.c_char_p
    return lib


def _init(lib, g, nranks=None, rank=None):
    """A communicator over the sim_ranks group, the unique id carried by the group."""
    uid = UniqueId()
    if g.rank == 0:
        assert lib.ncclGetUniqueId(ctypes.byref(uid)) == 0
    ctypes.memmove(ctypes.addressof(uid), g.broadcast_object(bytes(uid), 0), 128)
    comm = P()
    code = lib.ncclCommInitRank(ctypes.byref(comm), g.size if nranks is None else nranks, uid,
                                g.rank if rank is None else rank)
    return code, comm


def _two(spec="hgx-h100-8", placement=((0, 0), (0, 1)), **kw):
    return S.ranks(spec, list(placement), **kw)[1]


def _values(outcomes):
    for o in outcomes:
        if o.error is not None:
            raise o.error
    return [o.value for o in outcomes]


def test_library_facts(module_surfaces):
    (r,) = _two(placement=[(0, 0)])

    def body():
        lib = _lib()
        v = ctypes.c_int()
        assert lib.ncclGetVersion(ctypes.byref(v)) == 0 and v.value == 22907
        assert lib.ncclGetVersion(None) == 4                    # PtrCheck
        assert lib.ncclGetUniqueId(None) == 4
        texts = [lib.ncclGetErrorString(c) for c in range(9)]
        assert texts[0] == b"no error" and texts[4].startswith(b"invalid argument")
        assert texts[5] == b"invalid usage (run with NCCL_DEBUG=WARN for details)"
        assert texts[8] == b"unknown result code"
        with pytest.raises(AttributeError, match="undefined symbol: ncclNoSuchThing"):
            lib.ncclNoSuchThing
        with pytest.raises(NotImplementedError, match="libnccl.ncclCommShrink is not simulated"):
            lib.ncclCommShrink(None, None, 0, None, None, 0)
        assert lib.ncclCommSplit(None, 0, 0, None, None) == 4   # CommCheck
        assert lib.ncclCommDestroy(None) == 0                   # NULL: a no-op
        assert lib.ncclGroupEnd() == 5                          # not in a group
        return torch.version.cuda
    assert S.solo(r, body) == "13.0"
    # outside a rank: the build's own (None for the CPU build), as its version.py says
    assert torch.version.cuda == version_fields(os.path.join(os.path.dirname(torch.__file__), "version.py"))["cuda"]
    from commsim.hosting.install import fakelib
    assert fakelib.lookup("libnccl.so.2") is None               # and the machine's libraries


def test_misuse_codes(module_surfaces):
    ranks = _two()

    def body(g):
        lib = _lib()
        bad_comm = P()
        assert lib.ncclCommInitRank(None, 2, UniqueId(), 0) == 4
        assert lib.ncclCommInitRank(ctypes.byref(bad_comm), 0, UniqueId(), 0) == 4
        assert lib.ncclCommInitRank(ctypes.byref(bad_comm), 2, UniqueId(), 2) == 4
        code, comm = _init(lib, g)
        assert code == 0 and comm.value
        t = torch.ones(16, device="cuda")
        p = t.data_ptr()
        got = {
            "null comm": lib.ncclAllReduce(p, p, 16, 7, 0, None, None),
            "foreign comm": lib.ncclAllReduce(p, p, 16, 7, 0, comm.value + 8, None),
            "type": lib.ncclAllReduce(p, p, 16, 12, 0, comm, None),
            "op": lib.ncclAllReduce(p, p, 16, 7, 5, comm, None),
            "root": lib.ncclBroadcast(p, p, 16, 7, 2, comm, None),
            "peer": lib.ncclSend(p, 16, 7, -1, comm, None),
            "unmapped": lib.ncclAllReduce(0x1000, 0x1000, 16, 7, 0, comm, None),
            "memfree": lib.ncclMemFree(P(p)),
        }
        lib.ncclGetLastError.restype = ctypes.c_char_p
        first = lib.ncclGetLastError(comm)
        assert lib.ncclCommDestroy(comm) == 0
        got["destroyed"] = lib.ncclAllReduce(p, p, 16, 7, 0, comm, None)
        return got, first
    (a, fa), (b, fb) = _values(S.run(ranks, body))
    want = {"null comm": 4, "foreign comm": 4, "type": 4, "op": 4, "root": 4, "peer": 4,
            "unmapped": 1, "memfree": 4, "destroyed": 4}
    assert a == want and b == want
    assert b"not allocated by ncclMemAlloc" in fa
    # The kernel's fault on an unmapped buffer is the rank's first CUDA error.
    assert ranks[0].events.first_error.api == "ncclAllReduce"
    assert ranks[0].events.first_error.code == 700
    assert any("ncclAllReduce -> ncclInvalidArgument: ncclAllReduce : invalid type 12" in n
               for n in ranks[0].events.notes)


def _bf16(x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


TYPES = {0: torch.int8, 1: torch.uint8, 2: torch.int32, 4: torch.int64, 6: torch.float16,
         7: torch.float32, 8: torch.float64, 9: torch.bfloat16}


def _input(rank: int, dtype: torch.dtype) -> torch.Tensor:
    base = torch.tensor([1, -2, 3, 100, 7, 0, 5, -9], dtype=torch.float64) * (rank + 1) + rank
    if dtype == torch.uint8:
        base = base.abs()
    return base.to(dtype)


def _reference(dtype: torch.dtype, op: int, n: int) -> torch.Tensor:
    xs = [_input(r, dtype) for r in range(n)]
    wide = dtype in (torch.float16, torch.bfloat16)
    ys = [x.float() if wide else x for x in xs]
    if op in (0, 4):
        acc = functools.reduce(torch.add, ys)
        if op == 4:
            acc = torch.div(acc, n, rounding_mode="trunc") if not acc.is_floating_point() else acc / n
    elif op == 1:
        acc = functools.reduce(torch.mul, ys)
    elif op == 2:
        acc = functools.reduce(torch.maximum, ys)
    else:
        acc = functools.reduce(torch.minimum, ys)
    return acc.to(dtype)


def test_every_type_and_reduction(module_surfaces):
    ranks = S.ranks("hgx-h100-8", [(0, 0), (0, 1), (0, 2)])[1]

    def body(g):
        lib = _lib()
        _, comm = _init(lib, g)
        got = {}
        for code, dtype in TYPES.items():
            for op in range(5):
                x = _input(g.rank, dtype).cuda()
                out = torch.empty_like(x)
                assert lib.ncclAllReduce(x.data_ptr(), out.data_ptr(), 8, code, op, comm, None) == 0
                got[(code, op)] = out.cpu()
                assert torch.equal(x.cpu(), _input(g.rank, dtype))     # out of place
        return got
    for got in _values(S.run(ranks, body)):
        for (code, op), out in got.items():
            assert torch.equal(out, _reference(TYPES[code], op, 3)), (code, op, out)


def test_rooted_and_sliced_collectives(module_surfaces):
    ranks = S.ranks("l40s-8-pcie", [(0, 0), (0, 1), (0, 2), (0, 3)])[1]

    def body(g):
        lib = _lib()
        _, comm = _init(lib, g)
        x = torch.arange(8, dtype=torch.float32, device="cuda") * (g.rank + 1)
        red = torch.full((8,), -1.0, device="cuda")
        assert lib.ncclReduce(x.data_ptr(), red.data_ptr(), 8, 7, 0, 2, comm, None) == 0
        rs = torch.empty(2, device="cuda")
        assert lib.ncclReduceScatter(x.data_ptr(), rs.data_ptr(), 2, 7, 2, comm, None) == 0
        ag = torch.empty(4 * 3, dtype=torch.int16, device="cuda")
        mine = torch.full((3,), g.rank * 10, dtype=torch.int16, device="cuda")
        assert lib.ncclAllGather(mine.data_ptr(), ag.data_ptr(), 6, 1, comm, None) == 0  # as bytes
        b = torch.full((4,), float(g.rank), device="cuda")
        out = torch.zeros(4, device="cuda")
        assert lib.ncclBroadcast(b.data_ptr(), out.data_ptr(), 4, 7, 1, comm, None) == 0
        lib.ncclBcast.argtypes = [P, Z, I, I, P, P]
        assert lib.ncclBcast(b.data_ptr(), 4, 7, 3, comm, None) == 0
        n, me, dev = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        assert lib.ncclCommCount(comm, ctypes.byref(n)) == 0
        assert lib.ncclCommUserRank(comm, ctypes.byref(me)) == 0
        assert lib.ncclCommCuDevice(comm, ctypes.byref(dev)) == 0
        return (red.cpu().tolist(), rs.cpu().tolist(), ag.cpu().tolist(), out.cpu().tolist(),
                b.cpu().tolist(), (n.value, me.value, dev.value))
    for r, (red, rs, ag, out, b, facts) in enumerate(_values(S.run(ranks, body))):
        assert red == ([float(i * 10) for i in range(8)] if r == 2 else [-1.0] * 8)
        assert rs == [float(2 * r * 4), float((2 * r + 1) * 4)]       # max of (q+1)*i: q = 3
        assert ag == [q * 10 for q in range(4) for _ in range(3)]
        assert out == [1.0] * 4 and b == [3.0] * 4
        assert facts == (4, r, r)


def test_group_send_recv_both_send_first(module_surfaces):
    ranks = _two()

    def body(g):
        lib = _lib()
        _, comm = _init(lib, g)
        peer = 1 - g.rank
        mine = torch.full((6,), 7 + g.rank, dtype=torch.int64, device="cuda")
        got = torch.zeros(6, dtype=torch.int64, device="cuda")
        assert lib.ncclGroupStart() == 0 and lib.ncclGroupStart() == 0   # nested
        assert lib.ncclSend(mine.data_ptr(), 6, 4, peer, comm, None) == 0
        assert lib.ncclRecv(got.data_ptr(), 6, 4, peer, comm, None) == 0
        assert lib.ncclGroupEnd() == 0
        before = got.cpu().tolist()            # inside the outer group: nothing moved yet
        assert lib.ncclGroupEnd() == 0
        short = torch.zeros(3, dtype=torch.int64, device="cuda")
        if g.rank == 0:
            code = lib.ncclSend(mine.data_ptr(), 6, 4, 1, comm, None)
        else:
            code = lib.ncclRecv(short.data_ptr(), 3, 4, 0, comm, None)
        return before, got.cpu().tolist(), code
    (b0, g0, c0), (b1, g1, c1) = _values(S.run(ranks, body))
    assert b0 == b1 == [0] * 6
    assert g0 == [8] * 6 and g1 == [7] * 6
    assert (c0, c1) == (0, 5)        # a receive shorter than the send: ncclInvalidUsage


def test_duplicate_gpu_is_invalid_usage(module_surfaces):
    ranks = _two(placement=[(0, 3), (0, 3)])

    def body(g):
        lib = _lib()
        return _init(lib, g)[0]
    assert _values(S.run(ranks, body)) == [5, 5]
    assert any("Duplicate GPU detected" in n for n in ranks[1].events.notes)


def test_mnnvl_without_imex_and_the_variable(module_surfaces, monkeypatch):
    def no_imex(c):
        return c.replace_host(c.hosts[1].name, imex_channels=())

    def body(g):
        return _init(_lib(), g)[0]
    ranks = S.ranks("gb200-nvl72:2", [(0, 0), (1, 0)], mutate=no_imex)[1]
    # The MNNVL check is each rank's own (src/mnnvl.cc, v2.27.3-1): the rank on the host
    # without IMEX fails its FABRIC import (ncclSystemError), its peer learns it over the
    # bootstrap (ncclRemoteError, UNCONFIRMED timing).
    assert _values(S.run(ranks, body)) == [6, 2]
    assert any("MNNVL (cliqueSize 2) is available but not working" in n for n in ranks[1].events.notes)
    monkeypatch.setenv("NCCL_MNNVL_ENABLE", "0")
    ranks = S.ranks("gb200-nvl72:2", [(0, 0), (1, 0)], mutate=no_imex)[1]
    assert _values(S.run(ranks, body)) == [0, 0]


def test_a_rank_that_never_inits_is_a_diagnosed_hang(module_surfaces):
    ranks = _two()

    def body(g):
        lib = _lib()
        uid = UniqueId()
        if g.rank == 0:
            lib.ncclGetUniqueId(ctypes.byref(uid))
            return lib.ncclCommInitRank(ctypes.byref(P()), 2, uid, 0)
        return None
    outcomes = S.run(ranks, body)
    assert outcomes[1].ok
    assert "waiting for the other ranks of the unique id (1 of 2 checked in)" in str(outcomes[0].error)


def test_memory_and_windows(module_surfaces):
    ranks = _two()

    def body(g):
        lib = _lib()
        _, comm = _init(lib, g)
        ptr = P()
        assert lib.ncclMemAlloc(ctypes.byref(ptr), 1 << 20) == 0 and ptr.value
        win = P()
        assert lib.ncclCommWindowRegister(comm, ptr, 1 << 20, ctypes.byref(win), 1) == 0
        x = torch.full((4,), float(g.rank + 1), device="cuda")
        assert lib.ncclAllReduce(x.data_ptr(), ptr, 4, 7, 0, comm, None) == 0
        out = (ctypes.c_float * 4)()
        from commsim.hosting.state import session
        out[:] = np.frombuffer(bytes(session.current().driver.view(ptr.value, 16)), np.float32)
        codes = (lib.ncclCommWindowDeregister(comm, win), lib.ncclCommWindowDeregister(comm, win),
                 lib.ncclMemFree(ptr))
        return list(out), codes
    for vals, codes in _values(S.run(ranks, body)):
        assert vals == [3.0] * 4 and codes == (0, 4, 0)


def test_captured_in_a_cuda_graph_and_run_by_replay(module_surfaces):
    ranks = _two()

    def body(g):
        lib = _lib()
        _, comm = _init(lib, g)
        x = torch.full((8,), float(g.rank + 1), device="cuda")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            stream = torch.cuda.current_stream().cuda_stream
            assert lib.ncclAllReduce(x.data_ptr(), x.data_ptr(), 8, 7, 0, comm, P(stream)) == 0
        at_capture = x[0].item()
        graph.replay()
        once = x[0].item()
        graph.replay()
        # the default stream is not the capture's: a call there runs at once, as it did before
        assert lib.ncclAllReduce(x.data_ptr(), x.data_ptr(), 8, 7, 0, comm, None) == 0
        return at_capture, once, x[0].item()
    for r, (at_capture, once, end) in enumerate(_values(S.run(ranks, body))):
        assert at_capture == r + 1.0          # nothing moved while capturing
        assert once == 3.0 and end == 12.0    # replays: 1+2 = 3, 3+3 = 6; then the call: 12


def test_fp8_moves_but_does_not_reduce(module_surfaces):
    ranks = _two()

    def body(g):
        lib = _lib()
        _, comm = _init(lib, g)
        mine = torch.full((4,), 0x38 + g.rank, dtype=torch.uint8, device="cuda")  # fp8 bits
        out = torch.empty(8, dtype=torch.uint8, device="cuda")
        assert lib.ncclAllGather(mine.data_ptr(), out.data_ptr(), 4, 10, comm, None) == 0
        with pytest.raises(NotImplementedError, match="ncclAllReduce of ncclFloat8e4m3"):
            lib.ncclAllReduce(mine.data_ptr(), mine.data_ptr(), 4, 10, 0, comm, None)
        return out.cpu().tolist()
    assert _values(S.run(ranks, body)) == [[0x38] * 4 + [0x39] * 4] * 2


def test_without_torch_over_mpi_and_cudart():
    """A PyTorch-free user: the id over mpi4py, buffers from the ctypes libcudart (in-process
    ranks: procs mode's fd passing through the proxy socket is the mode-agreement test's)."""
    v, res, out = hosted(PROGRAMS / "nccl_without_torch.py", "hgx-h100-8", mode="inproc",
                         nproc_per_host=2, launcher="mpirun")
    assert v.ok, v.format() + out
    want = [float(2 + i) for i in range(16)]          # max over ranks of rank + 1 + i
    assert res == {r: {"rank": r, "codes": [0, 0], "max": want} for r in (0, 1)}


def test_pynccl_program_agrees_across_modes():
    """The vLLM-style program in procs mode (cuMem fds through the proxy's Unix socket between
    OS processes) and in-process: the same verdict, every rank's numbers checked by the
    program itself (--check)."""
    from commsim.launch.agreement import modes_agree
    from commsim.launch.config import RunConfig
    a = modes_agree(RunConfig(machine="hgx-h100-8", nproc_per_host=2, seed=1, timeout=60,
                              command=[str(PROG), "--check"]))
    assert a.agree, a.text()
    assert all(v.ok for v in a.verdicts.values()), {m: v.format() for m, v in a.verdicts.items()}


DIST_NCCL = PROGRAMS / "dist_nccl.py"


@pytest.mark.parametrize("scenario, args", [
    ("", ["--check"]),             # lazy init at the first all-reduce, every rank's bytes checked
    # no /dev/nvidia-caps: NCCL's multicast create fails init on rank 0 (row MC3), its peers
    # see ncclRemoteError; torch raises both as DistBackendError
    ("scenarios/fidelity/multicast-container-no-caps.toml", []),
])
def test_torch_distributed_nccl_agrees_across_modes(scenario, args):
    """torch.distributed "nccl" (ProcessGroupNCCL over the simulated NCCL) in procs mode and
    in-process: the same verdict."""
    from commsim.launch.agreement import modes_agree
    from commsim.launch.config import RunConfig
    a = modes_agree(RunConfig(machine="" if scenario else "hgx-h100-8", scenario=scenario,
                              nproc_per_host=2, seed=1, timeout=60,
                              command=[str(DIST_NCCL), *args]))
    assert a.agree, a.text()
    assert all(v.ok for v in a.verdicts.values()) == (not scenario), a.text()
