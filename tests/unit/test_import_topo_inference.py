"""What the importers infer (docs/fidelity-rules.md): NVLink meshes are not NVSwitch (rows T1-T3), `topo -p2p`
blocks pasted after the matrix (T4), tables cut short (T5). docs/fidelity-rules.md §3."""

from __future__ import annotations

from pathlib import Path

import pytest

from commsim.topology import presets, render
from commsim.topology.importers.nvidia_smi import build_cluster, parse_topo_matrix, switch_shape
from commsim.topology.model import TopologyError

DATA = Path(__file__).resolve().parents[1] / "data" / "topo"


def parse(name: str):
    return parse_topo_matrix((DATA / name).read_text(), name)


def test_four_gpu_nv6_mesh_is_no_nvswitch_and_no_multicast() -> None:
    cluster, warnings = build_cluster(parse("h100_nv6_mesh_4.txt"), 1, gpu_model="H100")
    assert cluster.domains == ()
    assert not any(g.multicast or g.fabric_handle for g in cluster.hosts[0].gpus)
    assert all(cluster.hosts[0].link(i, j).p2p for i in range(4) for j in range(4) if i != j)
    said = [w for w in warnings if "inferred as 'none'" in w]
    assert said and "NV6 to each of 3 peer(s) = 18 links" in said[0] and "no NVSwitch" in said[0]


def test_nv6_on_sixteen_gpus_is_a_switch_board() -> None:
    # DGX-2: NV6 to 15 peers is 90 links, far more than one V100 has (NVIDIA/nccl-tests#78).
    text = "\t" + "\t".join(f"GPU{j}" for j in range(16)) + "\n" + "\n".join(
        f"GPU{i}\t" + "\t".join(" X " if i == j else "NV6" for j in range(16)) for i in range(16))
    p = parse_topo_matrix(text, "dgx2.txt")
    assert switch_shape(p, None)[0]
    cluster, _ = build_cluster(p, 1, gpu_model="V100")
    assert len(cluster.domains) == 1 and len(cluster.domains[0].members) == 16


@pytest.mark.parametrize("preset,switch", [("hgx-h100-8", True), ("hgx-b300-8", True),
                                           ("h200-nvl-4way-8", False), ("h200-nvl-2way-8", False),
                                           ("rtx3090-2-nvlink", False), ("dgx1-v100", False)])
def test_switch_inference_on_rendered_presets(preset: str, switch: bool) -> None:
    host = presets.build(preset).hosts[0]
    p = parse_topo_matrix(render.topo_matrix(host), preset)
    cluster, _ = build_cluster(p, 1)
    assert bool(cluster.domains) == switch


def test_mesh_slice_of_h200_nvl_4way_imports_as_mesh() -> None:
    host = presets.build("h200-nvl-4way-8").hosts[0]
    four = "\t" + "\t".join(f"GPU{j}" for j in range(4)) + "\n" + "\n".join(
        f"GPU{i}\t" + "\t".join(" X " if i == j else host.link(i, j).label for j in range(4))
        for i in range(4))
    ok, why = switch_shape(parse_topo_matrix(four, "nvl.txt"), None)
    assert not ok and "direct NVLink mesh" in why


def test_explicit_domain_on_a_mesh_is_kept_with_a_warning() -> None:
    cluster, warnings = build_cluster(parse("h100_nv6_mesh_4.txt"), 1, "node", "H100")
    assert len(cluster.domains) == 1
    assert any("kept as given, but the matrix reads as no NVSwitch" in w for w in warnings)


def test_topo_and_p2p_blocks_pasted_together() -> None:
    p = parse("bug_report_topo_and_p2p.txt")
    assert p.gpu_count == 4 and p.p2p is not None
    cluster, warnings = build_cluster(p, 1, gpu_model="A100")
    h = cluster.hosts[0]
    assert h.link(0, 1).p2p and h.link(2, 3).p2p
    # r says CNS for 1-3, w says TNS: the first refusal's cause is kept (r block first).
    assert not h.link(1, 3).p2p and h.link(1, 3).p2p_reason == "CNS"
    assert not h.link(0, 2).p2p and h.link(0, 2).p2p_reason == "CNS"
    # The atomics block is reference only: it does not turn the bridge pairs' P2P off.
    assert any("`topo -p2p a` block read for reference only" in w for w in warnings)


def test_a_p2p_block_with_tns_keeps_its_cause_through_render() -> None:
    p = parse("bug_report_topo_and_p2p.txt")
    cluster, _ = build_cluster(p, 1, gpu_model="A100")
    again = parse_topo_matrix(render.topo_matrix(cluster.hosts[0]), "again")
    assert build_cluster(again, 1, gpu_model="A100")[0].hosts[0].links == cluster.hosts[0].links


def test_truncated_last_row_imports_what_is_there_and_warns() -> None:
    p = parse("truncated_8_gpus.txt")
    # GPU5's row stops early and GPU6-7 have no row: GPU0..5 are fully known (GPU5's missing
    # cells mirror rows 0-4), the cells between GPU6 and GPU7 are not in the paste.
    assert p.gpu_count == 6
    cluster, warnings = build_cluster(p, 1)
    assert cluster.num_gpus == 6 and len(cluster.domains) == 1
    cut = [w for w in warnings if "cut short" in w]
    assert cut and "no row for GPU6, GPU7" in cut[0] and "GPU0..GPU5 only" in cut[0]
    assert "GPU5 row (line 7) stops after 6 of 8 GPU cells" in cut[0]


def test_one_missing_trailing_row_is_rebuilt_from_the_mirror_cells() -> None:
    p = parse("bad_missing_row.txt")
    assert p.gpu_count == 4 and p.cells[3][2] == "NV4" and p.cells[3][0] == "SYS"
    assert any("imported all 4 GPUs, the missing cells read from their mirror cells" in n
               for n in p.notes)


def test_a_short_row_in_the_middle_is_still_an_error() -> None:
    with pytest.raises(TopologyError, match="GPU2 row has 3 GPU cells, header has 4 GPU columns"):
        parse("bad_short_row.txt")


def test_a_table_cut_before_two_gpus_is_an_error() -> None:
    with pytest.raises(TopologyError, match="paste the whole matrix"):
        parse_topo_matrix("\tGPU0\tGPU1\tGPU2\nGPU0\t X \tNV4", "cut.txt")
