"""Host identity as a hosted program observes it: hostname, /dev/shm, environment, visible
GPUs, pids; on a 2-tray GB200 slice, an HGX host and a PCIe box without P2P, both modes."""

import pytest

from hosting_helpers import PROGRAMS, hosted

PROG = PROGRAMS / "identity.py"


@pytest.mark.parametrize("mode", ["inproc", "procs"])
def test_two_trays_are_two_nodes(mode):
    v, res, out = hosted(PROG, "gb200-nvl72:2", mode=mode, nproc_per_host=2)
    assert v.ok, v.format()
    assert sorted(res) == [0, 1, 2, 3]
    for r, d in res.items():
        tray = "gb200-nvl72-tray00" if r < 2 else "gb200-nvl72-tray01"
        assert d["hostname"] == d["node"] == d["uname"] == tray
        assert (d["local_rank"], d["local_world"], d["group_rank"]) == (r % 2, 2, r // 2)
        # /dev/shm is per host: a rank opens the segments of its own tray only
        assert d["shm_sees"] == [r2 // 2 == r // 2 for r2 in range(4)]
        assert d["devices"] == 4 and d["cvd"] is None
    assert len({d["pid"] for d in res.values()}) == 4        # every rank its own pid


def test_one_visible_gpu_per_process():
    v, res, _ = hosted(PROG, "gb200-nvl72:2", nproc_per_host=1, visible="one")
    assert v.ok, v.format()
    assert [res[r]["cvd"] for r in (0, 1)] == ["0", "0"]
    assert [res[r]["devices"] for r in (0, 1)] == [1, 1]


@pytest.mark.parametrize("machine", ["hgx-h100-8", "l40s-8-pcie"])
def test_single_host_boxes_share_a_node(machine):
    v, res, _ = hosted(PROG, machine, nproc_per_host=4)
    assert v.ok, v.format()
    host = machine.split(":")[0]
    assert {d["hostname"] for d in res.values()} == {v.cfg.placement[0][0]}
    assert host.split("-")[0] in res[0]["hostname"]
    assert all(d["shm_sees"] == [True] * 4 for d in res.values())
    assert all(d["devices"] == 8 for d in res.values())


def test_outside_a_run_nothing_is_hosted():
    import socket

    from commsim.hosting import NotHosted, current
    from commsim.hosting.install.registry import install_all
    from commsim.hosting.surfaces.table import MODULES
    install_all(MODULES)
    with pytest.raises(NotHosted):
        current()
    assert not socket.gethostname().startswith("gb200")
