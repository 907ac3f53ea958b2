"""The generator: ids regenerate their scenarios exactly, in this process and in another."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections import Counter

import pytest

from commsim.errors import UserError
from commsim.scenario import faults as F, generate as G
from commsim.scenario.model import DTYPES, OPS


def digest(sc) -> str:
    wl = sc.workload
    parts = [sc.name, sc.seed, sc.cluster, sc.placement, sc.groups, wl, sc.faults, sc.policy]
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def test_same_seed_same_ids_and_scenarios() -> None:
    a = list(G.sample(5, 60))
    b = list(G.sample(5, 60))
    assert [s.name for s in a] == G.sample_ids(5, 60) == [s.name for s in b]
    assert [digest(s) for s in a] == [digest(s) for s in b]
    for s in a[:20]:
        again = G.scenario_from_id(s.name)
        assert digest(again) == digest(s)
        assert again.cluster == s.cluster


def test_other_seed_other_scenarios() -> None:
    assert [digest(s) for s in G.sample(1, 20)] != [digest(s) for s in G.sample(2, 20)]


def test_an_id_needs_no_predecessors() -> None:
    assert digest(G.scenario_from_id("s3-500")) == digest(next(G.sample(3, 1, start=500)))
    assert digest(G.scenario_from_id("e777")) == digest(next(G.enumerate_scenarios(1, start=777)))


def test_ids_regenerate_in_a_fresh_process() -> None:
    """Nothing may depend on the per-process hash salt (PYTHONHASHSEED)."""
    ids = G.sample_ids(0, 40) + G.enum_ids(40)
    here = [digest(G.scenario_from_id(i)) for i in ids]
    code = ("import sys, hashlib\nfrom commsim.scenario import generate as G\n"
            "sys.path.insert(0, sys.argv[1])\nfrom test_generate import digest\n"
            "print('\\n'.join(digest(G.scenario_from_id(i)) for i in sys.argv[2:]))")
    import pathlib
    out = subprocess.run([sys.executable, "-c", code, str(pathlib.Path(__file__).parent), *ids],
                         capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "12345", "PATH": ""})
    assert out.stdout.split() == here


def test_enumeration_slice_covers_every_dimension() -> None:
    plans = [G.enum_plan(i) for i in range(2000)]
    assert {p.shape for p in plans} == set(G.ENUM_SHAPES)
    assert {f.kind for p in plans for f in p.faults} == {k.name for k in F.drawn_kinds()}
    assert {o for p in plans for o in p.ops} == set(OPS)
    assert {d for p in plans for d in p.dtypes} == set(DTYPES)
    assert {p.placement for p in plans} == set(G.PLACEMENTS)
    assert {p.tp for p in plans} >= {1, 2, 4, 6, 8, 16}
    assert any(p.graph_capture and p.discard for p in plans)
    assert len({p.id for p in plans}) == 2000


def test_default_mix_is_cheap_and_varied() -> None:
    plans = [G.sample_plan(0, i) for i in range(3000)]
    worlds = Counter(p.world for p in plans)
    assert max(worlds) <= G.MAX_WORLD
    assert sum(n for w, n in worlds.items() if w <= 8) / len(plans) > 0.9
    big = [p for p in plans if max(p.sizes) >= 8 * G.Mi - 16]
    assert big and all(p.world <= 2 for p in big)
    assert all(max(p.sizes) <= 16 * G.Mi for p in plans)
    hosts = [G.build_shape(p.shape) for p in plans]
    small = sum(len(c.hosts) <= 4 and c.num_gpus <= 16 for c in hosts) / len(plans)
    assert 0.9 < small < 1.0          # a small fraction of big racks, up to 18 hosts
    assert max(len(c.hosts) for c in hosts) == 18
    assert {s for s, _ in G.DEFAULT_SHAPES} >= {p for p in G.SINGLE_HOST}
    assert {G.shape_family(p.shape) for p in plans} == set(G.PRESETS)


def test_sizes_hit_the_cut_offs() -> None:
    sizes = {s for i in range(12000) for s in G.sample_plan(0, i).sizes}
    for edge in (256 * 1024, 512 * 1024, 8 * G.Mi):
        assert {edge - 16, edge, edge + 16} <= sizes, edge
    assert 1 * G.Mi // 8 in sizes                  # fabric one-shot edge for ws 8
    assert any(s % 16 for s in sizes)


def test_faults_target_used_gpus() -> None:
    for i in range(300):
        sc = G.scenario_from_id(f"s0-{i}")
        used = set(sc.placement)
        for f in sc.faults:
            if f.gpu is not None:
                assert f.gpu in used
            if f.kind == "imex_missing":
                assert f.host in {g.host for g in used}
            if f.kind == "oom":
                assert 0 <= f.rank < sc.world_size


def test_joined_boxes_are_separate_domains() -> None:
    c = G.build_shape("gb200-nvl72:2*2")
    assert len(c.hosts) == 4 and len(c.domains) == 2
    a, b = c.domains
    assert a.cluster_uuid != b.cluster_uuid and any(a.cluster_uuid) and any(b.cluster_uuid)
    ra, rb = a.members[0], b.members[0]
    assert c.gpu(ra).fabric.cluster_uuid == a.cluster_uuid
    assert c.gpu(rb).fabric.cluster_uuid == b.cluster_uuid
    assert not c.same_domain(ra, rb)


@pytest.mark.parametrize("bad", ["x1", "s1", "s-1-2", "e", "s1-2-3", ""])
def test_bad_ids_are_user_errors(bad: str) -> None:
    with pytest.raises(UserError, match="not a generated id"):
        G.scenario_from_id(bad)
