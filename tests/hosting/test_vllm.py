"""The installed vLLM 0.33.0, unmodified, under `commsim exec` (the `peers` extra pins it,
--no-deps; `make test` installs it): its own CustomAllreduce and PyNcclCommunicator built as
its GPU worker builds them (tests/hosting/programs/vllm_custom_ar.py). Skips when vLLM is
absent.

Each run is `commsim exec` in an interpreter of its own, as a user runs it: vLLM caches what
it learnt of the devices at module level (device capability, the P2P access cache), so two
in-process runs on different machines in one interpreter would see the first machine's
answers. The first run probes P2P with vLLM's own subprocesses (each imports vLLM): these
tests cost about a minute of CPU."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from hosting_helpers import PROGRAMS, results

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vllm is not installed (make test installs the peers extra)")
PROGRAM = PROGRAMS / "vllm_custom_ar.py"
COMMSIM = Path(sys.executable).with_name("commsim")


def hosted(machine: str, *args: str, nproc_per_host: int, visible: str = "all") -> tuple:
    """(exit status, per-rank RESULT dicts, output) of one `commsim exec` run (inproc)."""
    p = subprocess.run([str(COMMSIM), "exec", "--machine", machine, "--nproc-per-host",
                        str(nproc_per_host), "--visible", visible, "--mode", "inproc",
                        "--timeout", "300", "--", "python", str(PROGRAM), *args],
                       capture_output=True, text=True, timeout=600)
    return p.returncode, results(p.stdout), p.stdout + p.stderr


def test_custom_all_reduce_tp8_on_one_hgx_box_is_exact_eager_and_in_a_graph():
    rc, res, out = hosted("hgx-h100-8", "--graph", "--numel", "1024", nproc_per_host=8)
    assert rc == 0 and "commsim exec: ok: 8 rank(s)" in out, out
    assert sorted(res) == list(range(8)), out
    for d in res.values():
        # in_the_same_node_as: one host; gpu_p2p_access_check admitted every pair, so the
        # communicator stayed enabled and took the eager call, the warm-up and the capture.
        assert d["same_node"] == [True] * 8 and d["ca_disabled"] is False, d
        assert d["used"] == ["custom"] * 3 and d["exact"], d


def test_graph_buffers_across_two_gb200_trays_die_in_register_graph_buffers():
    """vllm-project/vllm#52778: TP 2 across two trays, one GPU visible per process; the
    capture's register_graph_buffers opens the peer's legacy IPC handle from another host."""
    rc, res, out = hosted("gb200-nvl72:2", "--graph", "--no-eager", nproc_per_host=1,
                          visible="one")
    assert rc != 0 and not res, out
    assert "rank 0 (gb200-nvl72-tray00, GPU 0): exit 1\n" in out, out
    assert "the same failure on rank(s) 1" in out, out
    assert "cudaIpcOpenMemHandle -> cudaErrorInvalidResourceHandle (400) at _custom_ops.py" in out
    assert "in register_graph_buffers <- custom_all_reduce.py" in out, out
    assert out.count("Failed: Cuda error csrc/custom_all_reduce.cuh 'invalid resource handle'") == 2


def test_the_same_run_with_custom_all_reduce_disabled_passes_over_pynccl():
    rc, res, out = hosted("gb200-nvl72:2", "--graph", "--no-eager", "--disable-custom-all-reduce",
                          nproc_per_host=1, visible="one")
    assert rc == 0 and sorted(res) == [0, 1], out
    for d in res.values():
        assert d["same_node"] == [True, False], d       # rank 1 is on the other tray
        assert d["used"] == ["pynccl", "pynccl"] and d["exact"] and d["ca_disabled"] is None, d
