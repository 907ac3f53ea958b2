"""What a workload's message is, in elements and bytes: the sizes the oracle, the memory
estimate and the reference inputs (commsim.scenario.reference) agree on. Kept apart from the
reference, which builds torch tensors, so that the generator and the launcher of
`sweep --exec` size a message without importing torch."""

from __future__ import annotations

ESIZE = {"float32": 4, "float16": 2, "bfloat16": 2}     # bytes per element of each dtype
SHARED_MIN = 64 * 1024   # message bytes from which windows are page-aligned and the tape sealed


def message_numel(op: str, size: int, dtype: str, group_size: int) -> int:
    """The elements an op hands the communicator for a workload size in bytes: whole
    elements, at least one; a reduce-scatter's a multiple of the group size."""
    numel = max(size // ESIZE[dtype], 1)
    if op == "reduce_scatter":
        numel = max(numel // group_size, 1) * group_size
    return numel
