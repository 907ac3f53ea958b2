"""One topology loader (commsim.topology.importers.load): it sniffs the format of a spec, and
the CLI and the scenario loader both read topologies through it."""

from __future__ import annotations

from pathlib import Path

import pytest

from commsim.errors import UserError
from commsim.scenario.schema import loads
from commsim.topology import importers
from commsim.topology.presets import build

ROOT = Path(__file__).resolve().parents[2]
SMI = ROOT / "tests" / "data" / "topo" / "a100_pcie_bridge_pairs.txt"
XML = ROOT / "tests" / "data" / "nccl" / "azure_ncv4-topo.xml"


def test_preset_spec_is_a_preset_and_slices():
    got = importers.load("gb200-nvl72:2")
    assert got.format == "preset" and got.cluster == build("gb200-nvl72:2")


def test_topo_matrix_text_is_sniffed_and_needs_hosts(tmp_path):
    with pytest.raises(UserError, match="needs the host count.*--hosts N"):
        importers.load(str(SMI))
    got = importers.load(str(SMI), hosts=2)
    assert got.format == "nvidia_smi" and len(got.cluster.hosts) == 2
    # The format is in the text, not the file name.
    renamed = tmp_path / "paste"
    renamed.write_text(SMI.read_text())
    assert importers.sniff(str(renamed), renamed.read_text()).name == "nvidia_smi"


def test_nccl_xml_is_sniffed_by_content(tmp_path):
    assert importers.load(str(XML)).format == "nccl_xml"
    pasted = tmp_path / "dump.txt"
    pasted.write_text(XML.read_text())
    assert importers.load(str(pasted)).format == "nccl_xml"


def test_unknown_input_names_what_is_accepted(tmp_path):
    junk = tmp_path / "notes.txt"
    junk.write_text("hello\n")
    with pytest.raises(UserError, match="not a topology this reads; give a preset name"):
        importers.load(str(junk))
    with pytest.raises(UserError, match="unknown preset 'gb300'; known presets"):
        importers.load("gb300")
    with pytest.raises(UserError, match="no such file"):
        importers.load(str(tmp_path / "missing.xml"))


def test_scenario_presets_come_through_the_same_loader(monkeypatch):
    seen = []
    real = importers.load
    monkeypatch.setattr(importers, "load", lambda spec, *a, **k: seen.append(spec) or real(spec, *a, **k))
    sc = loads('[scenario]\nname = "x"\n[topology]\npreset = "hgx-h100-8"\n[placement]\nranks = 2\n'
               '[[group]]\nname = "tp"\nranks = "0..1"\n')
    assert seen == ["hgx-h100-8"] and sc.cluster == build("hgx-h100-8")
