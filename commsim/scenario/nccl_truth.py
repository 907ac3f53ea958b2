"""What NCCL must do on one group of a scenario, from the scenario's truth (its cluster after
the faults) and NCCL's rules, without running NCCL: the oracle's expectation of the `nccl`
backend, which runs the simulated NCCL (commsim/libmodels/nccl/) through the ranks' drivers.

NCCL's choices per pair come from its decision model over the true machine
(commsim/libmodels/nccl_rules.py `machine_from_cluster`, rows NC1-NC12 of
docs/lifecycle-rules.md); what the machine then does to them is restated here from the
machine's facts (rows of docs/fidelity-rules.md), NVIDIA/nccl v2.27.3-1 as the source:

- set-up fails (at init, or at the first collective where 2.22+ connects at runtime):
  * the model's own init error (duplicate GPU: ncclInvalidUsage; MNNVL whose FABRIC
    self-test fails: ncclSystemError, unless the policy sets NCCL_MNNVL_ENABLE=0 first);
  * NVLS on and a host of the group without /dev/nvidia-caps: cuMulticastCreate /
    AddDevice answer CUDA_ERROR_INVALID_VALUE (row MC3), CUCHECK in nvlsGroupCreate
    (src/transport/nvls.cc): ncclUnhandledCudaError;
    A host whose container lacks /dev/nvidia-caps-imex-channels has no IMEX channel for its
    processes (row I1), so the model sees it as a host without IMEX;
  * an MNNVL pair on hosts of different IMEX domains: the peer's FABRIC import is refused
    (row I3): NVLS's multicast import at init, else the P2P buffer's at the first collective;
  * legacy IPC (cuMem off) over a pair whose IPC open is refused (rows P1, P2):
    cudaIpcOpenMemHandle fails, CUDACHECK (src/transport/p2p.cc).
- a collective hangs: a P2P pair whose peer writes are dropped (row P3): the flag never
  lands (src/device/prims_simple.h waits on it), as every pair carries bytes in the
  simulated all-reduce (libmodels/nccl/datapath.py);
- a collective returns wrong bytes: a P2P pair whose peer writes land corrupt (row P3).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from commsim.libmodels.nccl_rules import NcclDecision, decide, machine_from_cluster, parse_env
from commsim.topology.model import Cluster, GpuRef


@dataclass(frozen=True)
class NcclOutcome:
    fails: str = ""         # NCCL's set-up must fail: why ("" when it must not)
    hangs: str = ""         # a collective NCCL runs must hang: why
    wrong: str = ""         # a collective NCCL runs must return wrong bytes: why

    @property
    def clean(self) -> bool:
        return not (self.fails or self.hangs or self.wrong)


def nccl_decision(cluster: Cluster, gpus: Sequence[GpuRef], env: dict[str, str],
                  auto: bool = True) -> NcclDecision:
    """NCCL's decision for a communicator over `gpus` on the true `cluster` (the machine
    faults applied, a host without an IMEX channel device seen as one without IMEX), with
    the policy's NCCL_MNNVL_ENABLE=0 advice where `auto` and MNNVL's self-test fails."""
    m = machine_from_cluster(cluster, gpus)
    m = replace(m, ranks=tuple(r if cluster.host(r.host).container.imex_channel_dev
                               else replace(r, imex=False) for r in m.ranks))
    d = decide(m, parse_env(env))
    if (d.init_error is not None and d.init_error[0] == "ncclSystemError" and auto
            and env.get("NCCL_MNNVL_ENABLE") != "1"):
        d = decide(m, parse_env({**env, "NCCL_MNNVL_ENABLE": "0"}))
    return d


def _domain(cluster: Cluster, host: str) -> object:
    d = cluster.imex_domain_of(host)
    return None if d is None else d.hosts


def nccl_outcome(cluster: Cluster, gpus: Sequence[GpuRef], env: Sequence[tuple[str, str]] = (),
                 auto: bool = True) -> NcclOutcome:
    """NCCL's outcome for a communicator over `gpus` (rank order) on the true `cluster`,
    under the NCCL_* variables `env`; `auto`: the policy's NCCL_MNNVL_ENABLE=0 advice."""
    d = nccl_decision(cluster, gpus, dict(env), auto)
    if d.init_error is not None:
        return NcclOutcome(fails=f"{d.init_error[0]}: {d.init_error[1]}")
    hosts = sorted({g.host for g in gpus})
    if d.nvls:
        bare = [h for h in hosts if not cluster.host(h).container.nvidia_caps]
        if bare:
            return NcclOutcome(fails=f"NVLS on and {bare[0]} has no /dev/nvidia-caps: "
                                     f"cuMulticastCreate refused (row MC3)")
    hangs = wrong = ""
    for t in d.transports:
        if t.kind != "P2P":
            continue
        a, b = gpus[t.a], gpus[t.b]
        if a.host != b.host:
            if d.mnnvl and _domain(cluster, a.host) != _domain(cluster, b.host):
                return NcclOutcome(fails=f"MNNVL P2P between {a.host} and {b.host}, in different "
                                         f"IMEX domains: a FABRIC import is refused (row I3)")
            continue
        if a.index == b.index:
            continue
        link = cluster.host(a.host).link(a.index, b.index)
        if not d.cumem and link.p2p and link.ipc_refused:
            return NcclOutcome(fails=f"legacy IPC between {a} and {b} refused "
                                     f"({link.ipc_refused}, rows P1-P2)")
        lost = link.lost_writes
        if lost == "dropped" and not hangs:
            hangs = f"P2P between {a} and {b} drops peer writes (row P3)"
        elif lost == "corrupt" and not wrong:
            wrong = f"P2P between {a} and {b} corrupts peer writes (row P3)"
    return NcclOutcome(hangs=hangs, wrong=wrong)
