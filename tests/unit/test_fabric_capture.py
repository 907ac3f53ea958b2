"""NVML fabric captures in the forms bug reports paste (row T6 of docs/fidelity-rules.md):
`nvidia-smi -q -x` XML, JSON with NVML's field names, partial captures with warnings."""

from __future__ import annotations

from pathlib import Path

import pytest

from commsim.topology.importers.nvml_fabric_capture import (
    FabricInfoError, load_fabric_file, parse_fabric_json, parse_fabric_xml,
)
from commsim.topology.importers.nvml_fabric import merge_fabric
from commsim.topology.model import FabricState
from commsim.topology.presets import build

FABRIC = Path(__file__).resolve().parents[1] / "data" / "fabric"
UUID = bytes.fromhex("8b7e3c1a5d2f4e6b9a0c1f2e3d4c5b6a")


def test_xml_capture_reads_each_gpu_fabric_element() -> None:
    recs = load_fabric_file(FABRIC / "gb200_tray_q.xml")[None]
    assert len(recs) == 3
    assert recs[0].info.state == FabricState.COMPLETED and recs[0].info.clique_id == 32766
    assert recs[0].info.cluster_uuid == UUID and not recs[0].missing
    assert recs[2].info.state == FabricState.IN_PROGRESS
    assert recs[2].missing == {"status", "cluster_uuid"}


def test_partial_xml_capture_merges_over_the_topology_with_warnings() -> None:
    tray = build("gb200-nvl72:1")
    before = tray.hosts[0].gpus
    cluster, warnings = merge_fabric(tray, [(None, load_fabric_file(FABRIC / "gb200_tray_q.xml")[None])])
    gpus = cluster.hosts[0].gpus
    assert gpus[0].fabric.cluster_uuid == UUID and gpus[0].fabric.clique_id == 32766
    # GPU2 lacked a cluster UUID: the topology's stays; its state is what was captured.
    assert gpus[2].fabric.cluster_uuid == before[2].fabric.cluster_uuid
    assert gpus[2].fabric.state == FabricState.IN_PROGRESS
    assert gpus[3].fabric == before[3].fabric     # not in the capture at all
    assert any("fabric info for 3 of 4 GPUs (a partial capture)" in w for w in warnings)
    assert any("partial fabric info, no cluster_uuid, status" in w for w in warnings)


def test_json_with_nvml_field_names_and_extra_fields() -> None:
    recs = parse_fabric_json((FABRIC / "nvml_fields.json").read_text(), "n.json")[None]
    assert [r.info.clique_id for r in recs] == [7, 7, 7, 7]
    assert all(r.info.state == FabricState.COMPLETED and r.info.cluster_uuid == UUID for r in recs)
    assert any("ignored key(s) 'version', 'healthMask'" in n for n in recs[0].notes)
    assert recs[2].missing == {"status"}


@pytest.mark.parametrize("text, words", [
    ("<nvidia_smi_log><gpu id='0'>", "malformed XML"),
    ("<!DOCTYPE x [<!ENTITY a 'b'>]><nvidia_smi_log/>", "DOCTYPE or ENTITY declaration is refused"),
    ("<nvidia_smi_log><gpu id='0'><product_name>x</product_name></gpu></nvidia_smi_log>",
     "no <gpu> with a <fabric> element"),
    ("<nvidia_smi_log><gpu><fabric><state>Warm</state></fabric></gpu></nvidia_smi_log>",
     "fabric State 'Warm' is not one of"),
])
def test_bad_xml_is_named(text: str, words: str) -> None:
    with pytest.raises(FabricInfoError) as e:
        parse_fabric_xml(text, "q.xml")
    assert str(e.value).startswith("q.xml") and words in str(e.value)


# -- what people paste: cut off, one GPU unreadable, tools' own forms (real samples, each with
# its source in tests/data/fabric/<name>.md) ------------------------------------------------

def test_a_tool_log_cut_mid_way_gives_the_complete_gpus() -> None:
    """gpud's log line (leptonai/gpud#1106) carries the fabric info as an escaped JSON string
    and the report cuts it in the third GPU: the two complete ones are read, the cut warned."""
    recs = load_fabric_file(FABRIC / "gpud_log_cut.txt")[None]
    assert [r.info.clique_id for r in recs] == [4026, 4026]
    assert all(r.info.state == FabricState.COMPLETED and r.info.status == 0 for r in recs)
    assert recs[0].info.cluster_uuid == bytes.fromhex("9c6f5af353bf49b5a436b66766c413c3")
    assert any("the JSON is cut off or malformed after its GPU object 2" in n and
               "read the 2 complete one(s)" in n for n in recs[0].notes)


def test_a_tool_table_and_grep_cut_sections() -> None:
    table = load_fabric_file(FABRIC / "gpud_table.txt")[None]          # leptonai/gpud#1108
    assert len(table) == 1 and table[0].info.state == FabricState.NOT_SUPPORTED
    assert table[0].missing == {"cluster_uuid"} and "gpud_table.txt line 3" in table[0].notes[0]
    grep = load_fabric_file(FABRIC / "q_grep_unhealthy.txt")[None]     # dra-driver-nvidia-gpu#626
    assert len(grep) == 1 and grep[0].info.clique_id == 2 and grep[0].info.state == FabricState.COMPLETED
    failed = load_fabric_file(FABRIC / "q_insufficient_resources.txt")[None]   # azhpc-images#506
    assert failed[0].status_text == "Insufficient Resources" and failed[0].info.status != 0


def test_a_gpu_that_does_not_read_is_a_warning_by_line_unless_none_reads(tmp_path) -> None:
    good = "Fabric\n    State : Completed\n    Status : Success\n    CliqueId : 3\n"
    bad = "Fabric\n    State : Warm\n    CliqueId : 3\n"
    f = tmp_path / "q.txt"
    f.write_text(good + "\n" + bad)
    recs = load_fabric_file(f)[None]
    assert len(recs) == 1 and recs[0].info.clique_id == 3
    assert any(n.startswith(f"skipped: {f} line 6: fabric State 'Warm'") for n in recs[0].notes)
    f.write_text(bad)
    with pytest.raises(FabricInfoError, match="no GPU's fabric info is usable: .* line 1: fabric State 'Warm'"):
        load_fabric_file(f)


def test_xml_cut_mid_way_keeps_the_complete_gpus() -> None:
    text = (FABRIC / "gb200_tray_q.xml").read_text()
    cut = text[:text.rfind("<gpu ")] + "<gpu id='00000009:01:00.0'><fabric><state>Comp"
    recs = parse_fabric_xml(cut, "cut.xml")
    assert len(recs) >= 1 and any("the XML is cut off or malformed" in n for n in recs[0].notes)
    with pytest.raises(FabricInfoError, match="no complete <gpu> element before it"):
        parse_fabric_xml("<nvidia_smi_log><gpu id='0'><fabric><state>Comp", "cut.xml")
