"""Random numbers in hosted ranks: one generator per device per rank (torch_random.py), and in
inproc mode each rank's own CPU, `random` and numpy generators (rankview.py), so seeded
ranks draw alike whatever the interleaving, as separate processes do."""

from __future__ import annotations

import pytest
import torch

from hosting_helpers import PROGRAMS, hosted
from sim_ranks import module_surfaces, ranks, solo  # noqa: F401  (fixture)

pytestmark = pytest.mark.usefixtures("module_surfaces")


def _one(gpu: int = 0):
    _, (r,) = ranks("hgx-h100-8", [(0, gpu)])
    return r


def test_device_generators_are_seeded_and_apart_from_the_cpu_one():
    def program():
        fresh = torch.cuda.initial_seed()
        torch.cuda.manual_seed(7)
        a = torch.rand(4, device="cuda").cpu()
        torch.rand(100)                                  # a CPU draw moves no device stream
        b = torch.empty(4, device="cuda").uniform_().cpu()
        torch.cuda.manual_seed(7)
        a2 = torch.rand(4, device="cuda").cpu()
        b2 = torch.empty(4, device="cuda").uniform_().cpu()
        state = torch.cuda.get_rng_state()
        c = torch.randn_like(torch.ones(3, device="cuda")).cpu()
        torch.cuda.set_rng_state(state)
        c2 = torch.randn_like(torch.ones(3, device="cuda")).cpu()
        other = torch.rand(4, device="cuda:1").cpu()     # cuda:1 still at its default seed
        torch.manual_seed(7)                             # seeds every device too
        d1 = torch.rand(4, device="cuda:1").cpu()
        return fresh, a, b, a2, b2, c, c2, other, d1, torch.cuda.initial_seed()
    fresh, a, b, a2, b2, c, c2, other, d1, seed = solo(_one(), program)
    assert fresh == 67280421310721 and seed == 7
    assert torch.equal(a, a2) and torch.equal(b, b2) and not torch.equal(a, b)
    assert torch.equal(c, c2)
    g = torch.Generator().manual_seed(7)
    assert torch.equal(d1, torch.rand(4, generator=g))
    assert torch.equal(other, torch.rand(4, generator=torch.Generator().manual_seed(67280421310721)))


def test_seed_draws_a_seed_that_is_a_function_of_the_rank():
    def program():
        torch.cuda.seed()
        return torch.cuda.initial_seed()
    assert solo(_one(), program) == solo(_one(), program) != 67280421310721


@pytest.mark.parametrize("mode", ["inproc", "procs"])
def test_seeded_ranks_draw_alike_across_collectives(mode):
    v, res, _ = hosted(PROGRAMS / "seeded_draws.py", "hgx-h100-8", mode=mode, nproc_per_host=4)
    assert v.ok, v.format()
    assert sorted(res) == [0, 1, 2, 3]
    first = {k: x for k, x in res[0].items() if k != "rank"}
    for d in res.values():
        assert {k: x for k, x in d.items() if k != "rank"} == first, (d, first)
    assert first["py"] != first["py_unseeded_differs"]
