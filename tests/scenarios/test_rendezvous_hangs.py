"""The rendezvous failure modes of symmetric memory (and graph registration), each a
shipped regression that fails under its shortcut policy within a bounded time with a
diagnosis naming who did not arrive, where they were expected and where each rank was; that
passes under the default policy with no leak; and that stops failing when the one shortcut
knob is set back (the knob is the cause, not the scenario)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from commsim.libmodels.fd_exchange import FLASHINFER_TIMEOUT as FD_EXCHANGE_TIMEOUT
from commsim.policy import resolve
from commsim.scenario.runner import run_scenario
from commsim.scenario.schema import load

REG = Path(__file__).resolve().parents[2] / "scenarios" / "regressions"

# file -> (outcome, step, texts the failing ranks' reports must show, the knob that fixes it,
#          backend under the default policy)
HANGS = {
    "symm-alloc-failure-skips-rendezvous.toml": (
        "hang", "init",
        ["exchange(key='symm/tp/0/fd') (tag 'symm.init: exchange pids'): ranks 0-2,4-7 arrived; "
         "rank 3 did not", "rank 3 is blocked in barrier (tag 'symm.close"],
        {"agree": True}, "symm"),
    "symm-local-probe-handle-type.toml": (
        "hang", "init",
        ["exchange(key='symm/tp/0/fabric') (tag 'symm.init: exchange fabric handles'): ranks 0-3 "
         "arrived; ranks 4-7 did not", "ranks 4-7 are blocked in exchange(key='symm/tp/0/fd')"],
        {"symm_handle_type": "group"}, "nccl"),
    "symm-subgroup-then-world-sequence.toml": (
        "hang", "init",
        ["exchange(key='symm/world/0/fd')", "ranks 4-7 arrived; ranks 0-3 did not",
         "ranks 0-3 are blocked in exchange(key='symm/world/2/fd')"],
        {"symm_rendezvous_counter": "group"}, "symm"),
    "ipc-registration-on-some-ranks.toml": (
        "CollectiveMismatch", "register",
        ["ranks 0-2,4-7 called all_gather_object (tag 'ipc.register: exchange graph handles'); "
         "rank 3 called barrier (tag 'ipc.close: importers closed')"],
        {"agree": True}, "multicast"),
    "symm-posix-fd-across-hosts.toml": (
        "FdTransportError", "init",
        ["[fd_exchange] timed out connecting to /tmp/cuda_fd_xchg_", "no such socket on host "
         "gb200-nvl72-tray00", "POSIX fds reach only processes of one host (row V9)"],
        {"symm_handle_type": "group"}, "symm"),
    # PyTorch's IpcChannel ring (FX1-FX3): the boundary ranks fail at once, the others hang,
    # each naming the predecessor it waits on.
    "symm-ring-fd-across-hosts.toml": (
        "hang", "init",
        ["Failed to send fd: No such file or directory (rank 3 on host gb200-nvl72-tray00 sending "
         "to rank 4's socket", "rank 4 waits in recvmsg on /tmp/symm_mem-",
         "from rank 3, its predecessor in PyTorch's fd ring"],
        {"symm_handle_type": "group"}, "symm"),
}


def _diagnosis_time(message: str) -> float:
    m = re.search(r"all ranks at t=([0-9.e+-]+)", message)
    return float(m.group(1)) if m else 0.0


@pytest.mark.parametrize("name", sorted(HANGS))
def test_fails_within_its_bound_with_a_diagnosis(name):
    outcome, step, texts, _, _ = HANGS[name]
    sc = load(REG / name)
    res = run_scenario(sc)
    assert res.expects_failure and res.ok, res.failures
    # Every rank ends (none is left blocked) and the outcome is the expected one.
    assert len(res.errors) == sc.world_size, res.errors
    hits = [e for e in res.errors if e.name == outcome and e.step == step]
    assert hits, [(e.rank, e.step, e.name) for e in res.errors]
    report = "\n".join(e.message for e in res.errors)
    for t in texts:
        assert t in report, (t, report[:2000])
    # Bounded: diagnosed at once (virtual time 0) for a store key nobody will post, and never
    # later than FlashInfer's own 30 s fd-exchange timeout.
    assert max(_diagnosis_time(e.message) for e in res.errors) <= FD_EXCHANGE_TIMEOUT
    # A diagnosed hang tears down locally: nothing is left in the ledger.
    assert not res.leaks, res.leaks[:4]


@pytest.mark.parametrize("name", sorted(HANGS))
def test_passes_under_default_policy(name):
    *_, backend = HANGS[name]
    res = run_scenario(load(REG / name), policy="default")
    assert res.ok and not res.errors and not res.leaks and not res.flags, res.failures
    assert set(res.backends.values()) == {backend}


@pytest.mark.parametrize("name", sorted(HANGS))
def test_setting_the_knob_back_removes_the_failure(name):
    knob = HANGS[name][3]
    sc = load(REG / name)
    pol = resolve(sc.policy, sc.path.parent)
    fixed = dataclasses.replace(pol, params={**pol.params, **knob}, fallback_on_setup_error=True)
    res = run_scenario(sc, policy=fixed)
    assert not res.errors, [(e.rank, e.step, e.name, e.message[:200]) for e in res.errors]
    assert not res.leaks and not res.flags


def test_diagnosis_names_the_store_key_of_each_side():
    """Row V16: the two halves wait under different keys; each side's report names its own
    key as the collective it expected and the other side's key as where the others are."""
    res = run_scenario(load(REG / "symm-local-probe-handle-type.toml"))
    by_rank = {e.rank: e.message for e in res.errors}
    assert "collective #0 exchange(key='symm/tp/0/fabric')" in by_rank[0]
    assert "collective #0 exchange(key='symm/tp/0/fd')" in by_rank[4]
    assert "ranks 0-3 are blocked in exchange(key='symm/tp/0/fabric')" in by_rank[4]
