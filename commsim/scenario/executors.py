"""Where a sweep's scenarios run, and how partial sweeps come back together.

- `shard(ids, "K/N")`: the K-th of N interleaved slices of a sweep (ids K-1, K-1+N, ...), so
  a CI matrix of N jobs covers the sweep once and each job gets a like mix of cheap and
  expensive scenarios.
- `run_ray(ids, ...)`: every chunk of ids is a Ray task (`pip install commsim[ray]`): a local
  Ray started in this process by default, or an existing cluster at `address`. Ray is an
  optional extra, imported only here.
- `merge(paths)`: shard reports (`sweep --json`) back into one report. A record is a
  function of its id alone, so the merged report equals the unsharded one, timing aside
  (`Report.canonical`).
"""

from __future__ import annotations

import json
import os
import re
import socket
import shlex
from typing import Any, Callable, Mapping

from commsim.errors import UserError
from commsim.util.fileio import read_input
from commsim.scenario.sweep_report import Report

# A sweep's runner of one scenario id: (id, determinism mode) -> its record.
RunOne = Callable[[str, str], dict]

_SHARD = re.compile(r"^(\d+)/(\d+)$")
_ID = re.compile(r"^([sek])(?:(\d+)-)?(\d+)$")


def parse_shard(text: str) -> tuple[int, int]:
    """'K/N' -> (K, N) with 1 <= K <= N, or a UserError naming --shard."""
    m = _SHARD.match(text.strip())
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise UserError(f"--shard {text!r}: expected K/N with 1 <= K <= N (e.g. --shard 2/4 "
                        f"for the second of four CI jobs)")
    return int(m.group(1)), int(m.group(2))


def shard(ids: list[str], spec: str | None) -> list[str]:
    if not spec:
        return ids
    k, n = parse_shard(spec)
    return ids[k - 1::n]


def replay_command(sid: str, versions: Mapping[str, str] | None = None) -> str:
    """The command that reruns id `sid`, with the version flags the sweep pinned."""
    from commsim.versions import flags_of
    return shlex.join(["commsim", "replay", sid] + flags_of(versions or {}))


def id_order(sid: str) -> tuple:
    """Sort key that restores a sweep's own order (select_ids yields increasing indices)."""
    m = _ID.match(sid)
    # A knob id k<seed>-<index> stands in the sampler's walk at its index (knobs.py).
    return (m.group(1).replace("k", "s"), int(m.group(2) or 0), int(m.group(3))) if m else ("~", 0, 0, sid)


# -- Ray ---------------------------------------------------------------------------------------------
RAY_ADDRESS = "RAY_ADDRESS"
# How long the driver waits for a TCP connection to a named cluster before saying it is not
# there: Ray itself retries an unreachable GCS without end (Ray 2.60, gcs_client.cc).
RAY_CONNECT_TIMEOUT_S = 10.0


def _check_reachable(address: str, named_by: str) -> None:
    """A UserError unless `address` (host:port, optionally ray://) accepts a TCP connection
    within RAY_CONNECT_TIMEOUT_S. 'auto' is left to Ray, which finds the local cluster's
    address in its own files and says so when there is none."""
    hostport = address.split("://", 1)[-1]
    if hostport == "auto":
        return
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise UserError(f"{named_by} {address!r}: expected host:port of a Ray cluster's head "
                        f"(e.g. 10.0.0.5:6379) or 'auto'")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=RAY_CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise UserError(f"--executor ray: no Ray cluster at {address} ({named_by}): "
                        f"{e.strerror or e}; start one with `ray start --head` or fix the "
                        f"address") from None


def ray_missing() -> str | None:
    """Why Ray cannot be used here, or None when it can."""
    try:
        import ray  # noqa: F401
    except ImportError as e:
        return f"--executor ray needs Ray: pip install 'commsim[ray]' ({e})"
    return None


def _ray_chunk(run: RunOne, ids: list[str], determinism: str) -> list[dict]:
    return [run(sid, determinism) for sid in ids]


def run_ray(ids: list[str], jobs: int, determinism: str, run: RunOne, take: Callable[[dict], None],
            address: str | None = None, chunk: int = 25) -> None:
    """Run `ids` as Ray tasks of up to `chunk` ids, each id by `run` (the sweep's run_one,
    which Ray pickles by reference); `take` gets every record as it lands.
    `address`: an existing cluster ('auto' or host:port; Ray's RAY_ADDRESS when not given),
    checked to answer within RAY_CONNECT_TIMEOUT_S; otherwise a local Ray with `jobs`
    CPUs is started here and shut down at the end. The workers must be able to import this
    commsim (the same checkout, or the same version installed on every node)."""
    why = ray_missing()
    if why:
        raise UserError(why)
    import ray

    started = False
    if not ray.is_initialized():
        kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                              "configure_logging": False}
        # Ray's own convention (ray/_private/worker.py, Ray 2.60: init): RAY_ADDRESS names the
        # cluster when no address is given. Joining one, Ray refuses num_cpus ("num_cpus and
        # num_gpus must not be provided"): the cluster's size is its own.
        joined = address or os.environ.get(RAY_ADDRESS) or None
        if joined:
            kw["address"] = joined
            _check_reachable(joined, "--ray-address" if address else RAY_ADDRESS)
        else:
            # Loopback as the node address: Ray binds some of its servers to it. Ray 2.60's
            # GCS and raylet still listen on every interface (with Ray's token auth on):
            # the trust cost of asking for --executor ray, stated in its --help.
            kw["num_cpus"] = jobs
            kw["_node_ip_address"] = "127.0.0.1"
        # Workers import commsim from the source tree the driver runs from, and run at the
        # driver's priority: Ray starts task workers at nice RAY_worker_niceness, 15 unless
        # set, and reads it from the worker's environment (Ray's job manager sets it to 0 the
        # same way: ray/dashboard/modules/job/job_manager.py, Ray 2.60).
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        kw["runtime_env"] = {"env_vars": {
            "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p),
            "RAY_worker_niceness": "0"}}
        try:
            ray.init(**kw)
        except Exception as e:      # unreachable cluster, bad address: say so, no traceback
            where = f" at {joined} ({'--ray-address' if address else RAY_ADDRESS})" if joined else ""
            raise UserError(f"--executor ray: could not start or reach Ray{where}: {e}") from e
        started = True
    try:
        task = ray.remote(num_cpus=1)(_ray_chunk)
        pending = [task.remote(run, ids[i:i + chunk], determinism) for i in range(0, len(ids), chunk)]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for rec in ray.get(done[0]):
                take(rec)
    finally:
        if started:
            ray.shutdown()


# -- merging shard reports --------------------------------------------------------------------------
# What merging reads of each scenario record, and the type each must have: a shard report is
# a file anyone may have edited, so a field missing or of another type is named, not a crash.
_RECORD_FIELDS: dict[str, type | tuple[type, ...]] = {
    "id": str, "ok": bool, "kinds": list, "backends": dict, "shape": str, "layout": str,
    "description": str, "notes": list, "checked_determinism": bool, "seconds": (int, float),
}
_FAILURE_FIELDS: dict[str, type | tuple[type, ...]] = {"id": str, "failures": list}
_FAILURE_ITEM_FIELDS: dict[str, type | tuple[type, ...]] = {"kind": str, "detail": str}


def _check_fields(path: str, what: str, obj: Any, fields: dict) -> None:
    if not isinstance(obj, dict):
        raise UserError(f"{path}: {what} is a {type(obj).__name__}, not an object: not a "
                        f"`commsim sweep --json` report")
    for name, kind in fields.items():
        if name not in obj:
            raise UserError(f"{path}: {what} has no field {name!r}: not a `commsim sweep --json` report")
        kinds = kind if isinstance(kind, tuple) else (kind,)
        v = obj[name]
        if not isinstance(v, kinds) or (isinstance(v, bool) and bool not in kinds):
            raise UserError(f"{path}: {what}: field {name!r} is a {type(v).__name__}, not "
                            f"{' or '.join(k.__name__ for k in kinds)}")


def _records(path: str) -> tuple[dict, list[dict]]:
    try:
        d = json.loads(read_input(path))
    except OSError as e:
        raise UserError(f"{path}: cannot read the shard report: {e.strerror}") from e
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not a sweep JSON report (line {e.lineno}: {e.msg}); write one "
                        f"with `commsim sweep --shard K/N --json {path}`") from e
    except RecursionError:
        raise UserError(f"{path}: not a sweep JSON report (nested deeper than a report ever is)") from None
    if not isinstance(d, dict) or not isinstance(d.get("scenarios"), list):
        raise UserError(f"{path}: no 'scenarios' list: not a `commsim sweep --json` report")
    if not isinstance(d.get("failures", []), list):
        raise UserError(f"{path}: 'failures' is not a list: not a `commsim sweep --json` report")
    for n, s in enumerate(d["scenarios"], 1):
        _check_fields(path, f"scenario record {n}", s, _RECORD_FIELDS)
        if not _ID.match(s["id"]):
            raise UserError(f"{path}: scenario record {n}: {s['id']!r} is not a sweep scenario id")
    for n, f in enumerate(d.get("failures", []), 1):
        _check_fields(path, f"failure record {n}", f, _FAILURE_FIELDS)
        for m, item in enumerate(f["failures"], 1):
            _check_fields(path, f"failure record {n}, item {m}", item, _FAILURE_ITEM_FIELDS)
    for key, kind in (("wall_s", (int, float)), ("jobs", int), ("seed", int), ("filters", list)):
        if d.get(key) is not None and (not isinstance(d[key], kind) or isinstance(d[key], bool)):
            raise UserError(f"{path}: field {key!r} is a {type(d[key]).__name__}: not a "
                            f"`commsim sweep --json` report")
    fails = {f["id"]: f["failures"] for f in d.get("failures", [])}
    # The replay command is rebuilt from the id: a report's own string is never shown to run.
    recs = [dict(s, failures=fails.get(s["id"], []), replay=replay_command(s["id"]))
            for s in d["scenarios"]]
    return d, recs


def merge_shards(paths: list[str], read: Callable[[str], tuple[dict, list[dict]]],
                 sweep_of: Callable[[dict], dict], how: str) -> tuple[dict, list[dict], float, int]:
    """The shards of one sweep, read by `read` (-> the report, its records): the sweep's key
    (`sweep_of`: what must agree, e.g. seed and filters), the records in id order, the slowest
    shard's wall time and the jobs of all. Refuses reports of different sweeps, a scenario
    present twice and an incomplete set of shards (the missing ones are named, with `how`:
    the command that writes one)."""
    if not paths:
        raise UserError("sweep merge: give the shard reports to merge (JSON files)")
    records: list[dict] = []
    seen: dict[str, str] = {}
    head: dict | None = None
    shards: dict[int, str] = {}
    of = None
    wall, jobs = 0.0, 0
    for p in paths:
        d, recs = read(p)
        wall, jobs = max(wall, float(d.get("wall_s") or 0.0)), jobs + int(d.get("jobs") or 0)
        key = sweep_of(d)
        if head is None:
            head = key
        elif key != head:
            theirs = ", ".join(f"{k} {v}" for k, v in key.items())
            first = ", ".join(f"{k} {v}" for k, v in head.items())
            raise UserError(f"{p}: from another sweep ({theirs}; the first report has {first})")
        if d.get("shard"):
            k, n = parse_shard(d["shard"])
            if of is not None and n != of:
                raise UserError(f"{p}: shard {d['shard']} is of {n}, the others of {of}")
            if k in shards:
                raise UserError(f"{p}: shard {d['shard']} was already given ({shards[k]})")
            of, shards[k] = n, p
        for r in recs:
            if r["id"] in seen:
                raise UserError(f"{p}: scenario {r['id']} is also in {seen[r['id']]}: "
                                f"the reports overlap")
            seen[r["id"]] = p
            records.append(r)
    if of is not None and len(shards) != of:
        missing = ", ".join(f"{k}/{of}" for k in range(1, of + 1) if k not in shards)
        raise UserError(f"sweep merge: shard(s) {missing} missing; run `{how.format(of=of)}` "
                        f"for each and merge all {of}")
    records.sort(key=lambda r: id_order(r["id"]))
    assert head is not None
    # Shards run side by side: the merged sweep took as long as its slowest shard.
    return head, records, wall, jobs


def merge(paths: list[str]) -> Report:
    """One Report from the JSON reports of the shards of one scenario sweep."""
    head, records, wall, jobs = merge_shards(
        paths, _records, lambda d: {"seed": d.get("seed"), "filters": d.get("filters", [])},
        "commsim sweep --shard K/{of} --json ...")
    rep = Report(records, wall_s=wall, jobs=jobs, executor="merged")
    rep.seed, rep.filters = head["seed"], list(head["filters"])
    return rep
