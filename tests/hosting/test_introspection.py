"""What real packages probe before they call anything: a hosted rank answers as the installed
modules do (`find_spec`, `__spec__`, `__file__`, the types of torch's device properties, an
`isinstance` against torch's classes). Each program is also run by a plain interpreter where
its answer does not need a GPU, and the answers compared."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hosting_helpers import PROGRAMS, hosted, results


def plain(program: str) -> dict[int, dict]:
    """The program's RESULT lines from a plain interpreter (no commsim)."""
    out = subprocess.run([sys.executable, str(PROGRAMS / program)], capture_output=True,
                         text=True, check=True).stdout
    return results(out)


@pytest.mark.parametrize("mode", ["inproc", "procs"])
def test_find_spec_and_module_specs_are_the_installed_packages(mode):
    """Served pre-13 `cuda.cudart` sent FlashInfer down its cuda-python 12 branch; a stand-in
    without `__spec__` made the next `find_spec` raise ValueError."""
    expected = plain("module_introspection.py")[0]["modules"]
    assert expected["cuda.cudart"] == {"before": None}        # the installed cuda-python is 13
    v, res, out = hosted(PROGRAMS / "module_introspection.py", "hgx-h100-8", mode=mode,
                         nproc_per_host=2)
    assert v.ok, v.format() + out
    assert [res[r]["modules"] for r in (0, 1)] == [expected, expected]


@pytest.mark.parametrize("mode", ["inproc", "procs"])
def test_from_dlpack_of_a_cuda_capsule_is_a_tensor_over_the_mapped_bytes(mode):
    """FlashInfer wraps IPC/MNNVL mappings with a hand-made capsule and
    torch.utils.dlpack.from_dlpack; the CPU build gave a tensor that failed at first use."""
    v, res, out = hosted(PROGRAMS / "dlpack_peer_view.py", "hgx-h100-8", mode=mode,
                         nproc_per_host=2, residue="fail")
    assert v.ok, v.format() + out
    assert "flagged" not in v.format()
    for r in (0, 1):
        fact = res[r]
        assert fact["refused"].startswith("commsim hosting: from_dlpack of a CUDA DLPack capsule: "
                                          "224 byte(s) at 0x10 are not device memory"), fact
        del fact["refused"]
        assert fact == {"rank": r, "device": f"cuda:{r}", "dtype": "torch.int32",
                        "shape": [4, 8], "stride": [16, 1], "data_ptr": True, "read": True,
                        "marked": True, "deleter_called": True}
