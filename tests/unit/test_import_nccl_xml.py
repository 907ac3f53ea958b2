"""Import of NCCL topology XML (commsim.topology.importers.nccl_xml) over the real files in
tests/data/nccl/ (each described by the .md beside it), and malformed input."""

from __future__ import annotations

from pathlib import Path

import pytest

from commsim.cli import main
from commsim.report.size_tables import legal_backends
from commsim.scenario.model import Group, Scenario, Workload
from commsim.scenario.runner import run_scenario
from commsim.topology import render
from commsim.topology.gpu_models import GiB
from commsim.topology.importers.nccl_xml import (
    XmlTopologyError, build_cluster, import_file, parse_nccl_xml,
)
from commsim.topology.model import Cluster, FabricState, ZERO_UUID

DATA = Path(__file__).resolve().parents[1] / "data" / "nccl"
KiB = 1 << 10

# file -> (GPUs, hosts, NVLink domain, legal backends for a group of every GPU). Domain:
# "none" (no NVSwitch in the file), "node" (one single-host NVSwitch domain), "multi-node".
EXPECTED = {
    # 4 x A100 80GB PCIe, one GPU per NUMA node; the NVLink bridges name no peer (.md quirk),
    # so every pair is SYS without P2P: only NCCL.
    "azure_ncv4-topo.xml": (4, 1, "none", {"nccl"}),
    # 8 x V100 SXM2, flattened: the hybrid cube mesh is not in the file (.md), PCIe only.
    "azure_ndv2-topo.xml": (8, 1, "none", {"nccl"}),
    # 8 x A100 SXM4 (NVSwitch), flattened: NVLinks not in the file.
    "azure_ndv4-topo.xml": (8, 1, "none", {"nccl"}),
    # 8 x H100 SXM (NVSwitch), flattened.
    "azure_ndv5-topo.xml": (8, 1, "none", {"nccl"}),
    # DGX Spark: one GB10; a group of one needs no peer backend.
    "nccl_pr2202_gb10_dgx_spark.topo.xml": (1, 1, "none", {"nccl"}),
    # HGX B300: 8 GPUs on one NVLink-5 switch, one host: domain == node (.md).
    "oci_B300MP.xml": (8, 1, "node", {"ipc", "multicast", "symm", "nccl"}),
    # Two GB300 trays fused into one dump: same NVLink domain, different hosts (.md).
    "oci_GB300MP.xml": (8, 2, "multi-node", {"fabric", "multicast", "symm", "nccl"}),
    # OCI BM.GPU.H100.8: full dump, 4 NVSwitch targets per GPU (5+5+4+4 = 18 links).
    "oci_H100-topology.xml": (8, 1, "node", {"ipc", "multicast", "symm", "nccl"}),
    "oci_H100-topology-kubernetes.xml": (8, 1, "node", {"ipc", "multicast", "symm", "nccl"}),
    # OCI BM.GPU.B4.8 / GPU4.8 (A100), flattened, no NVLinks.
    "oci_topo-flattened-b4.xml": (8, 1, "none", {"nccl"}),
    "oci_topo-flattened.xml": (8, 1, "none", {"nccl"}),
}


def domain_kind(c: Cluster) -> str:
    if any(d.multi_node for d in c.domains):
        return "multi-node"
    return "node" if c.domains else "none"


def load(file: str, **kw) -> tuple[Cluster, list[str]]:
    cluster, warnings, _ = import_file(DATA / file, **kw)
    return cluster, warnings


def test_every_xml_file_in_the_data_folder_is_covered() -> None:
    files = {p.name for p in DATA.glob("*.xml")}
    assert files == set(EXPECTED) | {"azure_ncv4-graph.xml"}
    assert all((DATA / f"{f}.md").exists() for f in files)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_file_imports_to_its_machine(name: str) -> None:
    gpus, hosts, domain, legal = EXPECTED[name]
    cluster, _ = load(name)
    assert cluster.num_gpus == gpus
    assert len(cluster.hosts) == hosts
    assert domain_kind(cluster) == domain
    # Legal backends as the communicator would admit them: discovery on the simulator, then
    # each backend's eligibility over the group-agreed view.
    assert set(legal_backends(cluster, list(cluster.gpu_refs())).legal) == legal


@pytest.mark.parametrize("name, first", [
    ("oci_GB300MP.xml", "fabric"), ("oci_H100-topology.xml", "ipc"),
    ("oci_B300MP.xml", "ipc"), ("azure_ndv5-topo.xml", "nccl"), ("azure_ncv4-topo.xml", "nccl"),
])
def test_real_run_on_imported_machine_chooses_first_legal_backend(name: str, first: str) -> None:
    cluster, _ = load(name)
    refs = tuple(cluster.gpu_refs())
    sc = Scenario(name=name, cluster=cluster, placement=refs,
                  groups=(Group("tp", tuple(range(len(refs)))),),
                  workload=Workload(sizes=(4 * KiB,)), seed=3)
    res = run_scenario(sc)
    assert res.ok, res.failures
    assert set(res.backends.values()) == {first}
    assert not res.leaks


def test_graph_file_is_refused_with_what_it_is() -> None:
    with pytest.raises(XmlTopologyError) as e:
        import_file(DATA / "azure_ncv4-graph.xml")
    msg = str(e.value)
    assert "azure_ncv4-graph.xml: this is an NCCL graph file (NCCL_GRAPH_FILE" in msg
    assert "NCCL_TOPO_FILE" in msg


# -- what each file says and does not say ----------------------------------------------


def test_h100_dump_links_and_gpu_attributes() -> None:
    cluster, warnings = load("oci_H100-topology.xml")
    h = cluster.hosts[0]
    assert {h.link(i, j).label for i in range(8) for j in range(8) if i != j} == {"NV18"}
    g = h.gpus[0]
    assert (g.model, g.compute_capability, g.memory_bytes) == ("NVIDIA H100 80GB HBM3", (9, 0), 80 * GiB)
    assert g.multicast and g.fabric_handle and g.fabric.state == FabricState.COMPLETED
    assert g.fabric.cluster_uuid == ZERO_UUID and h.imex_channels == ()
    assert any("memory is not in the file" in w for w in warnings)


def test_two_dumps_of_one_machine_type_give_the_same_fabric() -> None:
    a, _ = load("oci_H100-topology.xml")
    b, _ = load("oci_H100-topology-kubernetes.xml", name="oci_H100-topology")
    assert a.hosts == b.hosts and a.domains == b.domains


def test_fused_gb300_dump_is_one_multi_node_domain_over_two_hosts() -> None:
    cluster, warnings = load("oci_GB300MP.xml")
    assert [len(h.gpus) for h in cluster.hosts] == [4, 4]
    assert all(h.arch == "aarch64" and h.imex_channels == (0,) for h in cluster.hosts)
    (d,) = cluster.domains
    assert d.multi_node and len(d.members) == 8 and d.cluster_uuid != ZERO_UUID
    assert cluster.hosts[0].gpus[0].model == "NVIDIA GB300"
    fused = next(w for w in warnings if "fused into one dump" in w)
    assert "0xffa2647d9c5a65e8" in fused and "0xb93bee07ef6f4564" in fused
    assert "NVML fabric info and IMEX are not in the file" in fused


def test_flattened_file_warns_about_missing_gpus_nvlinks_and_p2p() -> None:
    cluster, warnings = load("azure_ndv4-topo.xml")
    text = "\n".join(warnings)
    assert "bare PCI devices (no <gpu> elements)" in text
    assert "GPU model, compute capability and memory are not in the file" in text
    assert "GPU-GPU NVLinks are absent from the file" in text and "--nvswitch" in text
    assert "P2P is not in the file" in text
    h = cluster.hosts[0]
    # Two GPUs per virtual PCI switch, four NUMA nodes; GPUs in bus-id order.
    assert h.link(0, 1).label == "PIX" and h.link(0, 2).label == "SYS"
    assert h.link(0, 1).p2p and not h.link(0, 2).p2p


def test_flattened_nvswitch_box_with_model_given() -> None:
    cluster, _ = load("azure_ndv5-topo.xml", gpu_model="H100", nvswitch=True)
    assert {cluster.hosts[0].link(0, j).label for j in range(1, 8)} == {"NV18"}
    assert set(legal_backends(cluster, list(cluster.gpu_refs())).legal) == {"ipc", "multicast", "symm", "nccl"}
    a100, _ = load("azure_ndv4-topo.xml", gpu_model="A100", nvswitch=True)
    # HGX A100 has NVSwitch but no multicast objects (Hopper+).
    assert set(legal_backends(a100, list(a100.gpu_refs())).legal) == {"ipc", "symm", "nccl"}


def test_nvswitch_flag_refused_when_the_file_has_nvlinks() -> None:
    with pytest.raises(XmlTopologyError, match="--nvswitch is for files without <nvlink>"):
        load("oci_H100-topology.xml", nvswitch=True)


def test_ncv4_self_targeted_nvlink_is_reported_not_modelled() -> None:
    cluster, warnings = load("azure_ncv4-topo.xml")
    assert any("list an NVLink to their own bus id" in w for w in warnings)
    assert all(not l.is_nvlink for row in cluster.hosts[0].links for l in row if l)


def test_gb10_single_gpu_without_gpudirect() -> None:
    cluster, _ = load("nccl_pr2202_gb10_dgx_spark.topo.xml")
    g = cluster.hosts[0].gpus[0]
    assert (g.model, g.compute_capability) == ("NVIDIA GB10", (12, 1))
    assert not g.gpu_direct_rdma and cluster.hosts[0].arch == "aarch64"


def test_nic_speeds_are_read() -> None:
    topo = parse_nccl_xml((DATA / "oci_GB300MP.xml").read_text(), "gb300")
    assert len(topo.nics) == 8 and {n.speed_mbps for n in topo.nics} == {800000}


def test_direct_nvlink_between_named_gpus() -> None:
    text = """<system version="1"><cpu numaid="0" arch="x86_64">
      <pci busid="0000:01:00.0" class="0x030200" device="0x20b5"><gpu dev="0" sm="80" rank="0" gdr="1">
        <nvlink target="0000:02:00.0" count="12" tclass="0x030200"/></gpu></pci>
      <pci busid="0000:02:00.0" class="0x030200" device="0x20b5"><gpu dev="1" sm="80" rank="1" gdr="1">
        <nvlink target="0000:01:00.0" count="12" tclass="0x030200"/></gpu></pci>
    </cpu></system>"""
    cluster, _ = build_cluster(parse_nccl_xml(text, "bridge.xml"))
    assert cluster.hosts[0].link(0, 1).label == "NV12" and not cluster.domains


def test_show_and_import_cli_on_xml(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topo", "import", str(DATA / "oci_GB300MP.xml")]) == 0
    out, err = capsys.readouterr()
    assert "domain oci_GB300MP-domain: multi-node (MNNVL), 8 GPUs on 2 host(s)" in out
    assert "legal backends: fabric, multicast, symm, nccl" in out
    assert "8 NIC port(s) at 800 Gb/s" in err and "warning: 2 hosts (host_hash" in err
    assert main(["topo", "show", str(DATA / "oci_B300MP.xml")]) == 0
    assert "single-node NVSwitch, 8 GPUs" in capsys.readouterr().out


@pytest.mark.parametrize("argv, words", [
    ([str(DATA / "oci_B300MP.xml"), "--hosts", "2"], "--hosts: not accepted for an NCCL topology XML"),
    ([str(DATA / "azure_ncv4-graph.xml")], "this is an NCCL graph file"),
    ([str(Path(__file__).parents[1] / "data" / "topo" / "gb200_tray.txt"), "--hosts", "1",
      "--nvswitch"], "--nvswitch: only for an NCCL topology XML"),
])
def test_import_cli_xml_errors(capsys: pytest.CaptureFixture[str], argv: list[str], words: str) -> None:
    assert main(["topo", "import", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("commsim: error: ") and words in err


# -- malformed input --------------------------------------------------------------------

GPU = '<pci busid="0000:01:00.0" class="0x030200"><gpu dev="0" sm="90" rank="0"/></pci>'


@pytest.mark.parametrize("text, words", [
    ('<system version="1"><cpu numaid="0">', "bad.xml: line 1 column 37: malformed XML (no element found)"),
    ('<system version="1">\n<cpu numaid="0">\n</pci>\n</system>',
     "bad.xml: line 3 column 3: malformed XML (mismatched tag)"),
    ('<system version="1"><cpu numaid=0></cpu></system>',
     "bad.xml: line 1 column 33: malformed XML (not well-formed (invalid token))"),
    ('<!DOCTYPE x [<!ENTITY a "b">]><system/>', "DOCTYPE/ENTITY declarations are not accepted"),
    ("<topology/>", "root element is <topology>; expected an NCCL topology XML"),
    ('<system version="1"/>', "<system> has no <cpu> elements"),
    ('<system version="1"><cpu numaid="0"><nic><net name="eth0" speed="100000"/></nic></cpu></system>',
     "no GPUs: no <gpu> element and no <pci> of class 0x0300xx/0x0302xx"),
    ('<system version="1"><cpu numaid="0"><gpu dev="0" sm="90"/></cpu></system>',
     "<gpu dev='0'> is not inside a <pci busid=...> element"),
    ('<system version="1"><cpu><pci busid="0000:01:00.0" class="0x030200"><gpu dev="zero" sm="90"/>'
     '</pci></cpu></system>', "<gpu> in <pci busid='0000:01:00.0'>: attribute dev='zero' is not an integer"),
    (f'<system version="1"><cpu host_hash="0x1">{GPU}</cpu><cpu>{GPU}</cpu></system>',
     "some <cpu> elements carry host_hash and some do not"),
    (f'<system version="1"><cpu>{GPU}{GPU.replace("01:00", "02:00")}</cpu></system>',
     "<gpu dev> values are [0, 0]; expected each of 0..1 once"),
    ('<system version="1"><cpu><pci busid="0000:01:00.0" class="0x030200"><gpu dev="0" sm="90">'
     '<nvlink target="0000:1a:00.0" count="0"/></gpu></pci></cpu></system>',
     "<nvlink> needs target=<bus id> and count>=1"),
    ('<system version="1"><cpu><pci class="0x030200"/></cpu></system>', "<pci> element without busid"),
])
def test_malformed_xml_is_named(text: str, words: str) -> None:
    with pytest.raises(XmlTopologyError) as e:
        parse_nccl_xml(text, "bad.xml")
    assert str(e.value).startswith("bad.xml: ") and words in str(e.value)


def test_malformed_file_via_cli_reports_file_line_column(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "cut.xml"
    f.write_text((DATA / "oci_H100-topology.xml").read_text()[:3000])
    assert main(["topo", "import", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"commsim: error: {f}: line 36 column 9: malformed XML (unclosed token)" in err


def test_domain_map_renders_imported_fabric() -> None:
    cluster, _ = load("oci_GB300MP.xml")
    text = render.domain_map(cluster)
    assert "node-0\t4\tNVIDIA GB300\t103\taarch64\t0\tCOMPLETED 1" in text
