"""Import of `nvidia-smi topo -m` output (commsim.topology.importers.nvidia_smi)."""

from __future__ import annotations

from pathlib import Path

import pytest

from commsim.topology import presets, render
from commsim.topology.gpu_models import GiB
from commsim.topology.importers.nvidia_smi import (
    ParsedHost, build_cluster, cluster_from_matrix_table, matrix_table, parse_p2p_matrix,
    parse_topo_matrix,
)
from commsim.topology.model import Cluster, FabricState, TopologyError, ZERO_UUID

DATA = Path(__file__).resolve().parents[1] / "data" / "topo"


def parse(name: str, p2p: str | None = None) -> ParsedHost:
    text = (DATA / name).read_text()
    p2p_text = (DATA / p2p).read_text() if p2p else None
    return parse_topo_matrix(text, name, p2p_text, p2p or "<p2p>")


def labels(cluster: Cluster, h: int = 0) -> list[list[str | None]]:
    return [[None if l is None else l.label for l in row] for row in cluster.hosts[h].links]


def p2p(cluster: Cluster, h: int = 0) -> list[list[bool | None]]:
    return [[None if l is None else l.p2p for l in row] for row in cluster.hosts[h].links]


def shape(cluster: Cluster) -> dict:
    """Everything a communicator could observe, with host names replaced by positions and the
    cluster UUID by "same non-zero value everywhere" (names and UUIDs differ by construction)."""
    pos = {h.name: n for n, h in enumerate(cluster.hosts)}
    uuids = {g.fabric.cluster_uuid for h in cluster.hosts for g in h.gpus}
    uuids |= {d.cluster_uuid for d in cluster.domains}
    return {
        "hosts": [{
            "links": [[None if l is None else (l.label, l.p2p) for l in row] for row in h.links],
            "imex": h.imex_channels, "arch": h.arch,
            "gpus": [(g.model, g.compute_capability, g.memory_bytes, g.fabric_handle,
                      g.multicast, g.gpu_direct_rdma, g.fabric.state, g.fabric.clique_id,
                      g.fabric.cluster_uuid == ZERO_UUID) for g in h.gpus],
        } for h in cluster.hosts],
        "domains": [([(pos[m.host], m.index) for m in d.members], d.multi_node,
                     d.cluster_uuid == ZERO_UUID) for d in cluster.domains],
        "one_uuid": len(uuids - {ZERO_UUID}) <= 1,
    }


# -- parsing the machines in tests/data/topo -------------------------------------------


def test_gb200_tray_parses_gpus_and_skips_nics_affinity_legend() -> None:
    p = parse("gb200_tray.txt")
    assert p.gpu_count == 4
    assert p.nic_count == 8
    assert p.all_nvlink and p.nvlink_counts() == {18}
    assert p.p2p is None
    assert p.cells[0] == (None, "NV18", "NV18", "NV18")


def test_matrix_inside_a_pasted_environment_report_parses() -> None:
    # SGLang's `python3 -m sglang.check_env` output as pasted, verbatim, into a public bug
    # report from two GB200 trays: package versions before the matrix, legends and limits after.
    p = parse("sglang_check_env_gb200_tray.txt")
    assert p.gpu_count == 4 and p.nic_count == 8 and p.nvlink_counts() == {18}


def test_gb200_tray_x2_is_preset_gb200_nvl72_2() -> None:
    cluster, warnings = build_cluster(parse("gb200_tray.txt"), hosts=2, domain=None, gpu_model=None)
    preset = presets.build("gb200-nvl72:2")
    assert shape(cluster) == shape(preset)
    assert len(cluster.hosts) == 2 and cluster.num_gpus == 8
    (dom,) = cluster.domains
    assert dom.multi_node and len(dom.members) == 8 and dom.cluster_uuid != ZERO_UUID
    assert all(h.imex_channels == (0,) and h.arch == "aarch64" for h in cluster.hosts)
    assert [h.name for h in cluster.hosts] == ["node-0", "node-1"]
    rack = [w for w in warnings if "inferred as 'rack'" in w]
    assert rack and "--domain" in rack[0]
    assert any("assumed NVIDIA GB200" in w for w in warnings)


def test_gb200_tray_with_model_and_explicit_rack_has_no_inference_warnings() -> None:
    cluster, warnings = build_cluster(parse("gb200_tray.txt"), 2, "rack", "NVIDIA GB200")
    assert shape(cluster) == shape(presets.build("gb200-nvl72:2"))
    assert warnings == []


def test_gb200_tray_single_host_is_a_node_domain_with_a_hint() -> None:
    cluster, warnings = build_cluster(parse("gb200_tray.txt"), 1, None, "GB200")
    (dom,) = cluster.domains
    assert not dom.multi_node and dom.cluster_uuid == ZERO_UUID
    assert cluster.hosts[0].imex_channels == ()
    assert any("inferred as 'node'" in w for w in warnings)
    assert any("--domain rack" in w and "GB200" in w for w in warnings)


def test_h100_nvswitch_box_with_nics_is_preset_hgx_h100_8() -> None:
    p = parse("h100_nvswitch_8_nics.txt")
    assert p.gpu_count == 8 and p.nic_count == 8 and p.nvlink_counts() == {18}
    cluster, warnings = build_cluster(p, 1)
    assert shape(cluster) == shape(presets.build("hgx-h100-8"))
    assert any("inferred as 'node'" in w for w in warnings)
    assert any("assumed NVIDIA H100 80GB HBM3" in w and "--gpu-model" in w for w in warnings)
    assert not any("P2P" in w for w in warnings)  # no PCIe pairs, nothing assumed about P2P


def test_nvswitch_box_on_two_hosts_gets_one_domain_per_host() -> None:
    cluster, _ = build_cluster(parse("h100_nvswitch_8_nics.txt"), 2)
    assert [len(d.members) for d in cluster.domains] == [8, 8]
    assert not any(d.multi_node for d in cluster.domains)
    g = cluster.hosts[1].gpus[0]
    assert g.fabric.state == FabricState.COMPLETED and g.fabric.cluster_uuid == ZERO_UUID


def test_domain_none_on_nvswitch_box_turns_the_fabric_off() -> None:
    cluster, warnings = build_cluster(parse("h100_nvswitch_8_nics.txt"), 1, "none", "H100")
    assert cluster.domains == ()
    g = cluster.hosts[0].gpus[0]
    assert g.fabric.state == FabricState.NOT_SUPPORTED
    assert not g.multicast and not g.fabric_handle
    assert warnings == []


def test_pcie_box_pasted_with_spaces_and_prose() -> None:
    p = parse("pcie_8_gpus_spaces.txt")
    assert p.gpu_count == 8 and p.nic_count == 0 and not p.nvlink_counts()
    cluster, warnings = build_cluster(p, 1)
    lab = labels(cluster)
    assert (lab[0][1], lab[0][2], lab[4][6], lab[0][4], lab[7][3]) == ("PIX", "PXB", "NODE", "SYS", "SYS")
    assert cluster.domains == ()
    assert all(x is None or x for row in p2p(cluster) for x in row)
    assert any("P2P for PCIe pairs was assumed" in w and "--p2p" in w for w in warnings)
    assert any("GPU model not given" in w for w in warnings)


def test_pcie_box_as_l40s() -> None:
    cluster, warnings = build_cluster(parse("pcie_8_gpus_spaces.txt"), 1, gpu_model="L40S")
    g = cluster.hosts[0].gpus[0]
    assert (g.model, g.compute_capability, g.memory_bytes) == ("NVIDIA L40S", (8, 9), 48 * GiB)
    assert not g.multicast and g.fabric.state == FabricState.NOT_SUPPORTED
    assert not any("GPU model" in w for w in warnings)


def test_pcie_box_as_geforce_has_no_p2p() -> None:
    cluster, warnings = build_cluster(parse("pcie_8_gpus_spaces.txt"), 1, gpu_model="RTX 4090")
    assert not any(x for row in p2p(cluster) for x in row)
    g = cluster.hosts[0].gpus[0]
    assert g.model == "NVIDIA GeForce RTX 4090" and not g.gpu_direct_rdma
    assert any("GeForce" in w and "--p2p" in w for w in warnings)


def test_a100_bridge_pairs_with_p2p_matrix_is_preset() -> None:
    p = parse("a100_pcie_bridge_pairs.txt", p2p="a100_pcie_bridge_pairs_p2p.txt")
    assert p.p2p is not None and p.p2p[0][4] is False and p.p2p[0][1] is True
    cluster, warnings = build_cluster(p, 1, gpu_model="A100")
    assert shape(cluster) == shape(presets.build("a100-pcie-bridge-8"))
    assert warnings == []


def test_a100_bridge_pairs_without_p2p_matrix_assume_pcie_p2p() -> None:
    cluster, warnings = build_cluster(parse("a100_pcie_bridge_pairs.txt"), 1, gpu_model="A100")
    assert labels(cluster) == labels(presets.build("a100-pcie-bridge-8"))
    assert all(x is None or x for row in p2p(cluster) for x in row)
    assert cluster.domains == ()  # bridges are not an NVSwitch fabric
    assert any("P2P for PCIe pairs was assumed" in w for w in warnings)


def test_dgx1_hybrid_cube_mesh() -> None:
    p = parse("dgx1_v100_cube_mesh.txt")
    assert p.nvlink_counts() == {1, 2} and not p.all_nvlink
    cluster, warnings = build_cluster(p, 1, gpu_model="V100")
    assert labels(cluster) == labels(presets.build("dgx1-v100"))
    assert cluster.domains == ()
    assert cluster.hosts[0].gpus[0].model == "Tesla V100-SXM2-32GB"
    assert any("P2P for PCIe pairs was assumed" in w for w in warnings)


def test_older_tool_with_mlx_columns_and_nv12_board() -> None:
    p = parse("a100_sxm_mlx_columns.txt")
    assert p.gpu_count == 8 and p.nic_count == 4 and p.nvlink_counts() == {12}
    cluster, warnings = build_cluster(p, 1)
    g = cluster.hosts[0].gpus[0]
    assert g.model == "NVIDIA A100-SXM4-80GB" and g.compute_capability == (8, 0)
    assert not g.multicast  # NVSwitch, but multicast objects need Hopper+
    assert len(cluster.domains) == 1
    assert any("assumed NVIDIA A100-SXM4-80GB" in w for w in warnings)


def test_full_model_name_is_kept_and_sets_memory() -> None:
    cluster, _ = build_cluster(parse("a100_sxm_mlx_columns.txt"), 1, gpu_model="NVIDIA A100-SXM4-40GB")
    g = cluster.hosts[0].gpus[0]
    assert g.model == "NVIDIA A100-SXM4-40GB" and g.memory_bytes == 40 * GiB


@pytest.mark.parametrize("name", sorted(presets.PRESETS))
def test_rendered_preset_host_imports_back_unchanged(name: str) -> None:
    # `commsim topo show` output carries a P2P section; importing it restores P2P exactly.
    host = presets.build(name).hosts[0]
    p = parse_topo_matrix(render.topo_matrix(host), name)
    cluster, _ = build_cluster(p, 1, domain="none")
    assert cluster.hosts[0].links == host.links


# -- build options ---------------------------------------------------------------------


def test_host_prefix_and_count() -> None:
    cluster, _ = build_cluster(parse("pcie_8_gpus_spaces.txt"), 3, host_prefix="tray")
    assert [h.name for h in cluster.hosts] == ["tray-0", "tray-1", "tray-2"]
    assert cluster.num_gpus == 24


@pytest.mark.parametrize("hosts", [0, -1])
def test_hosts_below_one_rejected(hosts: int) -> None:
    with pytest.raises(TopologyError, match=r"host count must be an integer >= 1.*got"):
        build_cluster(parse("gb200_tray.txt"), hosts)


def test_bad_host_prefix_rejected() -> None:
    with pytest.raises(TopologyError, match="host prefix 'a b'"):
        build_cluster(parse("gb200_tray.txt"), 1, host_prefix="a b")


def test_unknown_domain_rejected() -> None:
    with pytest.raises(TopologyError, match="unknown NVLink domain 'pod'; accepted: none, node, rack"):
        build_cluster(parse("gb200_tray.txt"), 2, domain="pod")


@pytest.mark.parametrize("domain", ["node", "rack"])
def test_nvlink_domain_needs_all_pairs_nvlink(domain: str) -> None:
    with pytest.raises(TopologyError) as e:
        build_cluster(parse("pcie_8_gpus_spaces.txt"), 2, domain=domain)
    msg = str(e.value)
    assert "GPU0-GPU1 is PIX" in msg and "pcie_8_gpus_spaces.txt" in msg and "'none'" in msg


def test_unknown_gpu_model_rejected() -> None:
    with pytest.raises(TopologyError, match=r"unknown GPU model 'MI300X'; known: GB300.*V100"):
        build_cluster(parse("gb200_tray.txt"), 1, gpu_model="MI300X")


def test_p2p_matrix_marking_nvlink_pair_off_is_kept_with_warning() -> None:
    text = "\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tNV4\t X \n"
    p = parse_topo_matrix(text, "t.txt", "\tGPU0\tGPU1\nGPU0\tX\tNS\nGPU1\tNS\tX\n", "p.txt")
    cluster, warnings = build_cluster(p, 1)
    assert cluster.hosts[0].links[0][1].p2p is False
    assert any("p.txt" in w and "GPU0-GPU1" in w for w in warnings)


# -- parsing details -------------------------------------------------------------------


def test_lower_case_cells_blank_lines_and_no_affinity_columns() -> None:
    text = "\tGPU0\tGPU1\tCPU Affinity\n\nGPU0\t x \tnv2\n\nGPU1\tNV2\tX\t0-7\n"
    p = parse_topo_matrix(text)
    assert p.cells == ((None, "NV2"), ("NV2", None))


def test_prose_naming_gpu0_is_not_a_header() -> None:
    text = "GPU0 GPU1 hang\nGPU0 is slow\nGPU0\n\nsee:\n\tGPU0\tGPU1\nGPU0\tX\tSYS\nGPU1\tSYS\tX\n"
    assert parse_topo_matrix(text).cells[0][1] == "SYS"


def test_embedded_p2p_section_is_read_and_explicit_p2p_wins() -> None:
    host = presets.build("l40s-8-pcie").hosts[0]
    text = render.topo_matrix(host)
    assert parse_topo_matrix(text).p2p[0][1] is False
    ok = "\t" + "\t".join(f"GPU{j}" for j in range(8)) + "\n" + "\n".join(
        f"GPU{i}\t" + "\t".join("X" if i == j else "OK" for j in range(8)) for i in range(8))
    assert parse_topo_matrix(text, "m", ok, "p").p2p[0][1] is True


def test_parse_p2p_matrix_alone() -> None:
    m = parse_p2p_matrix((DATA / "a100_pcie_bridge_pairs_p2p.txt").read_text())
    assert m[0][0] is None and m[0][3] is True and m[3][4] is False


# -- rejections: source, line, what was wrong, what is accepted -------------------------


def err(name: str, p2p: str | None = None) -> str:
    with pytest.raises(TopologyError) as e:
        parse(name, p2p)
    return str(e.value)


def test_error_short_row() -> None:
    assert err("bad_short_row.txt").startswith(
        "bad_short_row.txt line 6: GPU2 row has 3 GPU cells, header has 4 GPU columns")


def test_error_short_row_with_nics() -> None:
    lines = (DATA / "gb200_tray.txt").read_text().splitlines()
    lines[4] = lines[4].replace("NODE\t", "", 1)  # GPU1 row loses a NIC cell
    with pytest.raises(TopologyError, match=r"^bug.txt line 5: GPU1 row has 11 cells, header has "
                                            r"4 GPU columns and 8 NIC columns"):
        parse_topo_matrix("\n".join(lines), "bug.txt")


def test_error_unknown_cell() -> None:
    msg = err("bad_unknown_cell.txt")
    assert msg.startswith("bad_unknown_cell.txt line 3: GPU1 row, column GPU0: unknown cell 'NV?'")
    assert "accepted: NV<count> (e.g. NV18), PIX, PXB, PHB, NODE, SYS" in msg


def test_error_asymmetric() -> None:
    msg = err("bad_asymmetric.txt")
    assert msg.startswith("bad_asymmetric.txt line 5: asymmetric matrix")
    assert "GPU3-GPU0 is PIX" in msg and "(line 2) says SYS" in msg


def test_error_no_header() -> None:
    msg = err("bad_no_header.txt")
    assert msg.startswith("bad_no_header.txt: no GPU header found")
    assert "starting with GPU0" in msg


def test_error_empty_input() -> None:
    with pytest.raises(TopologyError, match="^<input>: no GPU header found"):
        parse_topo_matrix("")


def test_error_missing_row_in_the_middle() -> None:
    lines = (DATA / "bad_missing_row.txt").read_text().splitlines()
    del lines[2]                       # GPU1's row gone, GPU2's still there: not a truncation
    with pytest.raises(TopologyError, match=r"^gap.txt line 1: header has 4 GPU columns but no "
                                            r"row for GPU1; paste the whole matrix"):
        parse_topo_matrix("\n".join(lines), "gap.txt")


def test_error_x_off_diagonal() -> None:
    msg = err("bad_x_off_diagonal.txt")
    assert msg.startswith("bad_x_off_diagonal.txt line 2: GPU0 row, column GPU2: X (self) is only "
                          "allowed on the diagonal")


def test_error_diagonal_not_x() -> None:
    with pytest.raises(TopologyError, match=r"^t line 3: GPU1 row, column GPU1: the diagonal cell "
                                            r"must be X \(self\), got 'NV2'"):
        parse_topo_matrix("\tGPU0\tGPU1\nGPU0\tX\tNV2\nGPU1\tNV2\tNV2\n", "t")


def test_error_duplicate_and_extra_rows() -> None:
    head = "\tGPU0\tGPU1\nGPU0\tX\tSYS\n"
    with pytest.raises(TopologyError, match=r"^t line 3: second GPU0 row \(the first is line 2\)"):
        parse_topo_matrix(head + "GPU0\tX\tSYS\n", "t")
    with pytest.raises(TopologyError, match=r"^t line 3: GPU2 row, but the header \(line 1\) has 2 GPU"):
        parse_topo_matrix(head + "GPU2\tSYS\tSYS\n", "t")


def test_error_p2p_file_given_as_topo_matrix_hints_p2p_option() -> None:
    msg = err("a100_pcie_bridge_pairs_p2p.txt")
    assert "unknown cell 'OK'" in msg and "--p2p" in msg


def test_error_p2p_unknown_cell() -> None:
    with pytest.raises(TopologyError) as e:
        parse("pcie_8_gpus_spaces.txt", p2p="bad_p2p_unknown_cell.txt")
    msg = str(e.value)
    assert msg.startswith("bad_p2p_unknown_cell.txt line 3: GPU1 row, column GPU2: unknown P2P cell 'MAYBE'")
    assert "accepted: OK, NS, CNS, GNS, TNS, U (only OK means P2P allowed)" in msg


def test_error_p2p_size_mismatch() -> None:
    msg = err("gb200_tray.txt", "p2p_2_gpus.txt")
    assert msg.startswith("p2p_2_gpus.txt: P2P matrix has 2 GPUs but the topo matrix (gb200_tray.txt) has 4")


def test_error_p2p_asymmetric() -> None:
    topo = "\tGPU0\tGPU1\nGPU0\tX\tSYS\nGPU1\tSYS\tX\n"
    with pytest.raises(TopologyError, match=r"^p line 3: asymmetric matrix"):
        parse_topo_matrix(topo, "t", "\tGPU0\tGPU1\nGPU0\tX\tOK\nGPU1\tNS\tX\n", "p")


# -- the explicit [topology] table ------------------------------------------------------


def test_matrix_table_round_trip() -> None:
    cluster, _ = build_cluster(parse("gb200_tray.txt"), 2, host_prefix="tray")
    table = matrix_table(cluster, "tray")
    assert (table["hosts"], table["host_prefix"], table["gpu_model"], table["domain"]) == \
        (2, "tray", "NVIDIA GB200", "rack")
    notes: list[str] = []
    again = cluster_from_matrix_table(table, "x.toml", notes)
    assert again.hosts == cluster.hosts and again.domains == cluster.domains
    assert notes == []  # everything was explicit


def test_matrix_table_rows_as_arrays() -> None:
    table = {"hosts": 2, "matrix": [["X", "NV18"], ["NV18", "X"]], "p2p_matrix": [[True, False], [False, True]]}
    cluster = cluster_from_matrix_table(table, "s.toml")
    assert cluster.hosts[0].links[0][1].label == "NV18"
    assert cluster.hosts[0].links[0][1].p2p is False
    assert [h.name for h in cluster.hosts] == ["node-0", "node-1"]


def test_matrix_table_rows_as_strings() -> None:
    table = {"matrix": ["GPU0 X PIX", "GPU1 PIX X"], "domain": "none"}
    assert cluster_from_matrix_table(table, "s.toml").hosts[0].links[1][0].label == "PIX"


def test_matrix_table_errors_name_the_file_and_key() -> None:
    with pytest.raises(TopologyError, match=r"^s.toml: \[topology\] preset: unknown key"):
        cluster_from_matrix_table({"matrix": "x", "preset": "y"}, "s.toml")
    with pytest.raises(TopologyError, match=r"^s.toml: \[topology\]: needs matrix"):
        cluster_from_matrix_table({"hosts": 2}, "s.toml")
    with pytest.raises(TopologyError, match=r"^s.toml: \[topology\] hosts: expected an integer >= 1"):
        cluster_from_matrix_table({"matrix": "x", "hosts": "2"}, "s.toml")
    with pytest.raises(TopologyError, match=r"^s.toml: \[topology\] matrix line 2: GPU0 row, column "
                                            r"GPU1: unknown cell 'NV\?'"):
        cluster_from_matrix_table({"matrix": "\tGPU0\tGPU1\nGPU0\tX\tNV?\nGPU1\tNV?\tX\n"}, "s.toml")
    with pytest.raises(TopologyError, match=r"^s.toml: \[topology\]: unknown NVLink domain"):
        cluster_from_matrix_table({"matrix": [["X", "SYS"], ["SYS", "X"]], "domain": "pod"}, "s.toml")
    with pytest.raises(TopologyError, match=r"^s.toml: \[topology\] matrix: expected the matrix"):
        cluster_from_matrix_table({"matrix": 3}, "s.toml")
