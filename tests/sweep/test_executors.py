"""Sharded, multi-job and Ray sweeps give the same report as one in-process sweep (timing,
executor and job count aside), and shard reports merge back into it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from commsim.cli import main
from commsim.errors import UserError
from commsim.scenario.executors import merge, parse_shard, ray_missing, run_ray, shard
from commsim.scenario.sweep import run_sweep, select_ids

# The default mix (faults included), small enough to run four times in seconds.
IDS = select_ids(16, seed=21)
needs_ray = pytest.mark.skipif(ray_missing() is not None,
                               reason=f"{ray_missing()} (CI installs the extra)")


@pytest.fixture(scope="module")
def baseline() -> dict:
    rep = run_sweep(IDS, jobs=1)
    assert len(rep.records) == len(IDS)
    return rep.canonical()


def _write(rep, path, shard_spec=None) -> str:
    rep.shard = shard_spec
    rep.write_json(str(path))
    return str(path)


@pytest.mark.parametrize("n", [2, 3])
def test_merged_shards_equal_the_whole_sweep(baseline: dict, tmp_path, n: int) -> None:
    paths = []
    for k in range(1, n + 1):
        part = shard(IDS, f"{k}/{n}")
        assert part == IDS[k - 1::n]
        paths.append(_write(run_sweep(part, jobs=1), tmp_path / f"s{k}.json", f"{k}/{n}"))
    merged = merge(list(reversed(paths)))          # the order of the files does not matter
    assert merged.canonical() == baseline
    assert [r["id"] for r in merged.records] == IDS


def test_worker_processes_equal_in_process(baseline: dict) -> None:
    assert run_sweep(IDS, jobs=2).canonical() == baseline


@needs_ray
def test_ray_executor_equals_in_process(baseline: dict) -> None:
    rep = run_sweep(IDS, jobs=2, executor="ray")     # a local 2-CPU Ray, started and stopped here
    assert rep.executor == "ray"
    assert rep.canonical() == baseline


def test_merge_refuses_incomplete_overlapping_or_foreign_reports(tmp_path) -> None:
    ids = select_ids(4, seed=22, filters=["clean"])
    a = _write(run_sweep(ids[0::2], jobs=1), tmp_path / "a.json", "1/2")
    with pytest.raises(UserError, match=r"shard\(s\) 2/2 missing"):
        merge([a])
    with pytest.raises(UserError, match="already given"):
        merge([a, a])
    b = _write(run_sweep(ids[0::2], jobs=1), tmp_path / "b.json", "2/2")
    with pytest.raises(UserError, match="overlap"):
        merge([a, b])
    other = run_sweep(ids[1::2], jobs=1)
    other.seed = 5
    c = _write(other, tmp_path / "c.json", "2/2")
    with pytest.raises(UserError, match="from another sweep"):
        merge([a, c])
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UserError, match="not a sweep JSON report"):
        merge([str(bad)])
    for spec in ("0/2", "3/2", "x", "1/0"):
        with pytest.raises(UserError, match="--shard"):
            parse_shard(spec)


def test_cli_shard_then_merge(capsys, tmp_path) -> None:
    outs = []
    for k in (1, 2):
        js = tmp_path / f"{k}.json"
        assert main(["sweep", "--count", "6", "--seed", "23", "--filter", "clean", "--shard",
                     f"{k}/2", "--json", str(js), "--quiet"]) == 0
        outs.append(str(js))
        assert json.loads(js.read_text())["shard"] == f"{k}/2"
    m = tmp_path / "m.json"
    assert main(["sweep", "merge", *outs, "--json", str(m)]) == 0
    out = capsys.readouterr().out
    assert "merged 2 report(s)" in out and "6 scenario(s), 6 clean, 0 failed" in out
    d = json.loads(m.read_text())
    assert [s["id"] for s in d["scenarios"]] == select_ids(6, seed=23, filters=["clean"])
    assert main(["sweep", "--shard", "5/2", "--count", "2"]) == 2
    assert "--shard '5/2'" in capsys.readouterr().err
    assert main(["sweep", "--ray-address", "auto", "--count", "1"]) == 2
    assert "--ray-address needs --executor ray" in capsys.readouterr().err


# A Ray head in a process of its own, as a user's `ray start --head` would be; it prints its
# GCS address and lives until its stdin closes (its cluster goes with it: no `ray stop`, which
# would end every Ray of this user).
_HEAD = """
import sys, ray
ctx = ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
               configure_logging=False, log_to_driver=False)
print(ctx.address_info["gcs_address"], flush=True)
sys.stdin.read()
"""


@needs_ray
@pytest.mark.parametrize("cluster", ["local", "RAY_ADDRESS"])
def test_ray_joins_ray_address_and_runs_workers_at_normal_priority(monkeypatch, cluster: str) -> None:
    import ray

    def probe(sid: str, determinism: str) -> dict:      # local: pickled by value to the worker
        import os as _os
        import ray as _ray
        return {"id": sid, "nice": _os.nice(0), "gcs": _ray.get_runtime_context().gcs_address}

    head = None
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    if cluster == "RAY_ADDRESS":
        head = subprocess.Popen([sys.executable, "-c", _HEAD], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        monkeypatch.setenv("RAY_ADDRESS", head.stdout.readline().strip())
    try:
        got: list[dict] = []
        run_ray(["s0", "s1", "s2"], 2, "off", probe, got.append, chunk=1)
    finally:
        if head is not None:
            head.stdin.close()
            head.wait(timeout=60)
    assert not ray.is_initialized()
    assert sorted(r["id"] for r in got) == ["s0", "s1", "s2"]
    # Ray's default is nice 15 for task workers; ours run at this process's own priority.
    assert {r["nice"] for r in got} == {os.nice(0)}
    if cluster == "RAY_ADDRESS":
        assert {r["gcs"] for r in got} == {os.environ["RAY_ADDRESS"]}


@needs_ray
def test_ray_unreachable_address_is_a_named_error(capsys) -> None:
    # Ray itself retries an address where nothing listens without end.
    assert main(["sweep", "--executor", "ray", "--ray-address", "127.0.0.1:1", "--count", "1"]) == 2
    err = capsys.readouterr().err
    assert "no Ray cluster at 127.0.0.1:1 (--ray-address)" in err and "Traceback" not in err
    assert main(["sweep", "--executor", "ray", "--ray-address", "nohost", "--count", "1"]) == 2
    assert "expected host:port" in capsys.readouterr().err
