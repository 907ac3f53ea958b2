"""`commsim sweep --exec PROG`: drive a user's program over generated machines, placements and
faults, and say which machine shapes break it.

Each generated scenario (the sweep generator's ids, s<seed>-<index>) gives a machine (topology
faults applied), where its ranks run and the driver faults of each rank; the program runs
hosted on it (inproc by default: fast and replayable). The oracle reads the verdict:

(the kinds are the verdict's own, commsim/launch/cause.py; the failure line carries its root
cause and reason)
- ipc-across-hosts: a legacy IPC open failed with cudaErrorInvalidResourceHandle while the
  ranks span hosts: the hardware refuses that to any program (row L8);
- fabric-outside-domain: a FABRIC handle import failed across NVLink domains / without IMEX;
- cuda-error: any other CUDA error the program died of, not injected by the scenario;
- hang, leak (residue at exit, with `--exec-residue fail`), crash (a non-CUDA exception);
- injected: the program died of a fault the scenario injected (reported, not a defect).
Each failure comes with the `commsim exec --scenario <id>` command that replays it.
"""

from __future__ import annotations

import io
import json
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, TextIO

from commsim.launch.config import RunConfig, load_scenario
from commsim.launch.run import execute
from commsim.launch.cause import DEFECTS, root_cause, run_kind
from commsim.launch.verdict import Verdict


@dataclass
class ExecSweep:
    program: list[str]
    records: list[dict] = field(default_factory=list)
    wall_s: float = 0.0
    seed: int | None = None           # the sampler's seed (None: the enumeration)
    filters: list[str] = field(default_factory=list)
    shard: str | None = None          # "K/N" when this is one shard of the sweep

    def to_json(self) -> dict:
        """The --json report; `sweep merge` reads the shards' back (read_report)."""
        return {"sweep": "exec", "program": self.program, "seed": self.seed,
                "filters": self.filters, "shard": self.shard, "count": len(self.records),
                "wall_s": round(self.wall_s, 3), "defects": len(self.defects),
                "records": self.records}

    @property
    def defects(self) -> list[dict]:
        return [r for r in self.records if r["kind"] in DEFECTS]

    def by_shape(self) -> dict[str, Counter]:
        out: dict[str, Counter] = defaultdict(Counter)
        for r in self.records:
            out[r["shape"]][r["kind"]] += 1
        return out

    def summary(self, max_lines: int = 20) -> str:
        n, d = len(self.records), len(self.defects)
        kinds = Counter(r["kind"] for r in self.records)
        lines = [f"sweep --exec {' '.join(self.program)}: {n} machine(s), {d} with a defect "
                 f"({', '.join(f'{k} {c}' for k, c in sorted(kinds.items()))}), {self.wall_s:.1f} s"]
        lines.append("machine shapes that break it:" if d else "no machine shape breaks it")
        for shape, c in sorted(self.by_shape().items()):
            bad = sum(v for k, v in c.items() if k in DEFECTS)
            if bad:
                first = next(r for r in self.defects if r["shape"] == shape)
                lines.append(f"  {shape}: {bad}/{sum(c.values())} runs "
                              f"({', '.join(f'{k} {v}' for k, v in sorted(c.items()) if k in DEFECTS)}); "
                              f"e.g. {first['id']}: {first['what']}")
                lines.append(f"      replay: {first['replay']}")
        inj = kinds.get("injected", 0)
        if inj:
            lines.append(f"{inj} run(s) ended on a fault the scenario injected (not counted as defects)")
        return "\n".join(lines)


def is_exec_report(d: Any) -> bool:
    return isinstance(d, dict) and d.get("sweep") == "exec"


def read_report(path: str) -> tuple[dict, list[dict]]:
    """A `sweep --exec --json` report: the report and its records."""
    from commsim.errors import UserError
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: cannot read the shard report: {e}") from None
    if not is_exec_report(d) or not isinstance(d.get("records"), list):
        raise UserError(f"{path}: not a `commsim sweep --exec PROG --json` report")
    return d, d["records"]


def merge_reports(paths: list[str]) -> ExecSweep:
    """One ExecSweep from the --json reports of the shards of one `sweep --exec` (the same
    program, seed and filters; every shard once)."""
    from commsim.scenario.executors import merge_shards
    head, records, wall, _ = merge_shards(
        paths, read_report,
        lambda d: {"program": d.get("program"), "seed": d.get("seed"), "filters": d.get("filters", [])},
        "commsim sweep --exec PROG --shard K/{of} --json ...")
    return ExecSweep(list(head["program"]), records, wall, head["seed"], list(head["filters"]))


def run_exec_sweep(program: list[str], ids: list[str], *, mode: str = "inproc",
                   timeout: float = 60.0, residue: str = "report", launcher: str = "torchrun",
                   progress: Callable[[int, int], None] | None = None,
                   versions: dict[str, str] | None = None) -> ExecSweep:
    rep = ExecSweep(program)
    t0 = time.monotonic()
    for i, sid in enumerate(ids):
        sc = load_scenario(sid)
        cfg = RunConfig(scenario=sid, mode=mode, timeout=timeout, residue=residue,
                        launcher=launcher, command=list(program), versions=dict(versions or {}))
        sink = io.StringIO()
        v = execute(cfg, out=sink, err=sink, echo=False)
        kind = run_kind(v)
        rc = root_cause(v)
        what = "ok" if not v.undefined else f"undefined behaviour: {v.undefined[0]}"
        if rc is not None:
            worst, e = rc.proc, rc.proc.first_cuda_error
            what = (f"rank {worst.rank}: {worst.exception or worst.headline()}"
                    + (f" ({e['api']} at {e['site']})" if e else "")
                    + (f"; why: {rc.cause.reason}" if rc.cause.reason else ""))
        rep.records.append({"id": sid, "shape": sc.topology_spec, "world": sc.world_size,
                            "hosts": len({g.host for g in sc.placement}), "kind": kind,
                            "what": what, "replay": cfg.replay_command()})
        if progress is not None:
            progress(i + 1, len(rep.defects))
    rep.wall_s = time.monotonic() - t0
    return rep


def progress_printer(total: int, stream: TextIO | None = None, every: int = 25) -> Callable[[int, int], None]:
    """Progress of an --exec sweep: a bar on a TTY, else a line every `every` machines (a run
    takes seconds, not milliseconds), each with its ETA. On `stream`, else the sys.stderr of
    the time of the call (not of the import: a caller may have replaced it since)."""
    from commsim.scenario.sweep import Progress
    p = Progress(total, stream, every_n=every, what="sweep --exec", unit="machines",
                 failed="with a defect")

    def say(done: int, defects: int) -> None:
        p.update(done, defects)
        if done == total:
            p.close()
    return say
