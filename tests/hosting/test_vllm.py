"""The installed vLLM, unmodified, under `commsim exec`: its own CustomAllreduce and
PyNcclCommunicator built as its GPU worker builds them (tests/hosting/programs/vllm_custom_ar.py).
Two releases: 0.33.0, the release of the seed (vllm-project/vllm#52778), pinned by the
`peers` extra in .venv (`make test` installs it), and 0.34.0 in the layered .venv-vllm034
(`make peers` builds it). A test of a release that is not installed skips with the reason.

Each run is `commsim exec` in an interpreter of its own (the venv's), as a user runs it:
vLLM caches what it learnt of the devices at module level (device capability, the P2P
access cache), so two in-process runs on different machines in one interpreter would see the
first machine's answers. The first run probes P2P with vLLM's own subprocesses (each imports
vLLM). Under `make test` the 0.33.0 tests run: about a minute of CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hosting_helpers import PROGRAMS, results

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = PROGRAMS / "vllm_custom_ar.py"
# The interpreter of each release's venv: .venv holds the peers pin.
VENVS = {"0.33.0": Path(sys.executable), "0.34.0": ROOT / ".venv-vllm034" / "bin" / "python"}


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
                    f"({'it has ' + found if found else 'none there'}; make test installs 0.33.0, "
                    f"make peers 0.34.0)")
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


# The mode-agreement harness (commsim/launch/agreement.py) in the release's interpreter: both
# verdicts' outcomes and the harness's own account of any difference, as JSON.
AGREE = """
import json, sys
from commsim.launch.agreement import Outcome, modes_agree
from commsim.launch.config import RunConfig
machine, nproc, visible, *command = sys.argv[1:]
a = modes_agree(RunConfig(machine=machine, nproc_per_host=int(nproc), visible=visible,
                          timeout=300, command=command))
print("AGREEMENT " + json.dumps({"agree": a.agree, "text": a.text(), "outcomes": {
    m: {"ok": v.ok, "root": Outcome.of(v).root, "ranks": dict(Outcome.of(v).ranks)}
    for m, v in a.verdicts.items()}}))
"""


def modes(version: str, machine: str, *args: str, nproc_per_host: int,
          visible: str = "all") -> dict:
    """The agreement of the program's procs and inproc runs under vLLM `version`."""
    p = subprocess.run([str(interpreter(version)), "-c", AGREE, machine, str(nproc_per_host),
                        visible, str(PROGRAM), *args],
                       capture_output=True, text=True, timeout=900, cwd=ROOT)
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("AGREEMENT ")]
    assert p.returncode == 0 and line, p.stdout + p.stderr
    return json.loads(line[-1].partition(" ")[2])


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
    """vLLM 0.34.0 carries the upstream gate (the change vllm-project/vllm#55835 proposes, as
    read in the 0.34.0 wheel's vllm/distributed/device_communicators/custom_all_reduce.py;
    which commit landed it is UNCONFIRMED, the repository being too large to fetch here;
    0.33.0's file lacks both checks): a group spanning nodes is
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


def test_0_34_custom_all_reduce_tp8_agrees_across_modes_and_is_exact():
    """TP 8 on one HGX box as real processes and in-process: the same verdict, every rank ok;
    --check makes a rank whose eager, warm-up or graph result is not exact exit 1."""
    a = modes("0.34.0", "hgx-h100-8", "--graph", "--numel", "1024", "--check", nproc_per_host=8)
    assert a["agree"], a["text"]
    for mode, o in a["outcomes"].items():
        assert o["ok"] and set(o["ranks"].values()) == {"ok"}, (mode, a)


def test_the_seed_gets_the_same_verdict_in_procs_and_inproc():
    """0.33.0's seed run as real processes (legacy IPC handles exchanged between OS processes)
    and in-process: the same root cause, the cross-tray cudaIpcOpenMemHandle (row L8)."""
    a = modes("0.33.0", "gb200-nvl72:2", "--graph", "--no-eager", nproc_per_host=1,
              visible="one")
    assert a["agree"], a["text"]
    for mode, o in a["outcomes"].items():
        assert not o["ok"], (mode, a)
        assert o["root"] == [0, "ipc-across-hosts", "cudaIpcOpenMemHandle", 400, "L8"], (mode, a)
        assert o["ranks"] == {"0": "cudaIpcOpenMemHandle -> 400 (row L8)",
                              "1": "cudaIpcOpenMemHandle -> 400 (row L8)"}, (mode, a)
