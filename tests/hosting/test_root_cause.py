"""The verdict leads with the root cause (first failing rank, its error, where, and why in
the machine's terms), groups the ranks that failed the same way and the knock-ons under it,
and procs and inproc agree on it (commsim/launch/agreement.py)."""

import pytest

from hosting_helpers import EXAMPLES, PROGRAMS, hosted

from commsim.launch.agreement import modes_agree
from commsim.launch.cause import ranks_text, root_cause
from commsim.launch.config import RunConfig
from commsim.launch.sweep_exec import run_exec_sweep
from commsim.scenario.generate import sample_ids

FLASHINFER = str(EXAMPLES / "flashinfer_style_ipc_workspace.py")
VLLM = str(EXAMPLES / "vllm_style_custom_allreduce.py")
GIVES_UP = str(PROGRAMS / "peer_gives_up.py")


def _root_lines(v):
    lines = v.format().splitlines()
    assert lines[1] == "Root Cause (first observed failure):", lines
    return lines


def test_across_trays_names_the_peer_the_hosts_and_the_rule():
    v, _, _ = hosted(FLASHINFER, "gb200-nvl72:2", nproc_per_host=4)
    lines = _root_lines(v)
    assert lines[2].startswith("  rank 0 (gb200-nvl72-tray00, GPU 0): exit 1:"), lines
    assert "cudaIpcOpenMemHandle -> cudaErrorInvalidResourceHandle (400) at " \
           "flashinfer_style_ipc_workspace.py:" in lines[3]
    assert lines[4] == ("    why: this rank is on gb200-nvl72-tray00, the handle's memory on "
                        "rank 4 (gb200-nvl72-tray01/gpu0); legacy IPC handles are host-local "
                        "(row L8: cudaIpcOpenMemHandle -> invalid resource handle)"), lines
    assert "first CUDA error:" not in v.format()      # the per-rank listing is verbose's
    assert v.format(verbose=True).count("first CUDA error:") == 8


def test_no_peer_access_names_the_pair_and_every_rank_fails_the_same_way():
    v, _, _ = hosted(VLLM, "rtx4090-8", seed=3)
    rc = root_cause(v)
    assert (rc.proc.rank, rc.cause.kind) == (0, "cuda-error")
    assert [p.rank for p in rc.same] == list(range(1, 8)) and not rc.knock_on
    lines = _root_lines(v)
    assert ("why: rtx4090-0/gpu0 -> rank 1 (rtx4090-0/gpu1): the two GPUs have no peer access "
            "(row L10") in lines[4], lines
    assert lines[5] == "  the same failure on rank(s) 1-7"


def test_a_peer_that_gives_up_is_the_root_cause_and_the_waiters_are_knock_ons():
    v, _, _ = hosted(GIVES_UP, "hgx-h100-8", nproc_per_host=4, timeout=60)
    rc = root_cause(v)
    assert rc.proc.rank == 0 and not rc.same and not rc.other
    assert [p.rank for p, _ in rc.knock_on] == [1, 2, 3]
    assert "  knock-on failures (after a peer failed or exited): rank(s) 1-3" in _root_lines(v)


@pytest.mark.parametrize("machine, per, visible, prog", [
    ("rtx4090-8", 8, "all", VLLM),    # every rank 217 in both modes (an open after the
                                      # exporter exited answers the device check first, H6)
    ("hgx-h100-8", 4, "all", GIVES_UP),
    ("gb200-nvl72:2", 1, "one", VLLM),
    ("dgx-spark-2", 1, "one", VLLM),  # two hosts, no NVLink between them: row L8
    ("l40s-8-pcie", 4, "all", VLLM),  # one PCIe host without peer access: row L10
])
def test_procs_and_inproc_agree(machine, per, visible, prog):
    a = modes_agree(RunConfig(machine=machine, nproc_per_host=per, seed=1, timeout=60,
                              visible=visible, command=[prog]))
    assert a.agree, a.text()


@pytest.mark.parametrize("machine, per, visible, why", [
    ("dgx-spark-2", 1, "one", "    why: this rank is on spark-0, the handle's memory on rank 1 "
                              "(spark-1/gpu0); legacy IPC handles are host-local (row L8: "
                              "cudaIpcOpenMemHandle -> invalid resource handle)"),
    ("l40s-8-pcie", 4, "all", "    why: l40s-0/gpu0 -> rank 1 (l40s-0/gpu1): the two GPUs have no "
                              "peer access (row L10: cudaDeviceCanAccessPeer is 0)"),
])
def test_the_first_lines_name_the_root_cause_and_the_reason(machine, per, visible, why):
    v, _, _ = hosted(VLLM, machine, nproc_per_host=per, visible=visible, seed=1)
    lines = _root_lines(v)
    assert lines[2].startswith("  rank 0 ("), lines
    assert lines[4] == why, lines


def test_where_the_modes_cannot_agree_the_harness_says_why():
    """FlashInfer-style on two trays: rank 0 fails on rank 4's handle and exits; under the
    scheduler ranks 1-3 then open rank 0's (gone: a knock-on), as real processes would only
    if rank 0's exit won the race."""
    a = modes_agree(RunConfig(machine="gb200-nvl72:2", nproc_per_host=4, seed=1, timeout=60,
                              command=[FLASHINFER]))
    # Which of ranks 0-3 lose the race to a peer's exit in procs mode is up to the OS (now
    # and then none does, and the modes agree); where they disagree, the harness says why.
    if not a.agree:
        assert a.why.startswith("exit order: rank(s) "), a.text()
        named = a.why.removeprefix("exit order: rank(s) ").split(" failed")[0]
        assert named and set(named.split(", ")) <= {"0", "1", "2", "3"}, a.text()
    roots = {m: root_cause(v) for m, v in a.verdicts.items()}
    assert {r.cause.kind for r in roots.values()} == {"ipc-across-hosts"}
    # inproc is seeded: rank 0 fails first; in procs an OS race may let rank 0 be a knock-on
    assert roots["inproc"].proc.rank == 0
    if roots["procs"].proc.rank != 0:
        assert "the first failure is rank" in a.why, a.text()


def test_sweep_exec_failure_lines_carry_the_reason():
    rep = run_exec_sweep([FLASHINFER], sample_ids(0, 6))
    bad = next(r for r in rep.records if r["kind"] == "ipc-across-hosts")
    assert "; why: " in bad["what"] and "row L8" in bad["what"], bad


def test_ranks_text():
    assert ranks_text([5, 0, 1, 2, 7]) == "0-2, 5, 7"
