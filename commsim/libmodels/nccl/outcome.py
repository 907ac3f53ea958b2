"""What the simulated NCCL's set-up did on the machine, as `commsim explain` prints it for a
group that falls back to NCCL: the transport of each pair (with why not a nearer one), NVLS
on or off and why, when the connections are made, and, where set-up failed, the failing
call and NCCL's error text (the decision trace's line for the `nccl` backend carries it)."""

from __future__ import annotations

from commsim.libmodels.nccl_rules import NcclDecision

PAIRS_LISTED = 12       # per transport; a larger communicator names the first pairs and the count


def pairs(d: NcclDecision) -> str:
    """Each pair's transport, pairs of one transport (and one reason for not a nearer one)
    together: `P2P via cuMem POSIX fd over NVLink: 0-1, 0-2 (2 pairs)`."""
    groups: dict[tuple[str, str, str], list[str]] = {}
    for t in d.transports:
        groups.setdefault((t.kind, t.via, t.why), []).append(f"{t.a}-{t.b}")
    out = []
    for (kind, via, why), ps in groups.items():
        named = ", ".join(ps[:PAIRS_LISTED]) + (", ..." if len(ps) > PAIRS_LISTED else "")
        out.append(f"{kind} via {via}" + (f" ({why})" if why else "") +
                   f": {named} ({len(ps)} pair{'s' * (len(ps) > 1)})")
    return "; ".join(out) or "none (one rank)"


def nvls(d: NcclDecision, note: str) -> str:
    """NVLS as set-up left it (`note`, from nvls.setup), else as the search decided it."""
    return note or next((n for n in d.notes if n.startswith("NVLS")), "NVLS off")


def describe(d: NcclDecision, nvls_note: str, connected: bool) -> str:
    """One communicator's set-up outcome on the machine, in one line."""
    when = "connected at init" if connected else "connections at the first collective (runtime connect)"
    return f"NCCL on the machine: {nvls(d, nvls_note)}; {when}; pairs: {pairs(d)}"


def failed(d: NcclDecision | None, result: str, warn: str, api: str, cause: str) -> str:
    """A failed set-up: NCCL's result, its WARN and the CUDA call behind it, and what the
    search had decided when it failed."""
    text = f"{result}: {warn}" + (f" ({api} -> {cause})" if cause else "")
    if d is not None and d.init_error is None:
        text += f" [NCCL had decided: {nvls(d, '')}; pairs: {pairs(d)}]"
    return text
