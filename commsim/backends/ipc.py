"""`ipc`: custom all-reduce over legacy CUDA IPC (vLLM CustomAllreduce, TRT-LLM one/two-shot).

Requires: every rank on one host (legacy handles are host-local, row L8); P2P between every
pair (row L10); world size 2, 4, 6 or 8 (the compiled kernels, B2); for more than two GPUs
full NVLink connectivity (B3). Set-up: cudaMalloc a workspace, export it, all-gather the
handles, open every peer's (lazy peer access). Graph capture: the recorded buffers are
exported and opened collectively at capture exit, as vLLM's register_graph_buffers does.
Close: importers close, barrier, exporter frees (row G7).
"""

from __future__ import annotations

from typing import Any

from commsim.discovery import CONTAINERS, GroupView
from commsim.driver import LAZY_ENABLE_PEER_ACCESS, CudaError, check
from commsim.libmodels import caching_allocator as allocators
from commsim.libmodels.graph_buffers import OpenedBases, export_buffers, legacy_ipc_capable
from commsim.kernels import workspace as W
from commsim.topology.truth import IPC, GroupFacts
from commsim.backends.base import Capture, Eligibility, Ki, PeerBackend, SetupFailed, as_bytes, kernel_width, probe_verdict
from commsim.backends.registry import register_backend

WORLD_SIZES = (2, 4, 6, 8)


@register_backend
class IpcBackend(PeerBackend):
    max_ranks = W.MAX_RANKS          # one flag slot per rank (kernel_width)
    name = "ipc"
    needs_graph_registration = True
    order, colour = 10, "#4e79a7"
    algorithms, cost_family = ("one-shot", "two-shot"), "peer"

    @classmethod
    def truth(cls, facts: GroupFacts) -> str | None:
        ws = facts.ws
        if ws < 2:
            return "a group of one rank"
        bad = facts.first_pair_without(IPC)
        if bad:
            return f"{bad[0]} cannot open a legacy IPC handle of {bad[1]}"
        if facts.unreal:                            # rows P1-P4: the probe disproves the flag
            return f"the functional P2P probe {facts.unreal[0]} -> {facts.unreal[1]} fails (rows P1-P4)"
        if ws not in WORLD_SIZES:                   # the compiled kernels (row B2)
            return f"world size {ws} not in {WORLD_SIZES}"
        if ws > 2 and not facts.nvl_all:            # row B3
            return f"{ws} GPUs not fully NVLink-connected"
        return None

    @classmethod
    def eligibility(cls, view: GroupView, params: dict[str, Any]) -> Eligibility:
        ws = view.size
        hosts = view.hosts
        unreal = probe_verdict(view, params)
        gpn = params.get("gpus_per_node")
        if gpn is None:
            one_node = len(hosts) == 1
        else:
            # Rules RN2, RN3: Mapping-style arithmetic (is_multi_node = world > gpus_per_node)
            # with a configured count, or the device count this process sees, instead of
            # asking which host each rank is on: two GB200 trays of 4 become "one node".
            per_node = len(view.ranks[0].p2p) if gpn == "device_count" else int(gpn)
            one_node = ws <= per_node
        return Eligibility.check([
            (ws > 1, "a group of one rank needs no all-reduce"),
            kernel_width(view),
            (one_node, f"ranks are on {len(hosts)} hosts ({', '.join(hosts[:3])}"
                       f"{', ...' if len(hosts) > 3 else ''}); legacy IPC handles are host-local "
                       f"(row L8: cudaIpcOpenMemHandle -> invalid resource handle)"),
            (len(hosts) != 1 or view.same_shm, CONTAINERS),
            (ws in WORLD_SIZES, f"world size {ws} not in {WORLD_SIZES} (compiled kernels, row B2)"),
            (len(hosts) != 1 or view.p2p_all(),
             "some pair of GPUs has no P2P access (row L10: peer access is not supported)"),
            (not unreal, unreal),
            (len(hosts) != 1 or ws <= 2 or view.nvlink_all(),
             f"{ws} GPUs are not fully NVLink-connected (row B3: more than two PCIe-only GPUs)"),
        ])

    def algorithm(self, op: str, nbytes: int) -> str:
        # vLLM csrc/custom_all_reduce.cuh: ws 2 always 1-stage; ws <= 4 and < 512 KiB,
        # or ws <= 8 and < 256 KiB, 1-stage; else 2-stage.
        if op not in ("all_reduce", "all_reduce_rmsnorm"):
            return "direct"
        if self.ws == 2 or (self.ws <= 4 and nbytes < 512 * Ki) or (self.ws <= 8 and nbytes < 256 * Ki):
            return "one-shot"
        return "two-shot"

    def __init__(self, *a: Any, **k: Any):
        super().__init__(*a, **k)
        self.own = 0
        self.opened: list[int] = []
        self.captures: list[Capture] = []

    def setup(self) -> None:
        if not self.view.single_host and self.params.get("cross_host_local_buffers"):
            # vLLM's MNNVL-era CustomAllreduce (vllm-project/vllm#55835): for a cross-node group
            # the buffers are allocated locally, the pointer list is [local] * world_size, nothing
            # is exchanged, so construction succeeds; the data path then belongs to MNNVL memory.
            self.own = check("cudaMalloc", self.driver.cudaMalloc(W.workspace_bytes(self.capacity)))
            self.ptrs = [self.own] * self.ws
            return
        d, err = self.driver, None
        try:
            self.own = check("cudaMalloc", d.cudaMalloc(W.workspace_bytes(self.capacity)))
            check("cudaMemset", d.cudaMemset(self.own, 0, W.FLAGS_BYTES))
            handle = check("cudaIpcGetMemHandle", d.cudaIpcGetMemHandle(self.own))
        except CudaError as e:
            err, handle = e, None
        handles = self.vote_and_share("init: allocate workspace", err, handle, lambda h: self.group.all_gather_object(
            h, tag="ipc.init: exchange IPC handles"))
        err = None
        self.ptrs = [0] * self.ws
        try:
            for j, h in enumerate(handles):
                if j == self.rank:
                    self.ptrs[j] = self.own
                    continue
                p = check("cudaIpcOpenMemHandle", d.cudaIpcOpenMemHandle(h, LAZY_ENABLE_PEER_ACCESS))
                self.opened.append(p)
                self.ptrs[j] = p
        except CudaError as e:
            err = self._context(e, j, "workspace")
        self.vote("init: open peer handles", err)

    def _context(self, e: CudaError, peer: int, what: str) -> CudaError:
        """Say whose handle it was and where both ranks live: what a person needs to act."""
        me, other = self.view.ranks[self.rank], self.view.ranks[peer]
        e.context = (f"rank {self.rank} on host {me.host} opening the {what} IPC handle of rank "
                     f"{peer} on host {other.host}")
        return e

    def record(self, cap: Capture, x: Any) -> None:
        """In capture: the input lives in the graph's private pool of the process's caching
        allocator, usually inside a block shared with other captured tensors (rules AL1,
        AL5). A failure here is rank-local, so it is kept and voted at registration: raising
        now would leave this rank out of step with its peers (found by the sweep)."""
        if cap.error is not None:
            return
        try:
            alloc = allocators.for_process(self.driver)
            if cap.pool is None:
                cap.pool = alloc.new_graph_pool()
            p = alloc.malloc(max(x.numel() * x.element_size(), 16), cap.pool)
            cap.buffers.append(p)
            check("cudaMemcpy", self.driver.memcpy_htod(p, as_bytes(x)))
        except CudaError as e:
            cap.error = e

    def register_graph_buffers(self, cap: Capture) -> None:
        """Collective at capture exit (vLLM's register_graph_buffers): per recorded pointer,
        the IPC handle of its allocation base plus the offset; peers open each base once (rule AL3).
        `graph_buffers="auto"` (default) first asks every rank whether its buffers are
        legacy-IPC capable (cudaMalloc memory, not expandable segments) and, if any is not,
        registers nothing: the graph's inputs are copied into the registered workspace
        instead (vllm-project/vllm#51903). `"register"` always registers (vLLM before it):
        over expandable segments the export answers cudaErrorInvalidValue (rule AL4)."""
        d, err, mine = self.driver, None, []
        self.captures.append(cap)      # owned from here on, so close() frees it even on failure
        self.vote("register: record graph buffers", cap.error)
        auto = self.params.get("graph_buffers", "auto") == "auto"
        ok = not auto or all(legacy_ipc_capable(d, p) for p in cap.buffers)
        try:
            # Row H3: a sub-allocation's handle is its base allocation's; the offset travels
            # beside it and the importer adds it.
            mine = export_buffers(d, cap.buffers) if ok else []
        except CudaError as e:
            err = e
        shared = self.vote_and_share("register: export graph buffers", err, (ok, mine),
                                     lambda v: self.group.all_gather_object(
                                         v, tag="ipc.register: exchange graph handles"))
        if not all(o for o, _ in shared):
            cap.registered = True      # nothing to open: replays copy into the workspace
            return
        every = [m for _, m in shared]
        if len({len(v) for v in every}) != 1:
            raise SetupFailed(self.name, "register", self.rank,
                               f"ranks recorded different numbers of graph buffers "
                               f"{[len(v) for v in every]} (row G1)")
        # vLLM keeps a map of opened handles and opens each once (ipc_open_cache, default); a
        # stack that opens every buffer's handle opens one handle several times when buffers
        # share an allocator block: the same pointer on current drivers (H1),
        # cudaErrorAlreadyMapped on older ones (row H2).
        err = None
        opened = OpenedBases(d, cache=self.params.get("ipc_open_cache", True))
        cap.peer_ptrs = []
        try:
            for j, metas in enumerate(every):
                if j != self.rank:
                    for h, off in metas:
                        cap.peer_ptrs.append(opened.pointer(h, off))
        except CudaError as e:
            err = self._context(e, j, "graph buffer")
        finally:
            cap.opened = list(opened.mappings)
        self.vote("register: open graph handles", err)
        cap.registered = True

    def release_capture(self, cap: Capture) -> None:
        """Close a capture's peer mappings, barrier, free its buffers (close-before-free).
        With `release_capture_closes_ipc=False` (the vLLM#46515 pattern, row G5) the mappings
        stay open until the communicator closes."""
        if cap.released:
            return
        if self.params.get("release_capture_closes_ipc", True):
            for p in cap.opened:
                self.driver.cudaIpcCloseMemHandle(p)
            cap.opened.clear()
        self.close_barrier("ipc.release_capture: importers closed")
        alloc = allocators.for_process(self.driver)
        for p in cap.buffers:
            alloc.free(p)
        cap.buffers.clear()
        if cap.pool is not None:
            alloc.release_graph_pool(cap.pool)      # the graph is destroyed (rule AL5)
        cap.released = True
        if cap in self.captures and not cap.opened:
            self.captures.remove(cap)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for cap in list(self.captures):
            self.release_capture(cap)
            for p in cap.opened:                                 # mappings a leaky release kept
                self.driver.cudaIpcCloseMemHandle(p)
            cap.opened.clear()
        for p in self.opened:                                    # row G7: importers close,
            self.driver.cudaIpcCloseMemHandle(p)
        self.opened.clear()
        self.close_barrier("ipc.close: importers closed")   # barrier,
        if self.own:
            self.driver.cudaFree(self.own)                       # exporter frees
            self.own = 0

