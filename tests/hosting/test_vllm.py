"""The installed vLLM, unmodified, under `commsim exec`: its own CustomAllreduce and
PyNcclCommunicator built as its GPU worker builds them (tests/hosting/programs/vllm_custom_ar.py).
Two releases: 0.34.0, the current pin (the `peers` extra, in .venv), and 0.33.0, the release
of the seed (vllm-project/vllm#52778), in the layered .venv-vllm033 (`make peers` builds
both). A test of a release that is not installed skips with the reason.

Each run is `commsim exec` in an interpreter of its own (the venv's), as a user runs it:
vLLM caches what it learnt of the devices at module level (device capability, the P2P
access cache), so two in-process runs on different machines in one interpreter would see the
first machine's answers. The first run probes P2P with vLLM's own subprocesses (each imports
vLLM): these tests cost minutes of CPU and run under `make peers` only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hosting_helpers import PROGRAMS, results

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = PROGRAMS / "vllm_custom_ar.py"
# The interpreter of each release's venv: .venv holds the current pin.
VENVS = {"0.34.0": Path(sys.executable), "0.33.0": ROOT / ".venv-vllm033" / "bin" / "python"}


def _installed(python: Path) -> str | None:
    """The vllm version `python` imports, or None."""
    if not python.exists():
        return None
    p = subprocess.run([str(python), "-c", "from importlib import metadata as m; "
                        "print(m.version('vllm'))"], capture_output=True, text=True)
    return p.stdout.strip() if p.returncode == 0 else None


def interpreter(version: str) -> Path:
    """The interpreter whose vllm is `version`; the test skips, saying why, without one."""
    python = VENVS[version]
    found = _installed(python)
    if found != version:
        pytest.skip(f"vllm {version} is not installed in {python.parent.parent.name} "
                    f"({'it has ' + found if found else 'none there'}; make peers)")
    return python


def hosted(version: str, machine: str, *args: str, nproc_per_host: int, visible: str = "all",
           mode: str = "inproc") -> tuple:
    """(exit status, per-rank RESULT dicts, output) of one `commsim exec` run under vLLM
    `version`."""
    p = subprocess.run([str(interpreter(version)), "-c", "import sys; from commsim.cli import "
                        "main; sys.exit(main(sys.argv[1:]))", "exec", "--machine", machine,
                        "--nproc-per-host", str(nproc_per_host), "--visible", visible,
                        "--mode", mode, "--timeout", "300", "--", "python", str(PROGRAM), *args],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    return p.returncode, results(p.stdout), p.stdout + p.stderr


def test_custom_all_reduce_tp8_on_one_hgx_box_is_exact_eager_and_in_a_graph():
    rc, res, out = hosted("0.33.0", "hgx-h100-8", "--graph", "--numel", "1024", nproc_per_host=8)
    assert rc == 0 and "commsim exec: ok: 8 rank(s)" in out, out
    assert sorted(res) == list(range(8)), out
    for d in res.values():
        # in_the_same_node_as: one host; gpu_p2p_access_check admitted every pair, so the
        # communicator stayed enabled and took the eager call, the warm-up and the capture.
        assert d["same_node"] == [True] * 8 and d["ca_disabled"] is False, d
        assert d["used"] == ["custom"] * 3 and d["exact"], d


def test_graph_buffers_across_two_gb200_trays_die_in_register_graph_buffers():
    """vllm-project/vllm#52778 on 0.33.0: TP 2 across two trays, one GPU visible per process;
    the capture's register_graph_buffers opens the peer's legacy IPC handle from another host."""
    rc, res, out = hosted("0.33.0", "gb200-nvl72:2", "--graph", "--no-eager", nproc_per_host=1,
                          visible="one")
    assert rc != 0 and not res, out
    assert "rank 0 (gb200-nvl72-tray00, GPU 0): exit 1\n" in out, out
    assert "the same failure on rank(s) 1" in out, out
    assert "cudaIpcOpenMemHandle -> cudaErrorInvalidResourceHandle (400) at _custom_ops.py" in out
    assert "in register_graph_buffers <- custom_all_reduce.py" in out, out
    assert out.count("Failed: Cuda error csrc/custom_all_reduce.cuh 'invalid resource handle'") == 2


def test_the_same_run_with_custom_all_reduce_disabled_passes_over_pynccl():
    rc, res, out = hosted("0.33.0", "gb200-nvl72:2", "--graph", "--no-eager",
                          "--disable-custom-all-reduce", nproc_per_host=1, visible="one")
    assert rc == 0 and sorted(res) == [0, 1], out
    for d in res.values():
        assert d["same_node"] == [True, False], d       # rank 1 is on the other tray
        assert d["used"] == ["pynccl", "pynccl"] and d["exact"] and d["ca_disabled"] is None, d


def test_0_34_declines_custom_all_reduce_across_the_trays_and_passes():
    """vLLM 0.34.0 carries the upstream gate (vllm-project/vllm#55835; its wheel's
    vllm/distributed/device_communicators/custom_all_reduce.py): a group spanning nodes is
    `mnnvl_only`, `should_custom_ar` declines it and `register_graph_buffers` registers
    nothing over CUDA IPC. The seed's run, unchanged, passes: the communicator stays enabled
    for MNNVL collectives and every all-reduce goes to pynccl."""
    rc, res, out = hosted("0.34.0", "gb200-nvl72:2", "--graph", "--no-eager", nproc_per_host=1,
                          visible="one")
    assert rc == 0 and "commsim exec: ok: 2 rank(s)" in out, out
    assert sorted(res) == [0, 1], out
    for d in res.values():
        assert d["same_node"] == [True, False] and d["mnnvl_only"] is True, d
        assert d["ca_disabled"] is False, d
        assert d["used"] == ["pynccl", "pynccl"] and d["exact"], d
    assert "cudaIpcOpenMemHandle" not in out, out
