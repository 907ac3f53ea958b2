"""The simulated kernels' numpy arithmetic rounds and widens exactly like torch's casts (the
round-to-nearest-even a GPU's cvt.rn does), for every value class, and sums in order."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from commsim.kernels import collectives
from commsim.kernels.collectives import _reduce, store_rounded


def _specials() -> np.ndarray:
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2 ** 32, 20000, dtype=np.uint64).astype(np.uint32)
    ties = (rng.integers(0, 2 ** 16, 2000, dtype=np.uint64).astype(np.uint32) << 16) | 0x8000
    extra = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3.3895314e38, 3.4e38, 1e-40, -1e-45,
                      1.0, -2.5, 65504.0, 65520.0, 6e-8], np.float32)
    vals = np.concatenate([bits.view(np.float32), ties.view(np.float32), extra])
    return vals


@pytest.mark.parametrize("dtype,tdt", [("bfloat16", torch.bfloat16), ("float16", torch.float16),
                                       ("float32", torch.float32)])
def test_store_rounds_like_torch(dtype: str, tdt: torch.dtype) -> None:
    acc = _specials()
    out = np.zeros(acc.size * torch.empty(0, dtype=tdt).element_size(), np.uint8)
    with np.errstate(over="ignore", invalid="ignore"):
        store_rounded(acc.copy(), out, dtype)
    want = torch.from_numpy(acc).to(tdt)
    got = torch.from_numpy(out).view(tdt)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got[~nan].view(torch.uint8), want[~nan].view(torch.uint8)) if tdt != torch.float32 \
        else torch.equal(got[~nan], want[~nan])


@pytest.mark.parametrize("dtype,tdt", [("bfloat16", torch.bfloat16), ("float16", torch.float16),
                                       ("float32", torch.float32)])
def test_reduce_widens_and_sums_in_order(dtype: str, tdt: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(1001, generator=g).to(tdt) for _ in range(5)]
    acc = _reduce([x.view(torch.uint8).numpy() for x in xs], dtype)
    want = torch.zeros(1001)
    for x in xs:
        want += x.float()
    assert torch.equal(torch.from_numpy(acc), want)
    one = _reduce([xs[0].view(torch.uint8).numpy()], dtype)      # a lone input is widened only
    assert torch.equal(torch.from_numpy(one), xs[0].float())


@pytest.mark.parametrize("dtype,tdt", [("bfloat16", torch.bfloat16), ("float16", torch.float16)])
def test_blocked_reduce_into_matches_one_rounded_sum(dtype: str, tdt: torch.dtype,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """16-bit kernels reduce block by block; a ragged last block, a NaN and infinities included,
    every element is the in-order float32 sum rounded once, as with no blocks."""
    monkeypatch.setattr(collectives, "_BLOCK", 64)
    g = torch.Generator().manual_seed(2)
    xs = [torch.randn(1001, generator=g).to(tdt) for _ in range(5)]
    xs[1][7], xs[2][500], xs[3][999] = float("nan"), float("inf"), -float("inf")
    dst = np.zeros(1001 * 2, np.uint8)
    collectives.reduce_into([x.view(torch.uint8).numpy() for x in xs], dst, dtype)
    want = torch.zeros(1001)
    for x in xs:
        want += x.float()
    want = want.to(tdt)
    got = torch.from_numpy(dst).view(tdt)
    nan = torch.isnan(want)
    assert nan[7] and torch.equal(torch.isnan(got), nan)
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))


@pytest.fixture(params=["numpy", "torch"])
def f16_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """float16 through numpy's casts, or through torch's (from TORCH_F16_FROM elements, on one
    torch thread)."""
    monkeypatch.setattr(collectives, "TORCH_F16_FROM", 1 if request.param == "torch" else 1 << 62)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield request.param
    torch.set_num_threads(threads)


def test_float16_arithmetic_is_the_same_whichever_library_casts(f16_path: str) -> None:
    acc = _specials()
    out = np.zeros(acc.size * 2, np.uint8)
    with np.errstate(over="ignore", invalid="ignore"):
        store_rounded(acc.copy(), out, "float16")
    want = torch.from_numpy(acc).to(torch.float16)
    got = torch.from_numpy(out).view(torch.float16)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(4099, generator=g).to(torch.float16) for _ in range(5)]
    xs[2][9] = float("inf")
    srcs = [x.view(torch.uint8).numpy() for x in xs]
    srcs[1] = srcs[1].copy()
    srcs[1].flags.writeable = False                        # an input shared read-only
    acc = _reduce(srcs, "float16")
    want = torch.zeros(4099)
    for x in xs:
        want += x.float()
    assert torch.equal(torch.from_numpy(acc), want)
