"""Every kernel compiles with NVRTC for every architecture, on CPU (no GPU needed).

CUBIN output makes NVRTC run ptxas too, so the inline PTX (release/acquire flags, multimem)
is checked here, not first on a GPU.
"""

from __future__ import annotations

import re

import pytest

from commsim.kernels import collectives as K, workspace as W
from device import build, launch

try:
    NVRTC = ".".join(map(str, build.nvrtc_version()))
    WHY = ""
except build.NvrtcUnavailable as e:
    NVRTC, WHY = "", str(e)

pytestmark = pytest.mark.skipif(bool(WHY), reason=f"NVRTC cannot be loaded: {WHY}")

CASES = [(u, a) for a in build.ARCHS for u in build.units_for(a)]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("COMMSIM_KERNEL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_every_architecture_is_supported_by_this_nvrtc():
    assert set(build.ARCHS) <= set(build.supported_archs()), (NVRTC, build.supported_archs())


@pytest.mark.parametrize("unit, arch", CASES, ids=[f"{u}-sm_{a}" for u, a in CASES])
def test_unit_compiles_to_cubin_with_every_entry_point(unit, arch, cache):
    built = build.build(unit, arch)
    assert not built.cached and built.path.parent == cache and built.path.is_file()
    assert built.image[:4] == b"\x7fELF"                      # a CUBIN is an ELF image
    missing = [e for e in build.ENTRIES[unit] if e.encode() not in built.image]
    assert not missing, f"{unit} sm_{arch}: entry points missing from the CUBIN: {missing}"
    again = build.build(unit, arch)
    assert again.cached and again.image == built.image


def test_multimem_is_refused_below_sm_90():
    assert build.units_for(80) == ("peer",)
    with pytest.raises(build.CompileError, match="needs sm_90"):
        build.compile_unit("multimem", 80)


def test_ptx_keeps_the_memory_ordering_instructions():
    peer = build.compile_unit("peer", 90, "ptx").decode()
    mm = build.compile_unit("multimem", 90, "ptx").decode()
    assert ".target sm_90" in peer
    assert "st.release.sys.global.u32" in peer and "ld.acquire.sys.global.u32" in peer
    assert "ld.global.cg.v4.u32" in peer                      # peer data bypasses L1
    assert "cvt.rn.bf16.f32" in peer and "cvt.rn.f16.f32" in peer
    for op in ("multimem.ld_reduce.relaxed.sys.global.add.acc::f32.v4.bf16x2",
               "multimem.ld_reduce.relaxed.sys.global.add.v4.f32",
               "multimem.st.release.sys.global.u32", "fence.proxy.alias"):
        assert op in mm, op


def test_cache_key_follows_source_arch_and_kind(monkeypatch):
    keys = {build.cache_key("peer", a, k) for a in (80, 90) for k in ("cubin", "ptx")}
    assert len(keys) == 4
    monkeypatch.setattr(build, "nvrtc_version", lambda: (99, 0))
    assert build.cache_key("peer", 90, "cubin") not in keys


def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("COMMSIM_KERNEL_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert build.cache_dir() == tmp_path / "xdg" / "commsim" / "kernels"
    monkeypatch.setenv("COMMSIM_KERNEL_CACHE", str(tmp_path / "mine"))
    assert build.cache_dir() == tmp_path / "mine"


def test_device_layout_is_the_simulators():
    """The .cu workspace layout and flag offsets are the simulator's constants."""
    text = (build.KERNEL_DIR / build.COMMON_HEADER).read_text()
    defs = dict(re.findall(r"#define (\w+) (\S.*)", text))
    env = {}
    for name in ("MAX_RANKS", "FLAG_START", "FLAG_MID", "FLAG_END", "DATA", "ARRIVE", "ARRIVE_END"):
        env[name] = eval(defs[name], {}, env)                  # simple integer expressions
    assert (env["MAX_RANKS"], env["FLAG_START"], env["FLAG_MID"], env["FLAG_END"], env["DATA"]) == \
        (W.MAX_RANKS, W.START, W.MID, W.END, W.DATA)
    assert env["FLAG_END"] + 4 * W.MAX_RANKS <= env["ARRIVE"] < env["ARRIVE_END"] + 4 <= W.FLAGS_BYTES
    assert launch.MAX_RANKS == W.MAX_RANKS


def test_every_launch_names_a_compiled_entry_point():
    ptrs = [1 << 40, 2 << 40]
    plans = [
        launch.plan(K.one_shot_all_reduce, (ptrs, 0, 1000, "bfloat16", 1 << 20, 1), 132),
        launch.plan(K.two_shot_all_reduce, (ptrs, 1, 1 << 20, "float32", 8 << 20, 2), 132),
        launch.plan(K.reduce_scatter, (ptrs, 1, 4096, "float16", 1 << 20, 3), 132),
        launch.plan(K.all_gather, (ptrs, 0, 4096, 1 << 20, 4), 132),
        launch.plan(K.multimem_all_reduce, (1 << 40, 2 << 40, 0, 8, 4096, "float16", 1 << 20, 5), 132),
        launch.plan("fused_all_reduce_rmsnorm", (ptrs, 0, 4, 4096, "bfloat16", 1 << 20, 6,
                                                 3 << 40, 4 << 40, 5 << 40, 1e-6), 132),
        launch.plan("read_bytes", (1 << 40, 2 << 40, 64), 132),
    ]
    for p in plans:
        assert p.entry in build.ENTRIES[p.unit], p.entry
        assert 1 <= p.grid <= 132 and p.block == launch.THREADS
        assert len(p.param_array()) == len(p.params)
    assert plans[1].grid == 132                  # two-shot: whole grid resident, capped at SMs
    assert launch.ctypes.sizeof(launch.Peers) == 8 * W.MAX_RANKS


@pytest.mark.parametrize("args, match", [
    ((list(range(1, 130)), 0, 16, "float32", 1 << 20, 1), "1..128"),
    (([1, 2], 2, 16, "float32", 1 << 20, 1), "not in 0..1"),
    (([1, 2], 0, 1 << 20, "float32", 1 << 20, 1), "do not fit"),
    (([1, 2], 0, 16, "float32", 1 << 20, 0), "round 0"),
    (([1, 0], 0, 16, "float32", 1 << 20, 1), "pointer of rank 1"),
])
def test_launch_refuses_what_no_kernel_can_run(args, match):
    with pytest.raises(launch.LaunchError, match=match):
        launch.plan(K.one_shot_all_reduce, args, 132)
    with pytest.raises(KeyError):
        launch.plan("kernel", (), 132)
