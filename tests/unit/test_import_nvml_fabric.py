"""NVML fabric info (`nvidia-smi -q` Fabric sections or JSON) merged into a topology
(commsim.topology.importers.nvml_fabric): the domain map it yields, and the traps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from commsim.cli import main
from commsim.report.size_tables import legal_backends
from commsim.topology import build_preset
from commsim.topology.importers.nvidia_smi import build_cluster as build_from_matrix, parse_topo_matrix
from commsim.topology.importers.nvml_fabric import (
    FabricInfoError, load_fabric_file, merge_fabric, parse_fabric_json, parse_fabric_text,
)
from commsim.topology.model import FabricState, NVML_ERROR_UNKNOWN, ZERO_UUID

FABRIC = Path(__file__).resolve().parents[1] / "data" / "fabric"
TOPO = Path(__file__).resolve().parents[1] / "data" / "topo"
XML = Path(__file__).resolve().parents[1] / "data" / "nccl"
RACK_UUID = bytes.fromhex("8b7e3c1a5d2f4e6b9a0c1f2e3d4c5b6a")

TRAY = (FABRIC / "gb200_tray_completed.txt").read_text()


def tray_text(state: str = "Completed", status: str = "Success", clique: str = "32766",
              uuid: str = "8b7e3c1a-5d2f-4e6b-9a0c-1f2e3d4c5b6a") -> str:
    """The sample tray output with other values in every Fabric section."""
    return (TRAY.replace(": Completed", f": {state}").replace(": Success", f": {status}")
            .replace(": 32766", f": {clique}")
            .replace(": 8b7e3c1a-5d2f-4e6b-9a0c-1f2e3d4c5b6a", f": {uuid}"))


def per_tray(*texts: str) -> list:
    return [(None, parse_fabric_text(t, f"tray{i}.txt")) for i, t in enumerate(texts)]


def legal(cluster, n: int | None = None) -> set[str]:
    refs = list(cluster.gpu_refs())[:n]
    return set(legal_backends(cluster, refs).legal)


# -- parsing ----------------------------------------------------------------------------


def test_nvidia_smi_q_fabric_sections_in_gpu_order() -> None:
    recs = parse_fabric_text(TRAY, "tray.txt")
    assert len(recs) == 4
    for r in recs:
        assert r.info.state == FabricState.COMPLETED and r.info.status == 0
        assert r.info.clique_id == 32766 and r.info.cluster_uuid == RACK_UUID
    assert recs[1].where == "tray.txt line 34"   # the second GPU's Fabric line


def test_pasted_fabric_blocks_without_gpu_headers() -> None:
    text = """    Fabric
        State                             : In Progress
        Status                            : N/A
        CliqueId                          : N/A
        ClusterUUID                       : N/A
    Fabric
        State                             : N/A
        Status                            : N/A
        CliqueId                          : N/A
        ClusterUUID                       : N/A
        Health
            Bandwidth                     : N/A
"""
    a, b = parse_fabric_text(text)
    assert a.info.state == FabricState.IN_PROGRESS and a.info.cluster_uuid == ZERO_UUID
    assert b.info.state == FabricState.NOT_SUPPORTED and b.info.clique_id == 0


def test_failed_status_keeps_its_text() -> None:
    (rec, *_) = parse_fabric_text(tray_text(status="Insufficient Resources"))
    assert rec.info.status == NVML_ERROR_UNKNOWN and rec.status_text == "Insufficient Resources"


def test_json_forms() -> None:
    one = parse_fabric_json(json.dumps([{"State": "Completed", "Status": 0, "CliqueId": 7,
                                         "ClusterUUID": "8b7e3c1a-5d2f-4e6b-9a0c-1f2e3d4c5b6a"}]))
    (rec,) = one[None]
    assert (rec.info.state, rec.info.clique_id, rec.info.cluster_uuid) == \
        (FabricState.COMPLETED, 7, RACK_UUID)
    named = load_fabric_file(FABRIC / "gb200_4trays.json")
    assert list(named) == [f"gb200-nvl72-tray0{i}" for i in range(4)]
    assert named["gb200-nvl72-tray03"][0].info.state == FabricState.IN_PROGRESS
    assert parse_fabric_json('{"hosts": {"h": [{"state": 3}]}}')["h"][0].info.state == FabricState.COMPLETED


@pytest.mark.parametrize("text, words", [
    (tray_text(state="Done"), "fabric State 'Done' is not one of Completed, In Progress"),
    (tray_text(uuid="8b7e-zz"), "ClusterUUID '8b7e-zz' is not a UUID"),
    (tray_text(clique="-3"), "CliqueId -3 is outside 0..2^32-1"),
    ("GPU 00000000:18:00.0\n    Product Name : NVIDIA H100\n", "no 'Fabric' section found (the GPU "
                                                               "sections have none"),
    ("hello", "no 'Fabric' section found; expected `nvidia-smi -q` output"),
])
def test_bad_text_is_named(text: str, words: str) -> None:
    with pytest.raises(FabricInfoError) as e:
        parse_fabric_text(text, "q.txt")
    assert str(e.value).startswith("q.txt") and words in str(e.value)


@pytest.mark.parametrize("text, words", [
    ('[{"state": "Completed",}]', "j.json line 1 column 24: malformed JSON"),
    ('[{"uuid": "x"}]', "fabric info without State, Status, CliqueId or ClusterUUID"),
    ('{"h": 3}', "expected a list of per-GPU fabric objects"),
])
def test_bad_json_is_named(text: str, words: str) -> None:
    with pytest.raises(FabricInfoError) as e:
        parse_fabric_json(text, "j.json")
    assert words in str(e.value)


# -- merging: the domain map --------------------------------------------------------------


def test_four_trays_with_one_uuid_are_one_multi_node_domain() -> None:
    cluster, warnings = merge_fabric(build_preset("gb200-nvl72:4"), per_tray(*[TRAY] * 4))
    (d,) = cluster.domains
    assert d.multi_node and len(d.members) == 16 and d.cluster_uuid == RACK_UUID
    assert warnings == []
    assert legal(cluster) == {"fabric", "multicast", "symm", "nccl"}


def test_trap_completed_with_zero_uuid_is_no_multi_node_domain() -> None:
    zero = tray_text(clique="0", uuid="00000000-0000-0000-0000-000000000000")
    cluster, warnings = merge_fabric(build_preset("gb200-nvl72:4"), per_tray(*[zero] * 4))
    assert not any(d.multi_node for d in cluster.domains)
    assert [d.name for d in cluster.domains] == [f"gb200-nvl72-tray0{i}-nvswitch" for i in range(4)]
    assert any("state Completed with an all-zero cluster UUID" in w and "no multi-node" in w
               for w in warnings)
    assert any("16 GPU(s) the topology put in a multi-node NVLink domain are in none" in w
               for w in warnings)
    assert legal(cluster) == {"nccl"}                          # 16 GPUs on 4 hosts
    assert legal(cluster, 4) == {"ipc", "multicast", "symm", "nccl"}   # one tray still has its switch


def test_trap_zero_uuid_on_hgx_hosts_without_mnnvl() -> None:
    parsed = parse_topo_matrix((TOPO / "h100_nvswitch_8_nics.txt").read_text(), "h100")
    two, _ = build_from_matrix(parsed, 2, "node", "H100")
    q = load_fabric_file(FABRIC / "hgx_h100_no_mnnvl.txt")[None]
    cluster, warnings = merge_fabric(two, [(None, q), (None, q)])
    assert [(len(d.members), d.multi_node) for d in cluster.domains] == [(8, False), (8, False)]
    assert legal(cluster) == {"nccl"} and legal(cluster, 8) == {"ipc", "multicast", "symm", "nccl"}
    assert any("no multi-node" in w for w in warnings)


def test_trap_differing_cliques_one_domain_with_a_warning() -> None:
    cluster, warnings = merge_fabric(build_preset("gb200-nvl72:2"),
                                     per_tray(TRAY, tray_text(clique="32767")))
    (d,) = cluster.domains
    assert d.multi_node and len(d.members) == 8
    assert any("cliques [32766, 32767]" in w and "NCCL_MNNVL_CROSS_CLIQUE=1" in w for w in warnings)
    assert "fabric" in legal(cluster)   # commsim's fabric test is NCCL's domain test: the UUID


def test_trap_in_progress_tray_is_declined_until_completed() -> None:
    cluster, warnings = merge_fabric(build_preset("gb200-nvl72:4"),
                                     list(load_fabric_file(FABRIC / "gb200_4trays.json").items()))
    assert [len(d.members) for d in cluster.domains if d.multi_node] == [12]
    assert any("report state In Progress" in w and "row F1" in w for w in warnings)
    assert legal(cluster, 12) == {"fabric", "multicast", "symm", "nccl"}
    leg = legal_backends(cluster, list(cluster.gpu_refs()))
    assert leg.legal == ("nccl",)
    assert "rank(s) 12, 13, 14, 15 report fabric state not COMPLETED" in leg.declined["fabric"]


def test_failed_status_declines_fabric() -> None:
    cluster, warnings = merge_fabric(build_preset("gb200-nvl72:2"),
                                     per_tray(TRAY, tray_text(status="Insufficient Resources")))
    assert any("status 'Insufficient Resources'" in w and "row F4" in w for w in warnings)
    assert "fabric" not in legal(cluster)


def test_two_uuids_split_the_trays() -> None:
    other = tray_text(uuid="11111111-2222-3333-4444-555555555555")
    cluster, _ = merge_fabric(build_preset("gb200-nvl72:2"), per_tray(TRAY, other))
    assert sorted(len(d.members) for d in cluster.domains) == [4, 4]
    assert legal(cluster) == {"nccl"}


def test_multi_node_domain_on_hosts_without_imex_is_flagged() -> None:
    parsed = parse_topo_matrix((TOPO / "gb200_tray.txt").read_text(), "tray")
    two, _ = build_from_matrix(parsed, 2, "node", "GB200")
    cluster, warnings = merge_fabric(two, per_tray(TRAY, TRAY))
    assert [d.multi_node for d in cluster.domains] == [True]
    assert any("have no IMEX channel" in w and "row V3" in w for w in warnings)
    assert "fabric" not in legal(cluster)


@pytest.mark.parametrize("infos, words", [
    ([(None, parse_fabric_text(TRAY) * 2)], "8 GPU fabric section(s) for host gb200-nvl72-tray00, "
                                            "which has 4 GPUs"),
    ([("tray9", parse_fabric_text(TRAY))], "names host 'tray9', which the topology does not have"),
    ([(None, parse_fabric_text(TRAY))] * 3, "3 unnamed fabric-info file(s) but only 2 host(s)"),
])
def test_info_that_does_not_fit_the_topology(infos: list, words: str) -> None:
    with pytest.raises(FabricInfoError) as e:
        merge_fabric(build_preset("gb200-nvl72:2"), infos)
    assert words in str(e.value)


# -- CLI ----------------------------------------------------------------------------------


def test_topo_fabric_cli(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["topo", "fabric", "gb200-nvl72:4", "--info", str(FABRIC / "gb200_4trays.json")]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "domain mnnvl-8b7e3c1a: multi-node (MNNVL), 12 GPUs on 3 host(s)" in out
    assert "domain gb200-nvl72-tray03-nvswitch: single-node NVSwitch" in out
    assert "group of all 16 GPU(s): legal backends: nccl" in out
    assert "warning: 4 GPU(s) on gb200-nvl72-tray03 report state In Progress" in err


def test_topo_fabric_named_host_files(capsys: pytest.CaptureFixture[str]) -> None:
    tray = str(FABRIC / "gb200_tray_completed.txt")
    assert main(["topo", "fabric", "gb200-nvl72:2", "--info", f"gb200-nvl72-tray01={tray}",
                 "--info", tray]) == 0
    assert "legal backends: fabric, multicast, symm, nccl" in capsys.readouterr().out


def test_import_xml_with_fabric_info(capsys: pytest.CaptureFixture[str]) -> None:
    tray = str(FABRIC / "gb200_tray_completed.txt")
    assert main(["topo", "import", str(XML / "oci_GB300MP.xml"), "--fabric-info", tray,
                 "--fabric-info", tray]) == 0
    out = capsys.readouterr().out
    assert "domain mnnvl-8b7e3c1a: multi-node (MNNVL), 8 GPUs on 2 host(s)" in out
    assert "COMPLETED 32766 8b7e3c1a" in out


def test_topo_fabric_cli_error(capsys: pytest.CaptureFixture[str]) -> None:
    # A capture of other machines: its host names are not this topology's.
    assert main(["topo", "fabric", "hgx-h100-8", "--info", str(FABRIC / "gb200_4trays.json")]) == 2
    err = capsys.readouterr().err
    assert "names host 'gb200-nvl72-tray00', which the topology does not have" in err
