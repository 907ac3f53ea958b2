"""`commsim exec --visible LIST`: one CUDA_VISIBLE_DEVICES of any length and order for every
rank (launch/visible_devices.py): ordinals follow the list, NVML still sees every GPU (W1),
CUDA hides every index from the first invalid one on, more ranks than GPUs share them."""

from __future__ import annotations

import pytest

from commsim.errors import UserError
from commsim.launch.config import RunConfig
from hosting_helpers import PROGRAMS, hosted


@pytest.mark.parametrize("visible,order", [("3,1", [3, 1]), ("5,2,9,0", [5, 2])])
def test_ordinals_follow_the_list_up_to_its_first_invalid_index(visible: str, order: list) -> None:
    v, res, out = hosted(PROGRAMS / "visible_list.py", "hgx-h100-8:1", nproc_per_host=2,
                         visible=visible)
    assert v.exit_code == 0, out
    for r in (0, 1):
        assert res[r] == {"rank": r, "count": len(order), "order": order, "env": visible,
                          "nvml_count": 8}
    assert v.cfg.placement == [("hgx-h100-0", order[0]), ("hgx-h100-0", order[1])]
    assert f"--visible {visible}" in v.cfg.replay_command()


def test_more_ranks_than_visible_gpus_share_one() -> None:
    v, res, out = hosted(PROGRAMS / "shared_gpu_allreduce.py", "hgx-h100-8:1", nproc_per_host=2,
                         visible="0")
    assert v.cfg.placement == [("hgx-h100-0", 0), ("hgx-h100-0", 0)]
    # Both ranks take device 0, and the program's all-reduce is torch.distributed "nccl":
    # NCCL refuses two ranks of one communicator on one GPU (src/init.cc, ncclInvalidUsage),
    # which ProcessGroupNCCL raises as DistBackendError.
    assert v.exit_code != 0 and not res, out
    assert "ncclInvalidUsage" in out and "Duplicate GPU detected : rank 1 and rank 0" in out, out


@pytest.mark.parametrize("visible,says", [
    ("9,0", "the list's first index is not one of them"),
    ("x", "use one of all, one or a CUDA_VISIBLE_DEVICES list"),
])
def test_a_list_that_leaves_no_gpu_is_refused(visible: str, says: str) -> None:
    cfg = RunConfig(machine="hgx-h100-8:1", nproc_per_host=1, visible=visible, command=["p.py"])
    with pytest.raises(UserError, match=says):
        cfg.resolve()
