"""The keys a `[[fault]]` table may hold, each with the example its "missing" message shows and
the parser that checks it. `Fault` (commsim/scenario/model.py) declares every key once, as a
field made by `key(example, parse)`; a fault kind (commsim/scenario/faults.py) names which of
them it takes, and the scenario loader reads a fault by walking Fault's fields.

A parser is `parse(table, name, value, at) -> value`: `table` is the fault's Table (for
messages), `at` what else the value is checked against (the machine, the world size, the
kind, and the keys parsed before it, in Fault's field order).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from commsim.topology.model import Cluster, FabricState
from commsim.scenario.fields import Table, check_choice, check_cuda_error, check_host, describe, parse_gpu


@dataclass(frozen=True)
class At:
    """What a fault key's value is checked against."""

    cluster: Cluster
    world: int
    kind: Any                     # the FaultKind being read (its `causes`)
    parsed: dict[str, Any]        # the keys read so far, in Fault's field order


Parse = Callable[[Table, str, Any, At], Any]


def key(example: str, parse: Parse, default: Any = None) -> Any:
    """A field of Fault that is a `[[fault]]` key: its example line and its parser."""
    return dataclasses.field(default=default, metadata={"example": example, "parse": parse})


def example(f: dataclasses.Field) -> str:
    return f.metadata["example"]


def parse(f: dataclasses.Field, table: Table, value: Any, at: At) -> Any:
    return f.metadata["parse"](table, f.name, value, at)


# -- the parsers ------------------------------------------------------------------------------
def host(t: Table, name: str, value: Any, at: At) -> str:
    return check_host(t, name, value, at.cluster)


def gpu(t: Table, name: str, value: Any, at: At) -> Any:
    return parse_gpu(t, name, value, at.cluster)


def gpu_pair(t: Table, name: str, value: Any, at: At) -> tuple[int, int]:
    """Two distinct GPU indices of the fault's `host` (read before it: a kind with `gpus`
    requires `host`)."""
    h = at.parsed["host"]
    n = len(at.cluster.host(h).gpus)
    if (not isinstance(value, list) or len(value) != 2
            or any(isinstance(v, bool) or not isinstance(v, int) for v in value)):
        got = describe(value) if not isinstance(value, list) else f"{value!r}"
        raise t.error(f"expected a pair of GPU indices of host {h}, e.g. gpus = [0, 1]; "
                      f"got {got}", name)
    for v in value:
        t.check_int(v, name, 0, n - 1, what="GPU index", note=f" (host {h} has {n} GPUs)")
    if value[0] == value[1]:
        raise t.error(f"the pair [{value[0]}, {value[1]}] names one GPU twice; give two "
                      f"distinct GPUs of host {h}", name)
    return value[0], value[1]


def fabric_state(t: Table, name: str, value: Any, at: At) -> str:
    names = tuple(s.name for s in FabricState)
    if isinstance(value, str) and value.upper() in names:
        return value.upper()  # NVML spells them in capitals; accept any case, store canonical
    return check_choice(t, name, value, names, what="fabric state")


def rank(t: Table, name: str, value: Any, at: At) -> int:
    return t.check_int(value, name, 0, at.world - 1, what="rank", note=f" (world size {at.world})")


def allocation(t: Table, name: str, value: Any, at: At) -> int:
    return t.check_int(value, name, 1, what="allocation number", note=" (1 = the first)")


def call_number(t: Table, name: str, value: Any, at: At) -> int:
    return t.check_int(value, name, 1, what="call number", note=" (1 = the first)")


def api(t: Table, name: str, value: Any, at: At) -> str:
    return t.string(name, pattern=r"[A-Za-z_][A-Za-z0-9_]*",
                    shape='a driver call name, e.g. "cudaIpcOpenMemHandle"')


def error_code(t: Table, name: str, value: Any, at: At) -> str:
    return check_cuda_error(t, name, value)


def cause(t: Table, name: str, value: Any, at: At) -> str:
    """One of the causes the kind declares (FaultKind.causes)."""
    return check_choice(t, name, value, at.kind.causes, what=f"{at.kind.name} cause")


def host_list(t: Table, name: str, value: Any, at: At) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise t.error(f'expected a non-empty array of host names, e.g. hosts = ["{at.cluster.hosts[0].name}"]; '
                      f"got {describe(value)}", name)
    out = []
    for v in value:
        h = check_host(t, name, v, at.cluster)
        if h in out:
            raise t.error(f"host {h!r} is listed twice", name)
        out.append(h)
    return tuple(out)


def driver_version(t: Table, name: str, value: Any, at: At) -> str:
    return t.string(name, pattern=r"\d+(\.\d+)*", shape='a driver version such as "450.80.02"')
