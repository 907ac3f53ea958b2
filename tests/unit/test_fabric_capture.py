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
