"""Helpers of tests/hosting: run a program hosted and read what its ranks printed."""

import json
import os
from pathlib import Path

PROGRAMS = Path(__file__).parent / "programs"
EXAMPLES = Path(__file__).parents[2] / "examples"

def results(text: str) -> dict[int, dict]:
    """The RESULT lines the ranks printed, by rank."""
    out = {}
    for line in text.splitlines():
        _, sep, blob = line.partition("RESULT ")
        if sep:
            d = json.loads(blob)
            out[d["rank"]] = d
    return out


def hosted(program: str | Path, machine: str, *args: str, mode: str = "inproc",
           nproc_per_host: int = 0, visible: str = "all", seed: int = 0,
           timeout: float = 120.0, residue: str = "report", launcher: str = "torchrun",
           zygote: bool = True, preload: tuple[str, ...] = (),
           versions: dict[str, str] | None = None, allow_undefined: bool = False) -> tuple:
    """Run a program hosted; (verdict, per-rank RESULT dicts, output). Checks that nothing
    of the run is left behind."""
    import io

    from commsim.launch.config import RunConfig
    from commsim.launch.run import execute
    from commsim.sim import shm
    out = io.StringIO()
    cfg = RunConfig(machine=machine, nproc_per_host=nproc_per_host, mode=mode, seed=seed,
                    visible=visible, timeout=timeout, residue=residue, launcher=launcher,
                    command=[str(program), *args], versions=dict(versions or {}),
                    allow_undefined=allow_undefined, zygote=zygote, preload=list(preload))
    v = execute(cfg, out=out, err=out)
    assert not os.path.exists(cfg.run_dir), "the run directory outlived the run"
    assert not shm.segments(cfg.shm_prefix), "shared-memory segments outlived the run"
    return v, results(out.getvalue()), out.getvalue()
