"""What a hosted run is: the machine, the placement of its ranks, the mode, the seed.

The launcher writes it once as JSON into the run's private directory (0700, created by
mkdtemp); every process of the run, spawned workers included, reads it back at start-up
through COMMSIM_HOSTING. JSON, not pickle: nothing of a run is unpickled from disk.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
from dataclasses import asdict, dataclass, field
from typing import Any

from commsim.errors import UserError

MODES = ("procs", "inproc")
VISIBLE = ("all", "one")
RESIDUE = ("report", "fail")   # --residue: what a process holding memory at exit is
# --launcher: whose environment the ranks get (torchrun's RANK/LOCAL_RANK/..., or Open MPI's
# mpirun OMPI_COMM_WORLD_*); under mpirun, mpi4py's COMM_WORLD spans the run's ranks.
LAUNCHERS = ("torchrun", "mpirun")


@functools.lru_cache(maxsize=8)
def load_scenario(spec: str) -> Any:
    """A scenario file, or a scenario the sweep generator makes from its id (s<seed>-<i>, e<i>)."""
    from commsim.scenario.generate import _ID, scenario_from_id
    if not os.path.exists(spec) and _ID.match(spec.strip()):
        return scenario_from_id(spec)
    from commsim.scenario.schema import load
    return load(spec)


@dataclass
class RunConfig:
    machine: str = ""                 # preset spec ("gb200-nvl72:2") when no scenario is given
    scenario: str = ""                # scenario .toml, or a generated id (s0-17, e42): topology, placement, faults, seed
    nproc_per_host: int = 0           # 0: one rank per GPU of each host
    ranks: int = 0                    # total ranks (0: nproc_per_host on every host)
    mode: str = "procs"
    seed: int = 0
    # "all": every GPU of the host; "one": CUDA_VISIBLE_DEVICES=<its GPU>; "3,1": that list for
    # every rank (launch/visible_devices.py)
    visible: str = "all"
    timeout: float = 120.0
    residue: str = "report"           # "report": listed, the run passes; "fail": a process exiting holding any fails the run
    launcher: str = "torchrun"        # "torchrun" | "mpirun": the launcher whose environment each rank gets
    command: list[str] = field(default_factory=list)   # the program: ["prog.py", args] or ["-m", "mod", args]
    zygote: bool = True               # procs: fork ranks from a warm zygote (False: a fresh interpreter each)
    preload: list[str] = field(default_factory=list)   # procs: the program's modules the zygote imports (opt-in)
    replay: str = ""                  # the command that replays the run when it is not `commsim exec` (a pytest node)
    run_dir: str = ""
    shm_prefix: str = ""
    placement: list[tuple[str, int]] = field(default_factory=list)   # filled by resolve()
    # --driver-version, --cuda-version, --torch-version, --nccl-version: field -> text, over
    # the scenario's [versions] and the installed defaults (commsim/versions.py).
    versions: dict[str, str] = field(default_factory=dict)
    # --allow-undefined: a run that hit undefined behaviour (a plain load or store through a
    # multicast address, memory used after its exporter freed it: fabric flags) still passes.
    allow_undefined: bool = False

    # -- the machine -----------------------------------------------------------------------
    def cluster(self) -> Any:
        if self.scenario:
            cluster = self._scenario().cluster
        else:
            from commsim.topology.presets import build
            cluster = build(self.machine)
        if not self.versions:
            return cluster
        import dataclasses
        return dataclasses.replace(cluster, versions=cluster.versions.with_fields(self.versions))

    def _scenario(self) -> Any:
        return load_scenario(self.scenario)

    def driver_faults(self, rank: int) -> Any:
        """The scenario's driver faults for `rank` (none without a scenario)."""
        from commsim.sim.faults import ProcessFaults
        if not self.scenario:
            return ProcessFaults()
        from commsim.scenario.runner import faults_for
        return faults_for(self._scenario(), rank)

    def resolve(self) -> "RunConfig":
        """Check the flags against the machine and fill in the placement (host-major: rank r
        on host r // nproc_per_host, GPU r % nproc_per_host, as torchrun numbers ranks)."""
        if self.mode not in MODES:
            raise UserError(f"--mode: {self.mode!r} is not a mode; use one of {', '.join(MODES)}")
        from commsim.launch import visible_devices
        if self.visible not in VISIBLE and not visible_devices.is_list(self.visible):
            raise UserError(f"--visible: {self.visible!r}; use one of {', '.join(VISIBLE)} or a "
                            f"CUDA_VISIBLE_DEVICES list of host GPU indices or GPU- UUIDs such "
                            f"as 3,1 (one per rank joined by ';': 0,1;1,0)")
        if not self.machine and not self.scenario:
            raise UserError("give --machine PRESET[:HOSTS] (e.g. gb200-nvl72:2) or --scenario FILE")
        if self.timeout <= 0:
            raise UserError(f"--timeout: must be > 0 seconds, got {self.timeout}")
        if self.residue not in RESIDUE:
            raise UserError(f"--residue: {self.residue!r}; use one of {', '.join(RESIDUE)}")
        if self.launcher not in LAUNCHERS:
            raise UserError(f"--launcher: {self.launcher!r} is not a launcher commsim imitates; "
                            f"use one of {', '.join(LAUNCHERS)}")
        if not self.command:
            raise UserError("no program: add `-- python prog.py ARGS` (or `-- python -m module`)")
        for name in self.preload:
            if not all(part.isidentifier() for part in name.split(".")):
                raise UserError(f"--preload: {name!r} is not a module name; give a dotted "
                                f"name the program imports (mypkg.model)")
        cluster = self.cluster()
        if self.scenario and not self.placement:
            sc = self._scenario()
            self.placement = [(g.host, g.index) for g in sc.placement]
            self.seed = self.seed or sc.seed
            hosts = {h for h, _ in self.placement}
            counts = {h: sum(1 for x, _ in self.placement if x == h) for h in hosts}
            self.nproc_per_host = max(counts.values())
            return self
        if not self.placement:
            if self.ranks and not self.nproc_per_host:
                if self.ranks % len(cluster.hosts):
                    raise UserError(f"ranks={self.ranks} do not spread evenly over the "
                                    f"{len(cluster.hosts)} host(s) of {self.machine}; give "
                                    f"nproc_per_host as well")
                self.nproc_per_host = self.ranks // len(cluster.hosts)
            per = self.nproc_per_host or len(cluster.hosts[0].gpus)
            for h in cluster.hosts:
                if per > len(h.gpus):
                    raise UserError(f"--nproc-per-host {per}: host {h.name} of {self.machine} has "
                                    f"only {len(h.gpus)} GPU(s); use at most {len(h.gpus)}")
            self.nproc_per_host = per
            if visible_devices.is_list(self.visible) and len(visible_devices.lists(self.visible)) > 1:
                self.placement = self._per_rank_placement(cluster, per)
            elif visible_devices.is_list(self.visible):
                # Local rank l drives the l-th visible GPU; more ranks than GPUs share them.
                lists = {h.name: visible_devices.check(self.visible, h.name,
                                                       visible_devices.host_uuids(h))
                         for h in cluster.hosts}
                self.placement = [(h.name, lists[h.name][i % len(lists[h.name])])
                                  for h in cluster.hosts for i in range(per)]
            else:
                self.placement = [(h.name, i) for h in cluster.hosts for i in range(per)]
            if self.ranks:
                if self.ranks > len(self.placement):
                    raise UserError(f"ranks={self.ranks}: {self.machine} with {per} per host "
                                    f"places at most {len(self.placement)}")
                self.placement = self.placement[:self.ranks]
        return self

    def _per_rank_placement(self, cluster: Any, per: int) -> list[tuple[str, int]]:
        """One CUDA_VISIBLE_DEVICES per rank: rank r (host-major) drives ordinal 0 of its own."""
        from commsim.launch import visible_devices
        parts = visible_devices.lists(self.visible)
        world = self.ranks or per * len(cluster.hosts)
        if len(parts) != world:
            raise UserError(f"--visible {self.visible}: {len(parts)} per-rank lists for {world} "
                            f"rank(s); give one list per rank, joined by ';'")
        out = []
        for r, text in enumerate(parts):
            h = cluster.hosts[r // per]
            seen = visible_devices.check(text, h.name, visible_devices.host_uuids(h))
            out.append((h.name, seen[0]))
        return out

    @property
    def world_size(self) -> int:
        return len(self.placement)

    def local_rank(self, rank: int) -> tuple[int, int]:
        """(LOCAL_RANK, LOCAL_WORLD_SIZE) of a rank: its position among its host's ranks."""
        host = self.placement[rank][0]
        same = [r for r, (h, _) in enumerate(self.placement) if h == host]
        return same.index(rank), len(same)

    def host_index(self, rank: int) -> int:
        hosts: list[str] = []
        for h, _ in self.placement:
            if h not in hosts:
                hosts.append(h)
        return hosts.index(self.placement[rank][0])

    @property
    def num_hosts(self) -> int:
        return len({h for h, _ in self.placement})

    # -- persistence --------------------------------------------------------------------------
    def dump(self, path: str) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(self), f)

    @classmethod
    def load(cls, path: str) -> "RunConfig":
        with open(path) as f:
            d = json.load(f)
        d["placement"] = [tuple(p) for p in d.get("placement", ())]
        return cls(**d)

    def replay_command(self) -> str:
        """The command line that runs this again, decision for decision."""
        if self.replay:
            return self.replay
        parts = ["commsim", "exec"]
        parts += ["--scenario", self.scenario] if self.scenario else ["--machine", self.machine]
        if not self.scenario:
            parts += ["--nproc-per-host", str(self.nproc_per_host)]
        parts += ["--mode", self.mode, "--seed", str(self.seed)]
        if self.visible != "all":
            parts += ["--visible", self.visible]
        if self.timeout != RunConfig.timeout:
            # A hang's verdict depends on it (and, inproc, a program's virtual sleeps).
            parts += ["--timeout", f"{self.timeout:g}"]
        if self.residue != "report":
            parts += ["--residue", self.residue]
        if self.launcher != "torchrun":
            parts += ["--launcher", self.launcher]
        if self.mode == "procs" and not self.zygote:
            parts += ["--fresh-interpreters"]
        for name in self.preload if self.mode == "procs" else ():
            parts += ["--preload", name]
        for k, v in self.versions.items():
            parts += [f"--{k}-version", v]
        if self.allow_undefined:
            parts += ["--allow-undefined"]
        return shlex.join(parts + ["--", "python"] + list(self.command))
