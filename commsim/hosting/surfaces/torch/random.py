"""torch.cuda's random generators in a hosted rank: one per device, per rank.

A CUDA build keeps one generator per device (`torch.cuda.default_generators`), each starting
from c10's default seed 67280421310721 (c10/core/GeneratorImpl.h, default_rng_seed_val) until
`torch.cuda.manual_seed` (the current device), `manual_seed_all` or `torch.manual_seed`
(which seeds every device: torch/random.py calls torch.cuda.manual_seed_all) reseeds it.
Random factories with `device="cuda"` and random ops on CUDA tensors draw from the generator
of their device when given none, so CPU draws do not move a device's stream.

Here each device generator is a CPU `torch.Generator` kept in the rank's state, so a program
that seeds alike on every rank draws alike on every rank, in either hosting mode, however the
ranks interleave. The values differ from a GPU's (Philox there, mt19937 here); their
distribution does not. `torch.cuda.seed()` / `seed_all()` (a nondeterministic seed on a GPU)
take a seed derived from the rank and the call count, so a run stays a function of its seed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from commsim.hosting.state.cuda_state import rank_state
from commsim.hosting.state.session import current
from commsim.hosting.surfaces.torch.device import device_count, device_index_of

DEFAULT_SEED = 67280421310721
KEY = "torch.cuda.random"


@dataclass
class _Generators:
    by_device: dict[int, Any] = field(default_factory=dict)
    drawn_seeds: int = 0


def _state() -> _Generators:
    return rank_state(current(), KEY, _Generators)


def generator(device: int) -> Any:
    """The rank's generator of cuda:`device` (made at its default seed on first use)."""
    import torch
    gens = _state().by_device
    g = gens.get(device)
    if g is None:
        g = gens[device] = torch.Generator()
        g.manual_seed(DEFAULT_SEED)
    return g


def _all_devices() -> range:
    return range(device_count())


def manual_seed(seed: int) -> None:
    generator(device_index_of(None)).manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for d in _all_devices():
        generator(d).manual_seed(int(seed))


def _drawn_seed() -> int:
    st = _state()
    st.drawn_seeds += 1
    digest = hashlib.sha256(f"{current().rank}:{st.drawn_seeds}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def seed() -> None:
    manual_seed(_drawn_seed())


def seed_all() -> None:
    manual_seed_all(_drawn_seed())


def initial_seed() -> int:
    return generator(device_index_of(None)).initial_seed()


def get_rng_state(device: Any = "cuda") -> Any:
    return generator(device_index_of(device)).get_state()


def set_rng_state(new_state: Any, device: Any = "cuda") -> None:
    generator(device_index_of(device)).set_state(new_state)


def get_rng_state_all() -> list[Any]:
    return [generator(d).get_state() for d in _all_devices()]


def set_rng_state_all(new_states: Any) -> None:
    for d, s in enumerate(new_states):
        generator(d).set_state(s)


HOSTED = {"manual_seed": manual_seed, "manual_seed_all": manual_seed_all, "seed": seed,
          "seed_all": seed_all, "initial_seed": initial_seed, "get_rng_state": get_rng_state,
          "set_rng_state": set_rng_state, "get_rng_state_all": get_rng_state_all,
          "set_rng_state_all": set_rng_state_all}


# ---- random draws on a device ---------------------------------------------------------------

_RANDOM_FACTORIES: set[Any] = set()
_with_generator: dict[Any, Any] = {}      # aten op -> (op to call, takes generator) cache


def random_factories() -> set[Any]:
    """torch's random factories that take `generator=` (those a `device=` can reach)."""
    if not _RANDOM_FACTORIES:
        import torch
        _RANDOM_FACTORIES.update({torch.rand, torch.randn, torch.randint, torch.randperm,
                                  torch.normal, torch.rand_like, torch.randn_like,
                                  torch.randint_like})
    return _RANDOM_FACTORIES


def factory_kwargs(func: Any, kwargs: dict, device: int) -> dict:
    """A random factory's kwargs drawing from cuda:`device`'s generator when none is given."""
    if kwargs.get("generator") is None and func in random_factories():
        return {**kwargs, "generator": generator(device)}
    return kwargs


def op_with_generator(func: Any, kwargs: dict, device: int) -> tuple[Any, dict]:
    """An aten op on a CUDA tensor: the overload to call and kwargs, drawing from
    cuda:`device`'s generator when the op is random and got none (rand_like's default
    overload has no generator argument: its `generator` overload does)."""
    hit = _with_generator.get(func)
    if hit is None:
        hit = _with_generator[func] = _generator_overload(func)
    op = hit
    if op is False or kwargs.get("generator") is not None:
        return func, kwargs
    return op, {**kwargs, "generator": generator(device)}


def _generator_overload(func: Any) -> Any:
    if any(a.name == "generator" and a.kwarg_only for a in func._schema.arguments):
        return func
    name = func._overloadname
    alt = {"default": "generator", "out": "generator_out"}.get(name)
    packet = func.overloadpacket
    if alt is not None and alt in packet.overloads():
        return getattr(packet, alt)
    return False
