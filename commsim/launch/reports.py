"""What the processes of a run leave behind for the verdict: each one's report (JSON in the
run's reports directory, written at exit by the bootstrap) and, for a rank killed as hung,
the faulthandler dump of its stacks."""

from __future__ import annotations

import json
import os

from commsim.launch.config import RunConfig
from commsim.launch.verdict import ProcResult


def read_reports(run_dir: str) -> dict[int, dict]:
    out = {}
    d = os.path.join(run_dir, "reports")
    for name in os.listdir(d):
        if name.endswith(".json"):
            try:
                with open(os.path.join(d, name)) as f:
                    rep = json.load(f)
                out[int(rep["slot"])] = rep
            except (OSError, ValueError, KeyError):
                continue
    return out


def stacks(run_dir: str, slot: int) -> str:
    try:
        with open(os.path.join(run_dir, "stacks", f"{slot}.txt")) as f:
            return f.read()
    except OSError:
        return ""


def user_stack(dump: str) -> str:
    """The frames of a faulthandler dump that are the program's (not commsim's, not torch's
    internals), main thread first: where the rank waits."""
    keep = []
    for line in dump.splitlines():
        s = line.strip()
        if s.startswith("File ") and ("/commsim/" in s or "/site-packages/" in s
                                      or "/lib/python3" in s or "<frozen " in s):
            continue
        keep.append(line)
    if not any(x.strip().startswith("File ") for x in keep):
        return dump          # nothing of the program's own: the whole dump says more
    return "\n".join(keep)


def worker_results(cfg: RunConfig, reports: dict[int, dict]) -> list[ProcResult]:
    out = []
    for slot in sorted(s for s in reports if s >= cfg.world_size):
        rep = reports[slot]
        if not (rep.get("cuda") or rep.get("exception") or rep.get("residue")):
            continue     # a helper process (resource tracker, forkserver) that never used CUDA
        res = from_report(rep, worker=True)
        res.status = "failed" if rep.get("exception") else "ok"
        out.append(res)
    return out


def from_report(rep: dict, worker: bool = False) -> ProcResult:
    return ProcResult(int(rep["slot"]), int(rep.get("rank", 0)), rep.get("host", "?"),
                      int(rep.get("pid", 0)), exception=rep.get("exception"),
                      first_cuda_error=rep.get("first_cuda_error"),
                      cuda_errors=int(rep.get("cuda_errors", 0)),
                      residue=list(rep.get("residue", [])), flags=list(rep.get("flags", [])),
                      notes=list(rep.get("notes", [])), worker=worker)
