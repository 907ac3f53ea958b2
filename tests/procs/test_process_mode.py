"""The same scenarios in thread mode and in process mode give the same outcome:
verdict, backend per group/op/size/dtype, errors (name, step, failing rank), numerics, ledger,
flags and the communicators' decision traces (RunResult.outcome)."""

from __future__ import annotations

import os
import pprint
from pathlib import Path

import pytest

from commsim.procs.launcher import run_scenario_procs
from commsim.scenario.model import Group, Scenario, Workload
from commsim.scenario.runner import run_scenario
from commsim.scenario.schema import load
from commsim.topology import build_preset

from run_hygiene import leftover_segments, pid_alive

ROOT = Path(__file__).resolve().parents[2]
KiB, MiB = 1 << 10, 1 << 20


def assert_same_outcome(procs, threads) -> None:
    """Outcomes equal, or a message with every differing field in full (pytest's own diff
    elides the middle of long explain texts, which is where they differ)."""
    a, b = procs.outcome(), threads.outcome()
    diff = {k: {"procs": a.get(k), "threads": b.get(k)} for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)}
    assert not diff, ("process mode differs from thread mode:\n" + pprint.pformat(diff, width=100)
                      + f"\nprocess-mode errors: {procs.errors}")


def gb200_two_trays_tp8() -> Scenario:
    c = build_preset("gb200-nvl72:2")
    return Scenario(name="gb200-2tray-tp8", cluster=c, placement=tuple(c.gpu_refs()),
                    groups=(Group("tp", tuple(range(8))),),
                    # 4 KiB: fabric (MNNVL) across the trays; 8 MiB: multicast through a
                    # FABRIC handle, its team table shared between the processes.
                    workload=Workload(ops=("all_reduce",), sizes=(4 * KiB, 8 * MiB),
                                      dtypes=("bfloat16",)),
                    seed=3)


CASES = [
    ("hgx-tp8", lambda: load(ROOT / "scenarios/topologies/hgx-h100-8.toml"), None),
    ("gb200-2tray-tp8", gb200_two_trays_tp8, None),
    ("flashinfer-2006", lambda: load(ROOT / "scenarios/regressions/flashinfer-2006-fusion-workspace.toml"), None),
    ("flashinfer-2006-default", lambda: load(ROOT / "scenarios/regressions/flashinfer-2006-fusion-workspace.toml"), "default"),
    ("vllm-52778", lambda: load(ROOT / "scenarios/regressions/vllm-52778-graph-registration.toml"), None),
    ("vllm-52778-default", lambda: load(ROOT / "scenarios/regressions/vllm-52778-graph-registration.toml"), "default"),
    # The functional P2P probe runs in process mode too (its helper processes in a fabric of
    # their own): patched P2P's lost writes rule IPC out as in thread mode (row P3).
    ("p2p-patched-writes", lambda: load(ROOT / "scenarios/fidelity/p2p-patched-writes-corrupt.toml"), None),
]


@pytest.mark.parametrize("make,policy", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_process_mode_matches_thread_mode(make, policy):
    sc = make()
    threads = run_scenario(sc, policy=policy)
    procs = run_scenario_procs(sc, policy=policy, timeout=30)
    assert threads.ok, threads.failures
    assert_same_outcome(procs, threads)
    assert procs.failures == threads.failures
    assert not leftover_segments(os.getpid())
    assert procs.pids and not any(pid_alive(p) for p in procs.pids)


# A hang regression ends at this real-time timeout. It must be long enough that a healthy rank
# delayed by a loaded 2-core CI machine is never mistaken for the one that did not arrive (3 s
# once named rank 7, still connecting, beside the culprit).
HANG_TIMEOUT = 8

REGRESSIONS = sorted(p.stem for p in (ROOT / "scenarios/regressions").glob("*.toml"))


@pytest.mark.parametrize("name", REGRESSIONS)
def test_every_regression_fails_the_same_way_in_process_mode(name):
    """Each shipped regression under its own (shortcut) policy: same verdict, errors by name,
    step and failing rank, leaks and flagged rows as in thread mode. Hangs are real-time
    timeouts here (HANG_TIMEOUT) where thread mode diagnoses them in virtual time."""
    sc = load(ROOT / f"scenarios/regressions/{name}.toml")
    threads = run_scenario(sc)
    procs = run_scenario_procs(sc, timeout=HANG_TIMEOUT)
    assert threads.ok and procs.ok, procs.failures
    assert_same_outcome(procs, threads)
    assert not leftover_segments(os.getpid())


def test_regressions_fail_as_reported_and_pass_under_default_in_process_mode():
    for name in ("flashinfer-2006-fusion-workspace", "vllm-52778-graph-registration"):
        sc = load(ROOT / f"scenarios/regressions/{name}.toml")
        shortcut = run_scenario_procs(sc, timeout=30)
        assert shortcut.expects_failure and shortcut.ok, shortcut.failures
        assert {e.name for e in shortcut.errors} == {"cudaErrorInvalidResourceHandle"}
        fixed = run_scenario_procs(sc, policy="default", timeout=30)
        assert fixed.ok and set(fixed.backends.values()) == {"fabric"}, fixed.failures


def _communicator_case(preset: str, ranks: list[int] | None, sizes, capture: bool) -> Scenario:
    c = build_preset(preset)
    refs = list(c.gpu_refs())
    ranks = ranks if ranks is not None else list(range(len(refs)))
    return Scenario(name=f"{preset}-{len(ranks)}", cluster=c,
                    placement=tuple(refs[i] for i in ranks),
                    groups=(Group("tp", tuple(range(len(ranks)))),),
                    workload=Workload(ops=("all_reduce", "all_gather", "reduce_scatter"),
                                      sizes=tuple(sizes), dtypes=("bfloat16", "float32"),
                                      graph_capture=capture),
                    seed=7)


# A slice of tests/unit/test_communicator.py's machines: the rest of that file runs in thread
# mode only (process mode costs a fork per rank; these cover each backend and both hosts cases).
COMM_CASES = [
    ("gb200-tp2-across", "gb200-nvl72:2", [0, 4], (4 * KiB,), True),
    ("a100-tp2-pair", "a100-pcie-bridge-8", [0, 1], (4 * KiB, 512 * KiB), True),
    ("l40s-tp4", "l40s-8-pcie", [0, 1, 2, 3], (4 * KiB,), False),
    ("hgx-tp4-two-shot", "hgx-h100-8", [0, 1, 2, 3], (1 * MiB,), False),
]


@pytest.mark.parametrize("case", COMM_CASES, ids=[c[0] for c in COMM_CASES])
def test_communicator_cases_match_thread_mode(case):
    sc = _communicator_case(*case[1:])
    threads = run_scenario(sc)
    procs = run_scenario_procs(sc, timeout=30)
    assert threads.ok and not threads.leaks, threads.failures
    assert_same_outcome(procs, threads)
    assert not leftover_segments(os.getpid())
