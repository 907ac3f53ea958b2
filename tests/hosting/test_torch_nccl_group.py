"""torch.distributed "nccl" groups of in-process hosted ranks beyond the collectives of the
fault table (test_nccl_machine_faults.py): what get_backend answers, CPU tensors on a pure
"nccl" group, list all_gather and object collectives over the simulated NCCL, and eager
init with `device_id` (torch 2.13.0 torch/distributed/distributed_c10d.py; rules NC18, NC26)."""

import pytest
import torch

import sim_ranks as S
from sim_ranks import module_surfaces  # noqa: F401  (fixture)

from commsim.hosting.install.registry import install_all
from commsim.hosting.surfaces.nccl import comm as nc
import commsim.scenario.faults  # noqa: F401  (registers the fault kinds)
from commsim.scenario.fault_registry import apply_machine_fault
from commsim.scenario.model import Fault

H100 = "hgx-h100-8"


@pytest.fixture(scope="module")
def hosting(module_surfaces):
    install_all()


def _run(body, n=2, mutate=None):
    _, ranks = S.ranks(H100, [(0, i) for i in range(n)], mutate=mutate)
    for r in ranks:
        r.mode = "inproc"
    outs = S.run(ranks, body)
    for o in outs:
        if o.error is not None:
            raise o.error
    return [o.value for o in outs]


def _comms() -> int:
    """The rank's live NCCL communicators (ProcessGroupNCCL's, through libnccl)."""
    return sum(c.alive for c in nc.state(S.session.hosted()).comms.values())


def test_get_backend_names_the_groups_backend(hosting):
    """get_backend returns Backend(pg_map[pg][0]): the backend as asked, lower case."""
    def body(g):
        import torch.distributed as dist
        dist.init_process_group("nccl")
        mixed = dist.new_group([0, 1], backend="cpu:gloo,cuda:NCCL")
        gloo = dist.new_group([0, 1], backend="gloo")
        out = (dist.get_backend(), dist.get_backend(mixed), dist.get_backend(gloo))
        dist.destroy_process_group()
        return out
    assert _run(body) == [("nccl", "cpu:gloo,cuda:nccl", "gloo")] * 2


def test_cpu_tensors_on_a_pure_nccl_group_are_refused(hosting):
    """ProcessGroup has no backend for CPU on a "nccl" group (torch's RuntimeError); a
    "cpu:gloo,cuda:nccl" group serves the same tensor by gloo."""
    def body(g):
        import torch.distributed as dist
        dist.init_process_group("nccl")
        mixed = dist.new_group([0, 1], backend="cpu:gloo,cuda:nccl")
        x = torch.ones(4)
        try:
            dist.all_reduce(x)
            refused = None
        except RuntimeError as e:
            refused = str(e)
        dist.all_reduce(x, group=mixed)
        dist.destroy_process_group()
        return refused, x.tolist(), _comms()
    assert _run(body) == [("No backend type associated with device type cpu", [2.0] * 4, 0)] * 2


def test_list_all_gather_and_object_collectives_go_through_nccl(hosting):
    """On a pure "nccl" group torch pickles objects into CUDA tensors on the current device
    and moves them with the group's collectives (all_gather_object: two all_gathers;
    broadcast_object_list: two broadcasts), so they make the group's NCCL communicator;
    all_gather into a list is ncclAllGather (even sizes) or one broadcast per rank (uneven)."""
    def body(g):
        import torch.distributed as dist
        torch.cuda.set_device(g.rank)
        dist.init_process_group("nccl")
        got = [None] * g.size
        dist.all_gather_object(got, {"rank": g.rank, "pad": "x" * (7 * g.rank)})
        made = _comms()
        objs = [f"from root {g.rank}", g.rank] if g.rank == 1 else [None, None]
        dist.broadcast_object_list(objs, src=1)
        t = torch.full((3,), float(g.rank + 1), device="cuda")
        even = [torch.empty(3, device="cuda") for _ in range(g.size)]
        dist.all_gather(even, t)
        mine = torch.arange(g.rank + 1, dtype=torch.float32, device="cuda")
        uneven = [torch.empty(i + 1, device="cuda") for i in range(g.size)]
        dist.all_gather(uneven, mine)
        dist.destroy_process_group()
        return (made, got, objs, [e.cpu().tolist() for e in even],
                [u.cpu().tolist() for u in uneven])
    want = (1, [{"rank": 0, "pad": ""}, {"rank": 1, "pad": "x" * 7}], ["from root 1", 1],
            [[1.0] * 3, [2.0] * 3], [[0.0], [0.0, 1.0]])
    assert _run(body) == [want] * 2


def test_eager_init_with_device_id_makes_the_communicator_at_init(hosting):
    """init_process_group(device_id=...) connects at the call (eagerConnectSingleDevice):
    the communicator exists before any collective, and a machine whose NCCL init fails (no
    /dev/nvidia-caps, row MC3, three GPUs so NVLS is tried) fails init_process_group itself
    with DistBackendError; without device_id the same machine fails only the first
    collective."""
    no_caps = Fault("no_nvidia_caps", host="hgx-h100-0")

    def body(eager):
        def run(g):
            import torch.distributed as dist
            dev = torch.device("cuda", g.rank)
            torch.cuda.set_device(dev)
            try:
                dist.init_process_group("nccl", **({"device_id": dev} if eager else {}))
            except dist.DistBackendError as e:
                return "init", str(e).splitlines()[1]
            made = _comms()
            try:
                dist.all_reduce(torch.ones(2, device=dev))
            except dist.DistBackendError as e:
                return "all_reduce", made
            finally:
                dist.destroy_process_group()
            return "ok", made
        return run

    assert _run(body(True), n=3) == [("ok", 1)] * 3
    failing = lambda c: apply_machine_fault(c, no_caps)  # noqa: E731
    got = _run(body(True), n=3, mutate=failing)
    assert got[0] == ("init", "ncclUnhandledCudaError: Call to CUDA function failed."), got
    assert all(g[0] == "init" for g in got), got
    assert _run(body(False), n=3, mutate=failing) == [("all_reduce", 0)] * 3


def test_new_group_of_an_eager_world_splits_its_communicator(hosting):
    """With device_id the world's communicator exists at init, so new_group splits the new
    group's from it (ncclCommSplit): every world rank calls it, rank 2 with
    NCCL_SPLIT_NOCOLOR, and ranks 0-1 hold the new communicator right after new_group, before
    any collective on it. Without device_id the new group's communicator waits for its first
    collective (ncclCommInitRank then)."""
    def body(eager):
        def run(g):
            import torch.distributed as dist
            dev = torch.device("cuda", g.rank)
            torch.cuda.set_device(dev)
            dist.init_process_group("nccl", **({"device_id": dev} if eager else {}))
            pair = dist.new_group([0, 1])
            made = _comms()
            x = torch.full((4,), float(g.rank + 1), device=dev)
            if g.rank < 2:
                dist.all_reduce(x, group=pair)
            dist.destroy_process_group()
            return made, x.cpu().tolist()
        return run
    assert _run(body(True), n=3) == [(2, [3.0] * 4), (2, [3.0] * 4), (1, [3.0] * 4)]
    assert _run(body(False), n=3) == [(0, [3.0] * 4), (0, [3.0] * 4), (0, [3.0] * 4)]


def test_nccl_comm_split_through_the_c_api(hosting):
    """ncclCommSplit: colors and keys all-gathered over the parent, a color's ranks ordered
    by key, NCCL_SPLIT_NOCOLOR gets NULL, a negative color ncclInvalidArgument
    (src/init.cc commGetSplitInfo, v2.27.3-1)."""
    import ctypes
    from commsim.hosting.surfaces.nccl import libnccl

    def body(g):
        from test_nccl_ctypes import _init, _lib
        lib = _lib()
        _, comm = _init(lib, g)
        bad = ctypes.c_void_p()
        refused = lib.ncclCommSplit(comm, -5, 0, ctypes.byref(bad), None)
        new = ctypes.c_void_p()
        color = libnccl.SPLIT_NOCOLOR if g.rank == 3 else g.rank % 2
        assert lib.ncclCommSplit(comm, color, -g.rank, ctypes.byref(new), None) == 0
        rank, count = ctypes.c_int(-1), ctypes.c_int(-1)
        if new.value:
            lib.ncclCommUserRank(new, ctypes.byref(rank))
            lib.ncclCommCount(new, ctypes.byref(count))
            lib.ncclCommDestroy(new)
        lib.ncclCommDestroy(comm)
        return refused, new.value is not None, rank.value, count.value
    # colors: ranks 0, 2 -> 0 (keys 0, -2: rank 2 first); 1 -> 1 alone; 3 no color
    assert _run(body, n=4) == [(4, True, 1, 2), (4, True, 0, 1), (4, True, 0, 2), (4, False, -1, -1)]
