"""`nccl`: the fallback, run by the simulated NCCL (commsim/libmodels/nccl/), a client of
the rank's driver as the hosted libnccl is, so what NCCL does on the machine is what the
scenarios and the sweep see. The policy parameter `nccl_on_machine = False`
keeps NCCL's choices from the rules alone and lets the group layer combine the ranks' inputs
exactly (what NCCL's collectives guarantee semantically on a sound machine), as before.

At set-up the policy's view of NCCL comes first: commsim/libmodels/nccl_rules.py
(docs/lifecycle-rules.md NC1-NC12) decides, from the discovery view and the NCCL_* variables
(`nccl_env`), each pair's transport and each collective's algorithm classes (what `describe`
and the cost model read), and where it says init fails (a duplicate GPU: ncclInvalidUsage;
MNNVL that looks available but whose FABRIC self-test fails: ncclSystemError) the backend
fails as NCCL does. With `nccl_auto_env` (default) the policy follows NCCL's own advice for
the latter and sets NCCL_MNNVL_ENABLE=0 before init. On the machine, ncclCommInitRank then
runs through the rank's driver (peer info, topology, the MNNVL check, per-pair P2P / SHM / NET set-up, NVLS),
so a machine fault no rule names still reaches NCCL: its failure is this backend's set-up
failure with NCCL's code and WARN. The collectives move every rank's bytes over the pair's
connection (libmodels/nccl/datapath.py): peer writes a machine drops hang the collective,
garbled ones give a wrong result; the reduction is the project's reference (float32 sum in
rank order, rounded once)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import numpy as np

from commsim.discovery import GroupView
from commsim.kernels import collectives as K
from commsim.libmodels.nccl import comm as nccl_comm, datapath, outcome as nccl_outcome
from commsim.libmodels.nccl.errors import NcclError as NcclFailure
from commsim.libmodels.nccl.shm import DirShm, NamespaceShm
from commsim.libmodels.nccl_rules import NcclDecision, decide, machine_from_view, parse_env
from commsim.topology.truth import GroupFacts
from commsim.backends.base import Backend, Eligibility, SetupFailed
from commsim.backends.registry import register_backend

# torch where a tensor is handled (run): the launcher of `exec` loads the backends, never runs one.
if TYPE_CHECKING:
    import torch

# Whether the backend runs the simulated NCCL on the machine (set-up through the driver,
# bytes over the connections) where the policy does not say; the oracle
# (commsim/scenario/nccl_truth.py) expects NCCL's outcomes exactly where it does.
ON_MACHINE = True


def on_machine(params: dict[str, Any]) -> bool:
    """Whether a communicator with these policy parameters runs NCCL on the machine."""
    return bool(params.get("nccl_on_machine", ON_MACHINE))


class NcclError(RuntimeError):
    """An NCCL init failure; `name` is the ncclResult_t (ncclInvalidUsage, ncclSystemError)."""

    def __init__(self, name: str, message: str):
        super().__init__(f"{name}: {message}")
        self.name = name


def _decide(view: GroupView, env: tuple[tuple[str, str], ...], auto: bool) -> tuple[NcclDecision, str]:
    """The decision for one group view and environment, and the note of an automatic
    adjustment. Kept on the view (GroupView.derived): it is O(ranks^2) (a transport per pair),
    every rank of the group asks with the same view, and the result is immutable, so the
    ranks of one process share one (576 ranks each holding their own 165,600 pair transports
    was gigabytes)."""
    return view.derived(("nccl", env, auto), lambda: _decision(view, env, auto))


def _decision(view: GroupView, env: tuple[tuple[str, str], ...], auto: bool) -> tuple[NcclDecision, str]:
    return _decision_of(view.ranks, env, auto)


@functools.lru_cache(maxsize=1024)
def _decision_of(ranks: tuple, env: tuple[tuple[str, str], ...], auto: bool) -> tuple[NcclDecision, str]:
    """A pure function of the ranks' discovery facts (immutable RankInfos, compared by
    value) and the variables: a sweep worker meets the same group on the same machine in
    many scenarios, each with its own view object."""
    machine = machine_from_view(GroupView(ranks))
    envd = dict(env)
    d = decide(machine, parse_env(envd))
    if (d.init_error is not None and d.init_error[0] == "ncclSystemError" and auto
            and envd.get("NCCL_MNNVL_ENABLE") != "1"):
        d = decide(machine, parse_env({**envd, "NCCL_MNNVL_ENABLE": "0"}))
        return d, "NCCL_MNNVL_ENABLE=0 set: MNNVL looks available but IMEX is missing (NC8)"
    return d, ""


@register_backend
class NcclBackend(Backend):
    """The fallback: the group layer's array combine, with NCCL's own choices
    (transports, algorithm classes, init failures) from commsim/libmodels/nccl_rules.py."""

    name = "nccl"
    order, colour = 100, "#9d9d9d"
    algorithms, cost_family = ("ring", "multicast"), "nccl"   # multicast: NVLS
    fallback = True

    @classmethod
    def truth(cls, facts: GroupFacts) -> str | None:
        return None                 # the network reaches everything

    @classmethod
    def eligibility(cls, view: GroupView, params: dict[str, Any]) -> Eligibility:
        return Eligibility(True)

    decision: NcclDecision | None = None
    comm: nccl_comm.NcclComm | None = None

    def setup(self) -> None:
        """The rules' verdict (every rank computes the same decision from the same view, so
        every rank fails together, no vote needed), then ncclCommInitRank through the
        driver, whose failures NCCL's own votes carry to every rank."""
        env = tuple(sorted(dict(self.params.get("nccl_env", ())).items()))
        d, self.adjusted = _decide(self.view, env, bool(self.params.get("nccl_auto_env", True)))
        self.decision = d
        if d.init_error is not None:
            raise SetupFailed(self.name, "init: ncclCommInitRank", self.rank, NcclError(*d.init_error))
        if not on_machine(self.params):
            return
        envd = dict(env)
        if self.adjusted:
            envd["NCCL_MNNVL_ENABLE"] = "0"
        drv = self.driver
        # The /dev/shm's size where a simulated host's container sets one.
        cluster = getattr(drv, "cluster", None)
        limit = cluster.host(drv.gethostname()).container.shm_bytes or None if cluster else None
        # OS processes share a /dev/shm through files (each process's in-memory store would
        # be its own: a peer attached a same-named segment of its own and read its own
        # bytes); in-process ranks share one in-memory store per run.
        root = drv.shm_dir() if hasattr(drv, "shm_dir") else None
        shm = DirShm(root, limit) if root else \
            NamespaceShm(getattr(drv, "fabric", self.view), drv.shm_namespace(), limit)
        try:
            self.comm = nccl_comm.init(drv, self.group, self.rank, self.ws, envd, shm)
        except NcclFailure as e:
            # A peer's failure reaches this rank as ncclRemoteError: the origin is the peer.
            origin = self.rank if e.origin is None else e.origin
            raise SetupFailed(self.name, "init: ncclCommInitRank", origin, _nccl_error(e)) from None

    def close(self) -> None:
        """ncclCommDestroy on every rank together: each unmaps its peers' buffers, then,
        after the barrier, frees its own, so no buffer is freed while a peer has it open."""
        if self.comm is not None and not self.closed:
            self.comm.unmap_peers()
            self.close_barrier("nccl.close: ncclCommDestroy")
            self.comm.close()
        super().close()

    def describe(self) -> str:
        d = self.decision
        if d is None:
            return ""
        if self.comm is not None:
            # What set-up did on the machine (its topology read the PCIe paths, which the
            # discovery view does not carry): pairs, NVLS and why.
            c = self.comm
            return nccl_outcome.describe(c.decision, c.nvls_note, c.connected) + \
                (f"; {self.adjusted}" if self.adjusted else "")
        algos = "; ".join(f"{op} {'/'.join(d.algorithms(op))}" for op in ("all_reduce", "all_gather"))
        return f"{d.transport_summary()}; {algos}" + (f"; {self.adjusted}" if self.adjusted else "")

    def algorithm(self, op: str, nbytes: int) -> str:
        """The class the cost model knows it by (`algorithms`): "multicast" (NVLS) where NCCL
        may use it, else "ring" (its ring / tree family)."""
        d = self.decision
        if d is not None and ({"NVLS", "NVLSTree"} & set(d.algorithms(op))):
            return "multicast"
        return "ring"

    def run(self, op: str, x: torch.Tensor) -> torch.Tensor:
        import torch
        self.round += 1
        a = x.contiguous()
        raw = (a.view(torch.int16) if a.dtype == torch.bfloat16 else a).numpy()   # a view
        dtype = str(x.dtype).removeprefix("torch.")
        if self.comm is None:
            res = self.group.combine_arrays(raw, _collective, (op, dtype),
                                            tag=f"nccl.{op}: round {self.round}")
            return self._shaped(res, op, x)
        try:
            # Every rank's bytes over the pair's connection, as they arrived here.
            parts = [p.view(raw.dtype).reshape((-1,) + raw.shape[1:])
                     for p in datapath.exchange(self.comm, raw, f"nccl.{op}")]
        except NcclFailure as e:
            # Runtime connect (libmodels/nccl/comm.py): the connections' set-up failed at
            # the first collective; a peer's failure names that peer.
            raise SetupFailed(self.name, "connect: first collective", self.rank if e.origin is None
                              else e.origin, _nccl_error(e, self.comm.decision)) from None
        return self._shaped(_collective(parts, op, dtype), op, x)

    def _shaped(self, res: np.ndarray, op: str, x: torch.Tensor) -> torch.Tensor:
        """This rank's result of `op` from the combined array, as a tensor like `x`."""
        if op == "reduce_scatter":
            per = x.numel() // self.ws
            res = res[self.rank * per:(self.rank + 1) * per]
        import torch
        # A combined result is shared by the ranks of this process: each gets its own copy.
        out = torch.from_numpy(np.array(res)).view(x.dtype)
        return out if op != "all_reduce" and op != "all_reduce_rmsnorm" else out.reshape(x.shape)


def _nccl_error(e: NcclFailure, d: NcclDecision | None = None) -> NcclError:
    """The simulated NCCL's failure as this backend reports it: its result name, its WARN,
    the CUDA call and code behind it where one failed, and what NCCL had decided."""
    text = nccl_outcome.failed(e.decision or d, e.name, e.warn, e.api, e.cause)
    return NcclError(e.name, text.removeprefix(f"{e.name}: "))


def _collective(parts: list[np.ndarray], op: str, dtype: str) -> np.ndarray:
    """What every rank gets back from `op` over the ranks' inputs (raw numpy views): for a
    reduction the float32 sum in rank order rounded once into `dtype` (the whole message in
    one pass per rank, vectorised; the same bits per element as a ring's reduce-scatter)."""
    if op == "all_gather":
        return np.concatenate(parts, axis=0)
    if len({p.shape for p in parts}) != 1:
        # Raised here, in Python: a torch shape error raised inside a rank's greenlet can
        # crash the process while torch walks the C++ stack (pytorch#117645).
        raise ValueError(f"nccl.{op}: ranks passed tensors of different shapes "
                         f"{[tuple(p.shape) for p in parts]}")
    flat = [p.reshape(-1).view(np.uint8) for p in parts]
    out = np.empty(flat[0].size, np.uint8)
    K.reduce_into(flat, out, dtype)      # 16-bit block by block: no message-size scratch
    return out.view(parts[0].dtype)
