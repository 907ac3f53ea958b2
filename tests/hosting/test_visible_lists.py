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
    ("9,0", "the list's first entry is not one of them"),
    ("GPU-zz,0", "the list's first entry is not one of them"),
    ("3 1", "use one of all, one or a CUDA_VISIBLE_DEVICES list"),
])
def test_a_list_that_leaves_no_gpu_is_refused(visible: str, says: str) -> None:
    cfg = RunConfig(machine="hgx-h100-8:1", nproc_per_host=1, visible=visible, command=["p.py"])
    with pytest.raises(UserError, match=says):
        cfg.resolve()


def test_a_list_per_rank_with_uuids_places_each_rank_on_its_own_first_gpu() -> None:
    """One CUDA_VISIBLE_DEVICES per rank (Ray / SLURM --gpu-bind style), UUIDs abbreviated as
    the programming guide allows: rank r drives ordinal 0 of its own list."""
    from commsim.topology.preset_parts import gpu_uuid
    six = gpu_uuid("hgx-h100-0", 6)[:12]
    visible = f"{six},2;1,MIG-{gpu_uuid('hgx-h100-0', 0)}/1/0,0"
    v, res, out = hosted(PROGRAMS / "visible_list.py", "hgx-h100-8:1", nproc_per_host=2,
                         visible=visible)
    assert v.exit_code == 0, out
    assert v.cfg.placement == [("hgx-h100-0", 6), ("hgx-h100-0", 1)]
    assert res[0]["order"] == [6, 2] and res[0]["env"] == f"{six},2"
    assert res[1]["order"] == [1] and res[1]["nvml_count"] == 8      # the MIG entry ends the list
    assert f"--visible '{visible}'" in v.cfg.replay_command()


def test_per_rank_lists_must_match_the_ranks() -> None:
    cfg = RunConfig(machine="hgx-h100-8:1", nproc_per_host=2, visible="0;1;2", command=["p.py"])
    with pytest.raises(UserError, match="3 per-rank lists for 2 rank"):
        cfg.resolve()


def test_a_scenarios_containers_and_lists_reach_the_hosted_program() -> None:
    """`commsim exec --scenario` with `[placement] devices` / `visible` (row W3): each process's
    CUDA and NVML enumerate only its container's two GPUs, NVML indices are the container's,
    and rank 3's CUDA_VISIBLE_DEVICES=1,0 (container indices) reverses its ordinals."""
    import io
    import os
    from commsim.launch.run import execute
    from hosting_helpers import results
    path = os.path.join(os.path.dirname(__file__), "..", "..", "scenarios", "fidelity",
                        "container-device-cgroups.toml")
    cfg = RunConfig(scenario=os.path.abspath(path), mode="inproc",
                    command=[str(PROGRAMS / "visible_list.py")])
    out = io.StringIO()
    v = execute(cfg, out=out, err=out)
    res = results(out.getvalue())
    assert v.exit_code == 0, out.getvalue()
    for r in (0, 1, 2):
        assert res[r] == {"rank": r, "count": 2, "order": [0, 1], "env": None, "nvml_count": 2}
    assert res[3] == {"rank": 3, "count": 2, "order": [1, 0], "env": "1,0", "nvml_count": 2}
