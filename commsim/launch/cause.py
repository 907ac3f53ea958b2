"""Why a hosted run failed, in the machine's terms: the one classification of a failed
process (the verdict's root cause, `sweep --exec`'s kinds, the mode agreement), the reason
behind it (which peer, which hosts, which rule) and which failures only followed another's.

A rank that failed because a peer had already failed or exited (a collective that cannot
complete, a connection the peer closed, a hang while a peer is gone, a handle whose
exporter's memory went with it) is a knock-on failure: it is listed under the root cause, as
torchrun's "Root Cause (first observed failure)" block lists the first failure and the rest.
The root cause is the lowest-numbered rank among the failures that are not knock-ons: lowest
rank, not earliest in time, so that both modes and every rerun name the same one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from commsim.launch.verdict import ProcResult, Verdict

# The kinds a failed process falls in, the most telling first (a run is named by its most
# telling one). `injected` is not a defect: the scenario's fault, not the program's.
DEFECTS = ("ipc-across-hosts", "fabric-outside-domain", "cuda-error", "hang", "leak", "crash",
           "undefined")

# What the simulator's rule rows (docs/fidelity-rules.md, docs/lifecycle-rules.md) say, for
# a refused call whose driver named its rule.
RULE_REASONS = {
    "L8": "legacy IPC handles are host-local (row L8: cudaIpcOpenMemHandle -> invalid "
          "resource handle)",
    "L9": "a process cannot open a legacy IPC handle it exported itself (row L9)",
    "L10": "the two GPUs have no peer access (row L10: cudaDeviceCanAccessPeer is 0)",
    "P1": "PCIe ACS redirects peer traffic between the two GPUs although P2P is reported (row P1)",
    "P2": "IOMMU translation is on between the two GPUs although P2P is reported (row P2)",
    "W6": "the two processes are in different containers of the host (no shared pid / IPC "
          "namespace, row W6)",
    "H5": "the memory behind the handle is gone: its exporter freed it or exited (row H5)",
}

# A failure that reports a peer's failure or exit: the inproc scheduler's diagnosis, gloo's
# closed connection (torch.distributed, procs mode), a peer's process gone.
_PEER_GONE = re.compile(r"RankFailed: rank (\d+) failed|Connection closed by peer|"
                        r"Connection reset by peer|remote worker crashing|peer exited|"
                        r"rank (\d+) (?:exited|failed)")


@dataclass(frozen=True)
class Cause:
    kind: str                    # one of DEFECTS, or "injected"
    reason: str                  # in the machine's terms; "" when there is nothing to add
    after: int | None = None     # knock-on: the rank whose failure or exit this one followed
    knock_on: bool = False


def _rank_on(cfg: Any, gpu: str | None) -> int | None:
    """The rank placed on GPU "host/gpuN", if one is."""
    if not gpu or "/gpu" not in gpu:
        return None
    host, idx = gpu.rsplit("/gpu", 1)
    return next((r for r, (h, i) in enumerate(cfg.placement) if h == host and str(i) == idx), None)


def _hosts(cfg: Any) -> list[str]:
    return list(dict.fromkeys(h for h, _ in cfg.placement))


def _who(cfg: Any, rank: int | None, gpu: str | None) -> str:
    return f"rank {rank} ({gpu})" if rank is not None else str(gpu)


def _injected(cfg: Any, p: "ProcResult") -> bool:
    pf = cfg.driver_faults(p.rank)
    e = p.first_cuda_error or {}
    if any(c.api == e.get("api") for c in pf.calls):
        return True
    return pf.oom_at is not None and e.get("name") in ("cudaErrorMemoryAllocation",
                                                       "CUDA_ERROR_OUT_OF_MEMORY")


def _cuda_cause(cfg: Any, p: "ProcResult", e: dict) -> Cause:
    rule, peer = e.get("rule"), e.get("peer")
    peer_rank = _rank_on(cfg, peer)
    me = f"{cfg.placement[p.rank][0]}/gpu{cfg.placement[p.rank][1]}" if not p.worker else p.host
    hosts = _hosts(cfg)
    api = e.get("api", "")
    if api == "cudaIpcOpenMemHandle" and e.get("code") == 400 and (
            rule == "L8" or (rule is None and len(hosts) > 1)):
        where = (f"this rank is on {p.host}, the handle's memory on "
                 f"{_who(cfg, peer_rank, peer)}" if peer else
                 f"ranks are on {len(hosts)} hosts ({', '.join(hosts[:3])}"
                 f"{', ...' if len(hosts) > 3 else ''})")
        return Cause("ipc-across-hosts", f"{where}; {RULE_REASONS['L8']}")
    if api.startswith("cuMemImportFromShareableHandle"):
        return Cause("fabric-outside-domain", "a FABRIC handle imported across NVLink domains "
                     "or without a common IMEX channel (rows V5, V7)")
    if rule == "H5":
        # The exporter is named by its GPU; where ranks share a GPU (no cudaSetDevice, all on
        # device 0) the GPU names no rank, and the opener did not free the memory it opens.
        owner = peer_rank if peer_rank not in (None, p.rank) else None
        whose = (_who(cfg, owner, peer) if owner is not None else
                 f"memory on {peer}" if peer else "memory")
        return Cause("cuda-error", f"opened a handle of {whose} after that memory was gone; "
                     f"{RULE_REASONS['H5']}", after=owner, knock_on=True)
    if rule in RULE_REASONS:
        pair = f"{me} -> {_who(cfg, peer_rank, peer)}: " if peer else ""
        return Cause("cuda-error", pair + RULE_REASONS[rule])
    return Cause("cuda-error", "")


def cause_of(cfg: Any, p: "ProcResult", peers_failed: bool) -> Cause:
    """The kind and reason of one failed process. `peers_failed`: whether another process of
    the run failed (a hang then waits on it)."""
    e = p.first_cuda_error or {}
    if p.status == "hang":
        return Cause("hang", "still running at the timeout" +
                     (" after a peer failed" if peers_failed else ""), knock_on=peers_failed)
    if p.status == "ok" and p.residue:
        return Cause("leak", f"exited holding {len(p.residue)} item(s) (--residue fail)")
    if e and _injected(cfg, p):
        return Cause("injected", f"the scenario injected the failure of {e.get('api')}")
    if e:
        return _cuda_cause(cfg, p, e)
    m = _PEER_GONE.search(p.exception or "")
    if m:
        after = next((int(g) for g in m.groups() if g is not None), None)
        return Cause("crash", "a peer failed or exited first", after=after, knock_on=True)
    return Cause("crash", "")


@dataclass(frozen=True)
class RootCause:
    proc: "ProcResult"
    cause: Cause
    same: list["ProcResult"]                        # failed the same way on their own
    knock_on: list[tuple["ProcResult", Cause]]      # failed because of another's failure
    other: list[tuple["ProcResult", Cause]]         # failed otherwise, on their own


def _same_error(a: "ProcResult", b: "ProcResult") -> bool:
    ea, eb = a.first_cuda_error or {}, b.first_cuda_error or {}
    return (a.status, a.exception, ea.get("api"), ea.get("code"), ea.get("rule")) == \
        (b.status, b.exception, eb.get("api"), eb.get("code"), eb.get("rule"))


def causes(v: "Verdict") -> list[tuple["ProcResult", Cause]]:
    bad = [p for p in v.procs if not p.ok]
    return [(p, cause_of(v.cfg, p, len(bad) > 1)) for p in bad]


def root_cause(v: "Verdict") -> RootCause | None:
    """The first failure (lowest rank that is no knock-on), those that failed the same way,
    the knock-ons and the rest; None when nothing failed."""
    found = causes(v)
    if not found:
        return None
    primary = [(p, c) for p, c in found if not c.knock_on] or found
    p0, c0 = min(primary, key=lambda pc: (pc[0].worker, pc[0].rank, pc[0].slot))
    rest = [(p, c) for p, c in found if p is not p0]
    same = [p for p, c in rest if not c.knock_on and c.kind == c0.kind and _same_error(p, p0)]
    return RootCause(p0, c0, same,
                     [(p, c) for p, c in rest if c.knock_on],
                     [(p, c) for p, c in rest if not c.knock_on and all(p is not q for q in same)])


def run_kind(v: "Verdict") -> str:
    """One word for a run: ok, one of DEFECTS, or injected."""
    if v.ok:
        return "ok"
    kinds = [c.kind for _, c in causes(v)]
    if not kinds and v.undefined:
        return "undefined"        # every process exited well; the run hit undefined behaviour
    if "injected" in kinds:
        return "injected"         # a rank died of the scenario's fault; its peers' errors follow
    return next((k for k in DEFECTS if k in kinds), "crash")


def ranks_text(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5"."""
    out: list[tuple[int, int]] = []
    for r in sorted(ranks):
        if out and out[-1][1] == r - 1:
            out[-1] = (out[-1][0], r)
        else:
            out.append((r, r))
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in out)


def _who_failed(cfg: Any, p: "ProcResult") -> str:
    if p.worker:
        return f"worker (slot {p.slot}) of rank {p.rank} ({p.host})"
    return f"rank {p.rank} ({p.host}, GPU {cfg.placement[p.rank][1]})"


def root_cause_line(v: "Verdict") -> str:
    """The root cause in one line, the most telling first (a CI summary line shows only the
    first line of a failure): its kind, who, the failing call and where, and why."""
    rc = root_cause(v)
    if rc is None:
        return ""
    p, c, e = rc.proc, rc.cause, rc.proc.first_cuda_error
    what = (f"{e['api']} -> {e['name']} ({e['code']}) at {e['site'].split(' <- ')[0]}" if e
            else p.headline())
    others = len(rc.same) + len(rc.knock_on) + len(rc.other)
    return (f"{c.kind} on {_who_failed(v.cfg, p)}: {what}" + (f"; why: {c.reason}" if c.reason else "")
            + (f" (and {others} more failed process(es))" if others else ""))


def root_cause_lines(v: "Verdict") -> list[str]:
    """torchrun's "Root Cause (first observed failure)" block: the first failure, its error,
    where and why; then who failed the same way, the knock-ons and any other failure, one
    line each."""
    rc = root_cause(v)
    if rc is None:
        return []
    p, c = rc.proc, rc.cause
    lines = ["Root Cause (first observed failure):", f"  {_who_failed(v.cfg, p)}: {p.headline()}"]
    e = p.first_cuda_error
    if e:
        lines.append(f"    {e['api']} -> {e['name']} ({e['code']}) at {e['site']}")
    if c.reason:
        lines.append(f"    why: {c.reason}")
    if p.hang:
        lines += [f"    {x}" for x in p.hang.strip().splitlines()[:6]]
    if rc.same:
        lines.append(f"  the same failure on rank(s) {ranks_text([q.rank for q in rc.same])}")
    if rc.knock_on:
        lines.append(f"  knock-on failures (after a peer failed or exited): rank(s) "
                     f"{ranks_text([q.rank for q, _ in rc.knock_on])}")
    for q, qc in rc.other:
        lines.append(f"  also failed: {_who_failed(v.cfg, q)}: {q.headline()}"
                     + (f" (why: {qc.reason})" if qc.reason else ""))
    return lines
