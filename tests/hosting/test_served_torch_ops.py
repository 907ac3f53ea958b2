"""A compiled extension's torch ops served in a hosted rank (served_torch_ops.register): the
op resolves as torch.ops.<namespace>.<op> with the real schema (arguments bound and checked
by it, defaults filled in), runs with the caller's rank, a declared op commsim does not serve
raises the extension's named error, and restore removes them all."""

from __future__ import annotations

import pytest
import torch

from commsim.hosting.install.patches import Patches
from commsim.hosting.surfaces.compiled.extensions import ServedOp
from commsim.hosting.surfaces.compiled.served_torch_ops import register

from sim_ranks import ranks, solo


class NotServed(ImportError):
    pass


def test_served_and_refused_ops_resolve_and_go_again():
    patches = Patches()
    register(patches, {"commsim_probe.scaled": ServedOp("scaled(int x, int k=2) -> int",
                                                        "served_probe:scaled", "probe.cu")},
             {"commsim_probe.other": "other(int x) -> int"}, lambda: NotServed("other: not served"))
    try:
        _, (r0, r1) = ranks("hgx-h100-8", [(0, 0), (0, 1)])
        assert solo(r0, lambda: torch.ops.commsim_probe.scaled(5)) == 10
        assert solo(r1, lambda: torch.ops.commsim_probe.scaled(5, k=3)) == 16
        with pytest.raises(TypeError, match="missing value for argument 'x'"):
            solo(r0, lambda: torch.ops.commsim_probe.scaled())
        with pytest.raises(NotServed, match="other: not served"):
            solo(r0, lambda: torch.ops.commsim_probe.other(1))
        assert hasattr(torch.ops.commsim_probe, "other")          # a probe sees it installed
    finally:
        patches.restore()
    with pytest.raises((AttributeError, RuntimeError)):
        torch.ops.commsim_probe.scaled(1)
