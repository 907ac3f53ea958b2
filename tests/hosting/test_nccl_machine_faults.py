"""The simulated NCCL (commsim/libmodels/nccl/) through the ctypes libnccl surface and through
hosted torch.distributed "nccl" (ProcessGroupNCCL, torch_distributed/pg_nccl.py), in-process
ranks on small machines: the driver calls its init makes, and each machine fault class's
outcome with the NCCL v2.27.3-1 rule it follows (file cited per row). The faults are edits of
the machine (the scenario fault registry); the NCCL code never names them: they reach it
through the driver's answers. The fault table runs every row through both surfaces: torch
raises what the C call returned (DistBackendError with its text and ncclGetLastError) at the
first collective, where ProcessGroupNCCL makes its communicator."""

import ctypes

import numpy as np
import pytest
import torch

import sim_ranks as S
from sim_ranks import module_surfaces  # noqa: F401  (fixture)
from test_nccl_ctypes import P, UniqueId, _init, _lib

from commsim.hosting.install.registry import install_all
from commsim.hosting.surfaces.nccl import comm as nc
from commsim.hosting.surfaces.nccl.libnccl import ERROR_STRINGS
from commsim.hosting.surfaces.torch_distributed.pg_nccl import CHECK_SITE, DETAILS
from commsim.runtime.diagnosis import HangDetected
import commsim.scenario.faults  # noqa: F401  (registers the fault kinds)
from commsim.scenario.fault_registry import apply_machine_fault, arm_driver_faults, is_driver_fault
from commsim.scenario.model import Fault

H100 = "hgx-h100-8"


def _mutate(*faults: Fault):
    def edit(c):
        for f in faults:
            if not is_driver_fault(f):
                c = apply_machine_fault(c, f)
        return c
    return edit


def _ranks(spec, placement, *faults: Fault):
    """The machine with the faults: machine edits applied, driver faults armed on their rank."""
    fabric, ranks = S.ranks(spec, placement, mutate=_mutate(*faults))
    for r in ranks:
        r.driver.proc.faults = arm_driver_faults(faults, r.rank)
    return fabric, ranks


def _body(g):
    """Init, one float32 all-reduce of rank-dependent values; what NCCL did."""
    lib = _lib()
    code, comm = _init(lib, g)
    lib.ncclGetLastError.restype = ctypes.c_char_p
    if code:
        return {"init": code, "last": lib.ncclGetLastError(None).decode()}
    st = nc.state(S.session.hosted())
    nccl = st.comms[comm.value].nccl
    x = torch.arange(1024, dtype=torch.float32, device="cuda") + g.rank
    ar = lib.ncclAllReduce(x.data_ptr(), x.data_ptr(), 1024, 7, 0, comm, None)
    want = sum(np.arange(1024, dtype=np.float32) + r for r in range(g.size))
    out = {"init": 0, "via": sorted(set(nccl.transports().values())), "nvls": nccl.nvls_note,
           "ar": ar, "exact": bool(np.array_equal(x.cpu().numpy(), want)),
           "trace": [a for a, _ in nccl.calls.trace]}
    if ar:
        out["last"] = lib.ncclGetLastError(None).decode()
    assert lib.ncclCommDestroy(comm) == 0
    return out


def _run(spec, placement, *faults, env=None, monkeypatch=None):
    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v)
    fabric, ranks = _ranks(spec, placement, *faults)
    outs = S.run(ranks, _body)
    return fabric, ranks, outs


def _values(outs):
    for o in outs:
        if o.error is not None:
            raise o.error
    return [o.value for o in outs]


def test_init_trace_lists_the_cuMem_and_multicast_calls(module_surfaces):
    """cuMem on (auto, src/misc/cudawrap.cc): P2P buffers are cuMemCreate'd, exported as POSIX
    fds through the proxy and imported by the peer (src/transport/p2p.cc); NVLS creates,
    joins, binds and maps a multicast object (src/transport/nvls.cc)."""
    fabric, ranks, outs = _run(H100, [(0, 0), (0, 1), (0, 2)])
    a, b, _ = _values(outs)
    assert a["via"] == ["P2P/CUMEM"] and a["exact"] and a["ar"] == 0
    for api in ("cuMemCreate", "cuMemExportToShareableHandle", "sendmsg(SCM_RIGHTS)",
                "cuMemImportFromShareableHandle", "cuMemMap", "cuMemSetAccess",
                "cuMulticastCreate", "cuMulticastAddDevice", "cuMulticastBindMem"):
        assert api in a["trace"], api
    assert "cuMulticastCreate" not in b["trace"] and "cuMulticastAddDevice" in b["trace"]
    assert a["nvls"].startswith("NVLS on")
    # ncclCommDestroy released what set-up made: every process's ledger is zero
    # what is left is the program's own tensors: set-up's cuMem, fds and multicast are gone
    assert {it.kind for r in ranks for it in r.driver.ledger} == {"allocation"}


def test_cumem_off_uses_legacy_ipc(module_surfaces, monkeypatch):
    """NCCL_CUMEM_ENABLE=0: cudaIpcGetMemHandle / cudaIpcOpenMemHandle (src/transport/p2p.cc)."""
    _, _, outs = _run(H100, [(0, 0), (0, 1)], env={"NCCL_CUMEM_ENABLE": "0"}, monkeypatch=monkeypatch)
    a, _ = _values(outs)
    assert a["via"] == ["P2P/IPC"] and a["exact"]
    assert "cudaIpcGetMemHandle" in a["trace"] and "cudaIpcOpenMemHandle" in a["trace"]
    assert "cuMemCreate" not in a["trace"]


PAIR = dict(host="hgx-h100-0", gpus=(0, 1))

# (id, machine fault(s), env, expected per rank 0) -- rule and source in the comment.
CASES = [
    # P2P disabled: cudaDeviceCanAccessPeer = 0, p2pCanConnect refuses (src/transport/p2p.cc),
    # SHM carries the pair (src/transport/shm.cc), exact.
    ("p2p_disabled", [Fault("p2p_disabled", **PAIR)], {},
     {"via": ["P2P/CUMEM", "SHM/direct/direct"], "exact": True}),
    # One container per process: own /dev/shm (shmDev differs, src/transport/shm.cc) and the
    # model's NET (NVIDIA/nccl#1647): exact over the network.
    ("container_per_process", [Fault("container_per_process", host="hgx-h100-0")], {},
     {"via": ["NET/Socket/0"], "exact": True}),
    # P2P reported but the legacy IPC open refused (ACS): NCCL keeps P2P and its
    # cudaIpcOpenMemHandle fails: CUDACHECK, ncclUnhandledCudaError (src/transport/p2p.cc),
    # at the first collective, where 2.22+ connects (NCCL_RUNTIME_CONNECT, comm.py) ...
    ("p2p_ipc_refused", [Fault("p2p_ipc_refused", cause="acs", **PAIR)], {"NCCL_CUMEM_ENABLE": "0"},
     {"init": 0, "ar": 1, "last": "Cuda failure 'peer access is not supported between these two devices'"}),
    # ... and at init under NCCL_RUNTIME_CONNECT=0 (every connection made by ncclCommInitRank).
    ("p2p_ipc_refused_eager", [Fault("p2p_ipc_refused", cause="acs", **PAIR)],
     {"NCCL_CUMEM_ENABLE": "0", "NCCL_RUNTIME_CONNECT": "0"},
     {"init": 1, "last": "Cuda failure 'peer access is not supported between these two devices'"}),
    # Corrupted peer writes: every call succeeds, the flag lands, the data does not: a wrong
    # result (row P3 of the driver; NCCL has no check of its own).
    ("p2p_writes_corrupt", [Fault("p2p_writes_lost", cause="corrupt", **PAIR)], {},
     {"via": ["P2P/CUMEM"], "ar": 0, "exact": False}),
    # No /dev/nvidia-caps: cuMulticastCreate answers CUDA_ERROR_INVALID_VALUE (row MC3);
    # nvlsGroupCreate's CUCHECK fails init (src/transport/nvls.cc): ncclUnhandledCudaError.
    ("no_nvidia_caps", [Fault("no_nvidia_caps", host="hgx-h100-0")], {},
     {"init": 1, "last": "Cuda failure 1 'invalid argument'"}),
    # No NVSwitch multicast: the attribute is 0, ncclNvlsInit leaves NVLS off; P2P exact.
    # Dropped peer writes: every call succeeds, the flag never lands, the receiver waits: a
    # diagnosed hang naming NCCL, the collective and the pair's transport.
    ("p2p_writes_dropped", [Fault("p2p_writes_lost", cause="dropped", **PAIR)], {},
     {"hang": "over P2P/CUMEM"}),
    ("no_multicast", [Fault("no_multicast", gpu=S.GpuRef("hgx-h100-0", 0))], {},
     {"via": ["P2P/CUMEM"], "exact": True}),
    # One GPU visible per process (Ray): NCCL finds its peers by bus id over NVML, cuMem
    # fds go through the proxy socket as before (src/transport/p2p.cc): P2P, exact.
    ("one_gpu_per_process", [Fault("one_gpu_per_process", host="hgx-h100-0")], {},
     {"via": ["P2P/CUMEM"], "exact": True}),
    # No pidfd_getfd: NCCL passes cuMem fds over its proxy's Unix socket (SCM_RIGHTS,
    # src/proxy.cc), never pidfd_getfd: unaffected, exact.
    ("pidfd_getfd_denied", [Fault("pidfd_getfd_denied", host="hgx-h100-0")], {},
     {"via": ["P2P/CUMEM"], "exact": True}),
    # Two GB200 trays, the first without /dev/nvidia-caps-imex-channels: MNNVL's own FABRIC
    # export fails there (row I1), ncclMnnvlCheck's WARN and ncclSystemError at init
    # (src/mnnvl.cc); the other tray's rank loses its peer: ncclRemoteError.
    ("no_imex_channel_device", [Fault("no_imex_channel_device", host="gb200-nvl72-tray00")], {},
     {"init": 2, "last": "MNNVL (cliqueSize 2) is available but not working on this system. "
                         "Check the IMEX channel configuration (/dev/nvidia-caps-imex-channels). "
                         "Set NCCL_MNNVL_ENABLE=0 to ignore this issue."}),
    # Two GB200 trays in different IMEX domains: MNNVL's own check passes on each tray
    # (src/mnnvl.cc imports its own handle), but a FABRIC handle from the other tray is
    # refused (CUDA_ERROR_NOT_PERMITTED, row I3): NVLS's multicast import at init on the
    # tray that imports it (ncclUnhandledCudaError; its peer ncclRemoteError) ...
    ("imex_split", [Fault("imex_split", hosts=("gb200-nvl72-tray01",))], {},
     ({"init": 6}, {"init": 1, "last": "Cuda failure 800 'operation not permitted'"})),
    # ... and without NVLS the P2P buffer's import at the first collective, on both.
    ("imex_split_no_nvls", [Fault("imex_split", hosts=("gb200-nvl72-tray01",))],
     {"NCCL_NVLS_ENABLE": "0"}, ({"init": 0, "ar": 1, "last": "Cuda failure 800 'operation not permitted'"},
                                 {"init": 0, "ar": 1})),
    # A container's 64 MiB /dev/shm under NCCL_P2P_DISABLE=1 (every pair of four ranks on
    # SHM, one 9637888-byte segment per connection): six fit, the next ncclShmOpen fails
    # with ENOSPC: ncclSystemError and its WARN at the first all-reduce
    # (src/misc/shmutils.cc; NVIDIA/nccl#342: "the shm size is limited to 64MB under docker").
    ("small_dev_shm", [Fault("small_dev_shm", host="hgx-h100-0")], {"NCCL_P2P_DISABLE": "1"},
     {"init": 0, "ar": 2, "last": "Error while creating shared memory segment /dev/shm/nccl-XXXXXX "
                                  "(size 9637888), error: No space left on device (28)"}),
    # No shared host identity: each process's own hostname (its container's UTS namespace)
    # enters NCCL's hostHash (src/misc/utils.cc getHostHashOnce), so p2pCanConnect and
    # shmCanConnect see other nodes (src/transport/p2p.cc, shm.cc) and each "node" holds one
    # GPU, too few for NVLS: the network, exact (rule NC23).
    ("no_shared_host_identity", [Fault("no_shared_host_identity", host="hgx-h100-0")], {},
     {"via": ["NET/Socket/0"], "nvls": "NVLS off: fewer than 2 GPUs per NVLink node", "exact": True}),
    # ... and NCCL_HOSTID, one value for every process, makes them one host again.
    ("no_shared_host_identity_hostid", [Fault("no_shared_host_identity", host="hgx-h100-0")],
     {"NCCL_HOSTID": "node-a"}, {"via": ["P2P/CUMEM"], "exact": True}),
    # Multicast failing by each cause (NVLS set-up, src/transport/nvls.cc v2.27.3-1):
    # a driver before CUDA 12.1 (branch 530) has no cuMulticast* entry points, which NCCL
    # loads at 12010 (src/misc/cudawrap.cc), so ncclNvlsInit leaves nvlsSupport 0: NVLS off,
    # P2P, exact (rules M9, NC24).
    ("multicast_old_driver", [Fault("driver_version", host="hgx-h100-0", version="525.147.05")], {},
     {"via": ["P2P/CUMEM"], "nvls": "NVLS off: some GPU lacks multicast (no NVSwitch / Fabric "
                                    "Manager)", "exact": True}),
    # cuMulticastCreate failing on the node's root: CUCHECK in nvlsGroupCreate (v2.19.3-1,
    # v2.23.4-1, v2.27.3-1), init fails ncclUnhandledCudaError with the CUDA error's text.
    ("multicast_create_fails", [Fault("call_fails", rank=0, api="cuMulticastCreate",
                                      code="CUDA_ERROR_OUT_OF_MEMORY")], {},
     {"init": 1, "last": "Cuda failure 2 'out of memory'"}),
    # cuMulticastBindMem failing: from 2.27.3 NCCL goes on without NVLS ("Proceeding without
    # NVLS support", nvlsGroupBindMem), P2P, exact; before, init fails (the version test).
    ("multicast_bind_fails", [Fault("call_fails", rank=0, api="cuMulticastBindMem",
                                    code="CUDA_ERROR_SYSTEM_NOT_READY")], {},
     {"init": 0, "via": ["P2P/CUMEM"], "exact": True}),
]
# The machine a row runs on where it is not three GPUs of one HGX H100 board.
TRAYS = ("gb200-nvl72:2", [(0, 0), (1, 0)])
MACHINES = {"no_imex_channel_device": TRAYS, "imex_split": TRAYS, "imex_split_no_nvls": TRAYS,
            "small_dev_shm": (H100, [(0, 0), (0, 1), (0, 2), (0, 3)]),
            "p2p_writes_dropped": (H100, [(0, 0), (0, 1)])}


def _torch_body(g):
    """init_process_group("nccl"), one float32 all-reduce of rank-dependent values: what
    ProcessGroupNCCL did (its communicator is made at the all-reduce)."""
    import torch.distributed as dist
    dist.init_process_group("nccl")
    x = torch.arange(1024, dtype=torch.float32, device="cuda") + g.rank
    try:
        dist.all_reduce(x)
    except dist.DistBackendError as e:
        return {"error": str(e)}
    finally:
        comms = list(nc.state(S.session.hosted()).comms.values())
        dist.destroy_process_group()
    want = sum(np.arange(1024, dtype=np.float32) + r for r in range(g.size))
    return {"via": sorted(set(comms[0].nccl.transports().values())),
            "exact": bool(np.array_equal(x.cpu().numpy(), want))}


def _as_torch(c):
    """What torch.distributed "nccl" shows for the ctypes outcome `c`: a failing init or
    all-reduce as C10D_NCCL_CHECK's DistBackendError text, else the same transports and
    result."""
    code = c["init"] or c.get("ar")
    if code:
        return {"error": f"NCCL error in: {CHECK_SITE}, {ERROR_STRINGS[code].decode()}, NCCL "
                         f"version 2.29.7\n{DETAILS[code]}\nLast error:\n{c['last']}"}
    return {"via": c["via"], "exact": c["exact"]}


@pytest.fixture(scope="module")
def hosting(module_surfaces):
    install_all()          # torch.distributed's inproc surface too, as an in-process run does


def _outcomes(outs):
    """Each rank's outcome: what its body returned, or {"hang": the diagnosis} where it
    waited forever (any other error is the test's own)."""
    out = []
    for o in outs:
        if isinstance(o.error, HangDetected):
            out.append({"hang": str(o.error)})
        elif o.error is not None:
            raise o.error
        else:
            out.append(o.value)
    return out


def _shows(got, want):
    """`got` has `want`'s values; a hang's diagnosis contains `want`'s text."""
    if "hang" in want:
        return "hang" in got and want["hang"] in got["hang"]
    return {k: got.get(k) for k in want} == want


@pytest.mark.parametrize("name, faults, env, want", CASES, ids=[c[0] for c in CASES])
def test_machine_fault_reaches_nccl(hosting, monkeypatch, name, faults, env, want):
    spec, placement = MACHINES.get(name, (H100, [(0, 0), (0, 1), (0, 2)]))
    _, _, outs = _run(spec, placement, *faults, env=env, monkeypatch=monkeypatch)
    wants = want if isinstance(want, tuple) else (want,)
    got = _outcomes(outs)
    for g, w in zip(got, wants):
        assert _shows(g, w), got
        if "hang" in w:      # a diagnosed hang names NCCL and the collective
            assert "NCCL ncclAllReduce" in g["hang"], g
    # the same machine through torch.distributed "nccl": each rank sees what the C calls gave
    _, ranks = _ranks(spec, placement, *faults)
    for r in ranks:
        r.mode = "inproc"
    seen = _outcomes(S.run(ranks, _torch_body))
    for r, (g, s) in enumerate(zip(got[:len(wants)], seen)):
        if "hang" in g:     # ProcessGroupNCCL's watchdog names it (rule NC20)
            assert s["hang"].startswith(f"[Rank {r}] Watchdog caught collective operation timeout"), s
            assert wants[r]["hang"] in s["hang"], s
        else:
            assert s == _as_torch(g), s


def test_the_runs_nccl_version_decides_when_a_refused_ipc_open_fails(module_surfaces, monkeypatch):
    """The run's NCCL version (commsim/versions.py) reaches NCCL's rules: before 2.22 every
    connection is made at init (NVIDIA/nccl#1034), so the refused legacy IPC open fails
    ncclCommInitRank; from 2.22 it fails the first collective (runtime connect, rule NC14).
    ncclGetVersion answers the same version."""
    import dataclasses
    refused = Fault("p2p_ipc_refused", cause="acs", **PAIR)
    monkeypatch.setenv("NCCL_CUMEM_ENABLE", "0")
    got = {}
    for nccl in ((2, 21, 5), (2, 27, 3)):
        def edit(c, nccl=nccl):
            c = apply_machine_fault(c, refused)
            return dataclasses.replace(c, versions=dataclasses.replace(c.versions, nccl=nccl))

        def body(g):
            v = ctypes.c_int()
            _lib().ncclGetVersion(ctypes.byref(v))
            return v.value, _body(g)
        (v, a), _ = _values(S.run(S.ranks(H100, [(0, 0), (0, 1)], mutate=edit)[1], body))
        got[v] = (a["init"], a.get("ar"))
    assert got == {22105: (1, None), 22703: (0, 1)}


@pytest.mark.parametrize("mode, does", [(None, "(SkipCleanUp): the process is taken down"),
                                        ("0", "no handling (TORCH_NCCL_ASYNC_ERROR_HANDLING=0)")])
def test_lost_peer_writes_are_a_watchdog_timeout_in_torch(hosting, monkeypatch, mode, does):
    """The same dropped peer writes under torch.distributed "nccl": the hang is named as
    ProcessGroupNCCL's watchdog names it, the collective's WorkNCCL and what
    TORCH_NCCL_ASYNC_ERROR_HANDLING makes of it (3, SkipCleanUp, by default)."""
    if mode is not None:
        monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", mode)
    _, ranks = S.ranks(H100, [(0, 0), (0, 1)], mutate=_mutate(
        Fault("p2p_writes_lost", cause="dropped", **PAIR)))
    for r in ranks:
        r.mode = "inproc"
    errs = [o.error for o in S.run(ranks, _torch_body)]
    assert all(isinstance(e, HangDetected) for e in errs), errs
    text = str(errs[0])
    assert text.startswith("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL("
                           "SeqNum=1, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, "
                           "Timeout(ms)=600000) ran for 600000 milliseconds before timing out"), text
    assert does in text and "over P2P/CUMEM" in text, text


def test_the_runs_nccl_version_decides_whether_a_failed_multicast_bind_fails_init(module_surfaces):
    """cuMulticastBindMem failing on one rank: up to 2.26 every NVLS step is CUCHECK, so
    ncclCommInitRank fails (ncclUnhandledCudaError there, ncclRemoteError on its peers); from
    2.27.3 NCCL proceeds without NVLS (src/transport/nvls.cc of each tag; rule NC24)."""
    import dataclasses
    bind = Fault("call_fails", rank=0, api="cuMulticastBindMem", code="CUDA_ERROR_SYSTEM_NOT_READY")
    got = {}
    for nccl in ((2, 26, 6), (2, 27, 3)):
        def edit(c, nccl=nccl):
            return dataclasses.replace(c, versions=dataclasses.replace(c.versions, nccl=nccl))
        _, ranks = S.ranks(H100, [(0, 0), (0, 1), (0, 2)], mutate=edit)
        ranks[0].driver.proc.faults = arm_driver_faults([bind], 0)
        a, b, _ = _values(S.run(ranks, _body))
        got[nccl] = (a["init"], b["init"], a.get("nvls") or a["last"])
    assert got[(2, 26, 6)] == (1, 6, "Cuda failure 802 'system not yet initialized'"), got
    assert got[(2, 27, 3)][:2] == (0, 0), got
    assert got[(2, 27, 3)][2].startswith("NVLS off: Failed to bind NVLink SHARP (NVLS) Multicast "
                                         "memory of size"), got


def _in_containers(ranks, containers):
    """Put each rank's process in a container whose device cgroup holds `containers[r]` (host
    GPU indices of its host): CUDA and NVML there number only those, from 0 (row W3)."""
    for r, held in zip(ranks, containers):
        own = r.driver.device
        gpus = tuple(S.GpuRef(own.host, i) for i in held)
        r.driver.proc.gpus, r.driver.proc.container = gpus, gpus
        r.driver.proc.current = gpus.index(own)
        r.visible = gpus
    return ranks


def test_nccl_across_device_cgroup_containers_keys_gpus_by_bus_id(hosting):
    """The shipped scenario container-device-cgroups: two containers of one HGX H100 board
    given GPUs 0,1 and 2,3; inside each NVML numbers them 0 and 1. NCCL names GPUs by PCI bus
    id, so rank 2 (host GPU 2, its container's 0) is no duplicate of rank 0 (src/init.cc), and
    fills each GPU's own NVLinks into the topology, whose far ends are the NVSwitches every
    GPU links to (src/graph/xml.cc ncclTopoFillGpu, src/graph/topo.cc), so the pair across
    the containers is NVL, and P2P "with invisible devices" (src/transport/p2p.cc): P2P/CUMEM
    for every pair, exact, through the ctypes surface and torch.distributed "nccl" (NC25)."""
    four = [(0, 0), (0, 1), (0, 2), (0, 3)]
    cgroups = [(0, 1), (0, 1), (2, 3), (2, 3)]
    got = _values(S.run(_in_containers(S.ranks(H100, four)[1], cgroups), _body))
    assert [(g["init"], g["via"], g["exact"]) for g in got] == [(0, ["P2P/CUMEM"], True)] * 4, got
    ranks = _in_containers(S.ranks(H100, four)[1], cgroups)
    for r in ranks:
        r.mode = "inproc"
    seen = _values(S.run(ranks, _torch_body))
    assert seen == [{"via": ["P2P/CUMEM"], "exact": True}] * 4, seen
