"""Random Driver call sequences on random topologies: nothing escapes, the ledger stays true.

Each example builds a (sliced) preset, places 2-4 processes on random GPUs and runs a random
sequence of legacy-IPC, VMM and memcpy calls with valid and garbage arguments (random ints as
pointers and handles, wrong sizes, wrong flags, other processes' values) and adversarial ones
(inf, nan, floats, huge and negative ints, strs, None, lists, bytes, foreign objects, forged
handle bytes, and stale pointers, handles and fds that were valid once). A small model
tracks what each process holds from the calls that succeeded. After every call:

- the Driver answered with a result tuple whose first element is a cudaError_t (cuda* calls)
  or a CUresult (cu* calls), or it raised exactly what cuda-python's binding raises for that
  argument while converting it (commsim.sim.binding_args; checked against the real binding by
  test_binding_args.py): no other Python exception escapes a Driver call;
- a call that releases something the model says the process does not hold did not succeed;
- each process's ledger agrees with the model: allocations = live cudaMalloc blocks,
  ipc_mapping refcounts = open counts, and so on for mappings, reservations, handles, fds.

At the end every process releases what it holds; then every ledger is empty and the fabric
has no physical allocation left.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commsim.driver import CUresult, HandleType, access_desc, alloc_prop, cudaError_t
from commsim.driver import FdTransportError
from commsim.sim import binding_args
from commsim.topology.presets import build

FD = int(HandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
FABRIC = int(HandleType.CU_MEM_HANDLE_TYPE_FABRIC)
MIB = 1 << 20
GRAN = 2 * MIB
MAP_SLOTS = 64      # candidate map addresses per reservation (see cuMemMap below)

TOPOLOGIES = ("gb200-nvl72:2", "gb200-nvl72:3", "gb200-nvl36x2:10", "gh200-nvl32:3",
              "hgx-h100-8", "dgx-b200-8", "rtx4090-8", "a100-pcie-bridge-8", "l40s-8-pcie")
_CLUSTERS = {t: build(t) for t in TOPOLOGIES}

# What a caller may pass by mistake or malice, beyond wrong integers: the binding converts or
# rejects each of these (binding_args); whatever converts must get a CUDA error code.
ADVERSARIAL = st.sampled_from([math.inf, -math.inf, math.nan, 1.5, -1.0, 4096.7, "4096", "abc",
                               None, [], [1], b"\x00" * 8, True, np.int64(7), np.float64(4096.0),
                               2 ** 64, 2 ** 70, -2 ** 63 - 1, 2 ** 31, -(2 ** 31) - 1])
GARBAGE = st.one_of(st.just(0), st.sampled_from([-1, 1, 2 ** 63 - 1, 2 ** 64 - 1, 0xDEADBEEF]),
                    st.integers(-2 ** 63, 2 ** 64), ADVERSARIAL)
# RuntimeError: a count past its list ("List is too small", binding_args.LIST_COUNTS)
REJECTIONS = (TypeError, ValueError, OverflowError, RuntimeError)
# The simulator (sim, procs) raises exactly what cuda-python's binding raises; the real driver
# answers a code instead (COMMSIM_DEVICE=cuda).
STRICT_ARGS = os.environ.get("COMMSIM_DEVICE", "sim").strip().lower() != "cuda"


def lookup(pool, x, default):
    return pool[int(x)] if held(x, pool) else default


def held(x, pool) -> bool:
    """Whether `x` names something in `pool`: only a true integer can (a float or a bool that
    equals a live value is still not the value)."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool) and int(x) in pool
# sizes: small valid ones, or ones no GPU (or host) could back; nothing in between, so a
# garbage size never commits real host memory
SIZES = st.one_of(st.sampled_from([0, 1, 255, 4096, 65536, MIB, GRAN, 2 * GRAN]),
                  st.integers(-2 ** 63, -1), st.integers(1 << 41, 1 << 64))
VMM_SIZES = st.one_of(st.sampled_from([GRAN, 2 * GRAN, GRAN + 4096, 4096]), SIZES)
COUNTS = st.one_of(st.sampled_from([0, 1, 16, 4096, 65536, GRAN, GRAN + 1]), GARBAGE)


@dataclass
class Proc:
    mallocs: set[int] = field(default_factory=set)
    ipc_open: Counter = field(default_factory=Counter)      # ptr -> refs
    handles: dict[int, int] = field(default_factory=dict)    # vmm handle -> size (0: unknown)
    reservations: dict[int, int] = field(default_factory=dict)
    maps: dict[int, int] = field(default_factory=dict)
    fds: set[int] = field(default_factory=set)

    def pointers(self) -> list[int]:
        return sorted(self.mallocs) + sorted(self.ipc_open) + sorted(self.reservations)


class Run:
    def __init__(self, rig, data):
        self.rig, self.data = rig, data
        self.procs = [Proc() for _ in range(len(rig))]
        self.ipc_handles: list[bytes] = []
        self.fabric_blobs: list[bytes] = []
        self.stale: list = []      # pointers, handles and fds that were valid once
        self.calls = 0
        self.rejected = 0

    # ---- argument strategies drawn against what is live now --------------------------------
    def draw(self, strategy, label):
        return self.data.draw(strategy, label=label)

    def pick(self, pool, label):
        """A value from `pool` (if any), a stale one, a forged handle, or garbage."""
        pool = list(pool)
        which = self.draw(st.integers(0, 7), f"{label}: pool?")
        if pool and which > 2:
            return self.draw(st.sampled_from(pool), label)
        if which == 2 and self.stale:
            return self.draw(st.sampled_from(self.stale), f"{label}: stale")
        if which == 1 and pool and isinstance(pool[0], bytes):
            return self.forge(self.draw(st.sampled_from(pool), f"{label}: to forge"))
        return self.draw(GARBAGE, f"{label}: garbage")

    def forge(self, blob: bytes) -> bytes:
        """Handle bytes changed where a forger would: the allocation id, the GPU field (GPU
        65535 of the process-mode layout), the checksum, or all of it random."""
        how = self.draw(st.sampled_from(["id", "gpu", "pad", "random", "short"]), "forge")
        b = bytearray(blob)
        if how == "id":
            b[8] ^= 0x5A
        elif how == "gpu":
            b[32:34] = b"\xff\xff"
        elif how == "pad":
            b[-1] ^= 0xFF
        elif how == "random":
            return self.draw(st.binary(min_size=64, max_size=64), "random handle")
        else:
            return bytes(b[:63])
        return bytes(b)

    def valid(self, good, label, bad=GARBAGE):
        """Mostly a value from `good` (a strategy), sometimes garbage."""
        if self.draw(st.integers(0, 3), f"{label}: valid?") > 0:
            return self.draw(good, label)
        return self.draw(bad, f"{label}: garbage")

    def ptr(self, i, label="ptr"):
        mine = self.procs[i].pointers()
        others = [p for j, q in enumerate(self.procs) if j != i for p in q.pointers()]
        which = self.draw(st.integers(0, 5), f"{label}: source")
        if which <= 2 and mine:
            p = self.draw(st.sampled_from(mine), label)
            return p + self.draw(st.sampled_from([0, 0, 0, 16, 4096, GRAN]), f"{label}: offset")
        if which == 3 and others:
            return self.draw(st.sampled_from(others), label)
        return self.draw(GARBAGE, f"{label}: garbage")

    # ---- one call ------------------------------------------------------------------------
    def call(self, i, name, *args):
        d = self.rig[i]
        self.calls += 1
        try:
            res = getattr(d, name)(*args)
        except REJECTIONS as e:
            # Only what the real binding raises while converting these very arguments; an
            # exception from inside the simulator (or of another type) fails the test.
            try:
                binding_args.convert(name, args)
            except REJECTIONS as want:
                assert type(e) is type(want), f"{name}{args!r}: {e!r}, the binding raises {want!r}"
                self.rejected += 1
                return False, (None, None)
            raise AssertionError(f"{name}{args!r} raised {e!r} from inside the driver; the "
                                 f"binding accepts these arguments") from e
        try:
            binding_args.convert(name, args)
        except REJECTIONS as want:
            # Both drivers raise as the binding does (device/driver.py converts with
            # binding_args too); a rig whose driver does not is answered here.
            assert not STRICT_ARGS, (f"{name}{args!r} answered {res!r} where the "
                                     f"binding raises {want!r}")
            assert int(res[0]) != 0, f"{name}{args!r} succeeded where the binding raises {want!r}"
        assert isinstance(res, tuple) and res, f"{name}{args!r} returned {res!r}"
        want = cudaError_t if name.startswith("cuda") else CUresult
        assert type(res[0]) is want, f"{name}{args!r}: first element {res[0]!r} is not {want.__name__}"
        return int(res[0]) == 0, res

    def step(self):
        n = len(self.procs)
        i = self.draw(st.integers(0, n - 1), "process")
        p = self.procs[i]
        d = self.rig[i]
        op = self.draw(st.sampled_from(OPS), "op")
        if op in CHAINS:
            getattr(self, op)(i)
        elif op == "cudaMalloc":
            ok, res = self.call(i, op, self.valid(st.sampled_from([0, 1, 4096, 65536, GRAN]), "size",
                                                  SIZES))
            if ok:
                p.mallocs.add(res[1])
        elif op == "cudaFree":
            ptr = self.pick(p.mallocs, "free ptr") if self.draw(st.booleans(), "own") else self.ptr(i)
            ok, _ = self.call(i, op, ptr)
            if held(ptr, p.mallocs):
                assert ok, f"cudaFree of a live block {ptr:#x} failed"
                p.mallocs.discard(ptr)
                self.stale.append(ptr)
            elif ok:
                # cudaFree(0) and what the binding turns into 0 (None, 0.5) are no-ops
                assert binding_args.dev_ptr(ptr) == 0, f"cudaFree({ptr!r}) of nothing held: {ok}"
        elif op == "cudaIpcGetMemHandle":
            ok, res = self.call(i, op, self.ptr(i))
            if ok:
                assert isinstance(res[1], bytes) and len(res[1]) == 64
                self.ipc_handles.append(res[1])
        elif op == "cudaIpcOpenMemHandle":
            h = self.pick(self.ipc_handles, "ipc handle")
            flags = self.valid(st.just(1), "flags")
            ok, res = self.call(i, op, h, flags)
            if ok:
                p.ipc_open[res[1]] += 1
        elif op == "cudaIpcCloseMemHandle":
            ptr = self.pick(p.ipc_open, "close ptr")
            ok, _ = self.call(i, op, ptr)
            assert ok == held(ptr, p.ipc_open), f"close({ptr!r}): {ok}, model {dict(p.ipc_open)}"
            if ok:
                p.ipc_open[ptr] -= 1
                if not p.ipc_open[ptr]:
                    del p.ipc_open[ptr]
                    self.stale.append(ptr)
        elif op == "cuMemCreate":
            types = self.valid(st.sampled_from([0, FD, FABRIC, FD | FABRIC]), "types")
            n_dev = int(d.cudaGetDeviceCount()[1])
            dev = self.valid(st.integers(0, n_dev - 1), "dev")
            size = self.valid(st.sampled_from([GRAN, 2 * GRAN]), "size", VMM_SIZES)
            ok, res = self.call(i, op, size, _prop(dev, types), 0)
            if ok:
                p.handles[res[1]] = size
        elif op == "cuMemExportToShareableHandle":
            h = self.pick(p.handles, "export handle")
            t = self.valid(st.sampled_from([FD, FABRIC]), "type")
            ok, res = self.call(i, op, h, t, 0)
            if ok:
                assert held(h, p.handles)
                # The handle type is read with int() (driver_calls._attr_int), as the binding
                # reads an enum argument: 1.5 exports a POSIX fd.
                if int(t) == FD:
                    p.fds.add(res[1])
                else:
                    self.fabric_blobs.append(res[1])
        elif op == "pass_fd":
            j = self.draw(st.integers(0, n - 1), "to")
            fd = self.pick(p.fds, "fd")
            try:
                got = self.rig.pass_fd(i, fd, j)
            except FdTransportError:
                assert not held(fd, p.fds) or self.rig[i].gethostname() != self.rig[j].gethostname()
            else:
                assert held(fd, p.fds)
                self.procs[j].fds.add(got)
        elif op == "close_fd":
            fd = self.pick(p.fds, "fd")
            if not STRICT_ARGS and not held(fd, p.fds) and held(fd, range(1024)):
                fd = -1        # the real driver's os.close would close a real fd of the rig
            try:
                rc = self.rig.close_fd(i, fd)
            except (TypeError, OverflowError):
                # os.close's own refusal of a non-integer or one past a C int: never a live fd
                assert not held(fd, p.fds) and not (isinstance(fd, int) and abs(fd) < 2 ** 31)
            else:
                assert (rc == 0) == held(fd, p.fds)
                if rc == 0:
                    p.fds.discard(fd)
                    self.stale.append(fd)
        elif op == "cuMemImportFromShareableHandle":
            if self.draw(st.booleans(), "fd?"):
                ok, res = self.call(i, op, self.pick(p.fds, "fd"), self.valid(st.just(FD), "type"))
            else:
                ok, res = self.call(i, op, self.pick(self.fabric_blobs, "blob"),
                                    self.valid(st.just(FABRIC), "type"))
            if ok:
                p.handles[res[1]] = 0   # size of the exporter's allocation: not known here
        elif op == "cuMemAddressReserve":
            size = self.valid(st.sampled_from([GRAN, 2 * GRAN, 4 * GRAN, 4096]), "size", SIZES)
            align = self.valid(st.sampled_from([0, GRAN]), "align")
            ok, res = self.call(i, op, size, align, 0, 0)
            if ok:
                p.reservations[res[1]] = size
        elif op == "cuMemMap":
            # Only the first slots of each reservation: a garbage size can reserve TiBs of VA
            # (legal), and listing every 2 MiB slot of that once took 23 GB and an OOM kill.
            free_va = [b + off for b, sz in p.reservations.items()
                       for off in range(0, min(sz, MAP_SLOTS * GRAN), GRAN)
                       if not any(m <= b + off < m + ms for m, ms in p.maps.items())]
            ptr = self.valid(st.sampled_from(free_va), "map ptr") if free_va else self.ptr(i)
            h = self.pick(p.handles, "map handle")
            size = self.valid(st.just(lookup(p.handles, h, 0) or GRAN), "size", VMM_SIZES)
            off = self.valid(st.just(0), "offset", st.sampled_from([GRAN, 4096, -1]))
            ok, _ = self.call(i, op, ptr, size, off, h, 0)
            if ok:
                assert held(h, p.handles) and any(b <= ptr and ptr + size <= b + s
                                                  for b, s in p.reservations.items())
                assert not any(m < ptr + size and ptr < m + ms for m, ms in p.maps.items())
                p.maps[ptr] = size
        elif op == "cuMemSetAccess":
            ptr = self.pick(p.maps, "access ptr")
            size = lookup(p.maps, ptr, None)
            size = self.draw(COUNTS, "size") if size is None else size
            dev = self.valid(st.integers(0, 3), "dev")
            desc = [access_desc(0)] if dev == 0 else self.draw(st.sampled_from(
                [[], None, [object()], [_desc(dev)]]), "desc")
            self.call(i, op, ptr, size, desc, self.draw(st.sampled_from([1, 0, 5, -1]), "count"))
        elif op == "cuMemUnmap":
            ptr = self.pick(p.maps, "unmap ptr")
            size = lookup(p.maps, ptr, 0) if self.draw(st.booleans(), "right size") else self.draw(COUNTS, "size")
            ok, _ = self.call(i, op, ptr, size)
            assert ok == (held(ptr, p.maps) and held(size, {p.maps[ptr]})), \
                f"unmap({ptr!r}, {size!r}): {ok}"
            if ok:
                del p.maps[ptr]
        elif op == "cuMemRelease":
            h = self.pick(p.handles, "release handle")
            ok, _ = self.call(i, op, h)
            assert ok == held(h, p.handles), f"release({h!r}): {ok}"
            if ok:
                p.handles.pop(h, None)
                self.stale.append(h)
        elif op == "cuMemAddressFree":
            ptr = self.pick(p.reservations, "free va")
            size = lookup(p.reservations, ptr, 0) if self.draw(st.booleans(), "right size") else self.draw(COUNTS, "size")
            ok, _ = self.call(i, op, ptr, size)
            if ok:
                assert held(ptr, p.reservations) and p.reservations[ptr] == size
                assert not any(ptr <= b < ptr + size for b in p.maps), "freed VA that is still mapped"
                del p.reservations[ptr]
        elif op == "cudaMemcpy":
            kind = self.valid(st.sampled_from([0, 1, 2, 3, 4]), "kind")
            self.call(i, op, self.ptr(i, "dst"), self.ptr(i, "src"), self.draw(COUNTS, "count"), kind)
        elif op == "cudaMemset":
            self.call(i, op, self.ptr(i), self.draw(GARBAGE, "value"), self.draw(COUNTS, "count"))
        elif op == "cudaSetDevice":
            self.call(i, op, self.valid(st.integers(0, 8), "device"))
        else:  # pragma: no cover
            raise AssertionError(op)
        self.check_ledgers()

    # ---- valid chains (so deep states are reached; each call is still checked) -----------
    def _model_after(self, i, name, ok, res, args):
        p = self.procs[i]
        if not ok:
            return
        if name == "cudaMalloc":
            p.mallocs.add(res[1])
        elif name == "cudaIpcOpenMemHandle":
            p.ipc_open[res[1]] += 1
        elif name == "cuMemCreate":
            p.handles[res[1]] = args[0]
        elif name == "cuMemImportFromShareableHandle":
            p.handles[res[1]] = 0
        elif name == "cuMemAddressReserve":
            p.reservations[res[1]] = args[0]
        elif name == "cuMemMap":
            p.maps[args[0]] = args[1]
        elif name == "cuMemExportToShareableHandle":
            (p.fds.add(res[1]) if int(args[1]) == FD else self.fabric_blobs.append(res[1]))
        elif name == "cudaIpcGetMemHandle":
            self.ipc_handles.append(res[1])

    def do(self, i, name, *args):
        ok, res = self.call(i, name, *args)
        self._model_after(i, name, ok, res, args)
        return ok, res

    def chain_map(self, i, h=None, size=GRAN):
        """reserve + map + set access of a handle (a fresh one unless given)."""
        d = self.rig[i]
        if h is None:
            dev = int(d.cudaGetDevice()[1])
            types = self.draw(st.sampled_from([0, FD, FABRIC]), "chain types")
            ok, res = self.do(i, "cuMemCreate", size, alloc_prop(dev, types), 0)
            if not ok:
                return None
            h = res[1]
        ok, res = self.do(i, "cuMemAddressReserve", size, 0, 0, 0)
        ptr = res[1]
        ok, _ = self.do(i, "cuMemMap", ptr, size, 0, h, 0)
        if ok:
            self.do(i, "cuMemSetAccess", ptr, size, [access_desc(int(d.cudaGetDevice()[1]))], 1)
        return h

    def chain_ipc(self, i):
        """malloc in i, handle, open in a random other process."""
        ok, res = self.do(i, "cudaMalloc", self.draw(st.sampled_from([4096, 65536]), "ipc size"))
        ok, res = self.do(i, "cudaIpcGetMemHandle", res[1])
        j = self.draw(st.integers(0, len(self.procs) - 1), "ipc importer")
        self.do(j, "cudaIpcOpenMemHandle", res[1], 1)

    def chain_share(self, i):
        """create + export (fd or fabric) in i; import and map in another process."""
        h = self.chain_map(i)
        if h is None:
            return
        j = self.draw(st.integers(0, len(self.procs) - 1), "share importer")
        if self.draw(st.booleans(), "fd?"):
            ok, res = self.do(i, "cuMemExportToShareableHandle", h, FD, 0)
            if not ok:
                return
            try:
                fd = self.rig.pass_fd(i, res[1], j)
            except FdTransportError:
                return
            self.procs[j].fds.add(fd)
            ok, res = self.do(j, "cuMemImportFromShareableHandle", fd, FD)
        else:
            ok, res = self.do(i, "cuMemExportToShareableHandle", h, FABRIC, 0)
            if not ok:
                return
            ok, res = self.do(j, "cuMemImportFromShareableHandle", res[1], FABRIC)
        if ok:
            self.chain_map(j, res[1])

    # ---- invariants ----------------------------------------------------------------------
    def check_ledgers(self):
        for i, p in enumerate(self.procs):
            led = self.rig.ledger(i)
            got = {k: led.count(k) for k in ("allocation", "ipc_mapping", "vmm_mapping",
                                             "reservation", "exported_fd")}
            got["handles"] = led.count("vmm_handle") + led.count("imported_handle")
            want = {"allocation": len(p.mallocs), "ipc_mapping": sum(p.ipc_open.values()),
                    "vmm_mapping": len(p.maps), "reservation": len(p.reservations),
                    "exported_fd": len(p.fds), "handles": len(p.handles)}
            assert got == want, f"process {i}: ledger {got} != model {want}\n{led.report()}"
            refs = sorted(it.refs for it in led if it.kind == "ipc_mapping")
            assert refs == sorted(p.ipc_open.values()), f"process {i}: ipc refcounts {refs}"

    def teardown(self):
        for i, p in enumerate(self.procs):
            d = self.rig[i]
            for ptr, refs in list(p.ipc_open.items()):
                for _ in range(refs):
                    assert d.cudaIpcCloseMemHandle(ptr)[0] == 0
            for ptr, size in p.maps.items():
                assert int(d.cuMemUnmap(ptr, size)[0]) == 0
            for ptr, size in p.reservations.items():
                assert int(d.cuMemAddressFree(ptr, size)[0]) == 0
            for h in p.handles:
                assert int(d.cuMemRelease(h)[0]) == 0
            for fd in p.fds:
                assert self.rig.close_fd(i, fd) == 0
        for i, p in enumerate(self.procs):
            for ptr in p.mallocs:
                assert int(self.rig[i].cudaFree(ptr)[0]) == 0
            self.procs[i] = Proc()
        self.check_ledgers()
        for i in range(len(self.procs)):
            assert self.rig.held(i) == {}, self.rig.ledger(i).report()
        assert self.rig.live_allocs() == 0, f"physical allocations left: {sorted(self.rig.fabric.allocs)}"


CHAINS = ("chain_map", "chain_ipc", "chain_share")
OPS = CHAINS + CHAINS + ("cudaMalloc", "cudaMalloc", "cudaFree", "cudaIpcGetMemHandle", "cudaIpcGetMemHandle",
       "cudaIpcOpenMemHandle", "cudaIpcOpenMemHandle", "cudaIpcCloseMemHandle", "cuMemCreate",
       "cuMemCreate", "cuMemExportToShareableHandle", "cuMemExportToShareableHandle", "pass_fd",
       "close_fd", "cuMemImportFromShareableHandle", "cuMemImportFromShareableHandle",
       "cuMemAddressReserve", "cuMemMap", "cuMemMap", "cuMemSetAccess", "cuMemUnmap",
       "cuMemRelease", "cuMemAddressFree", "cudaMemcpy", "cudaMemset", "cudaSetDevice")


def _prop(dev, types):
    """A CUmemAllocationProp, or, where cuda-python itself refuses the values (a device
    ordinal past a C long, a handle-type mask that is no single enum member such as
    FD|FABRIC), something that is no prop at all: the driver must still answer a code."""
    try:
        return alloc_prop(dev, types)
    except (OverflowError, ValueError, TypeError):
        return types


def _desc(dev):
    try:
        return access_desc(dev)
    except (OverflowError, ValueError, TypeError):
        return object()


@st.composite
def placements(draw):
    topo = draw(st.sampled_from(TOPOLOGIES), label="topology")
    c = _CLUSTERS[topo]
    n = draw(st.integers(2, 4), label="processes")
    place = []
    for _ in range(n):
        h = draw(st.integers(0, len(c.hosts) - 1), label="host")
        place.append((h, draw(st.integers(0, len(c.hosts[h].gpus) - 1), label="gpu")))
    return topo, place


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(setup=placements(), data=st.data())
def test_random_call_sequences(setup, data, rig_factory):
    topo, place = setup
    rig = rig_factory(_CLUSTERS[topo], place)
    run = Run(rig, data)
    for _ in range(data.draw(st.integers(5, 60), label="steps")):
        run.step()
    run.teardown()
