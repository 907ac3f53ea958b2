"""The seed of every random draw of the sweep: one 64-bit value per named stream and id, so a
scenario is rebuilt from its id alone and each draw (placement, faults, workload knobs, the
shortcut-policy knob) has a stream of its own, unmoved by the others."""

from __future__ import annotations

import hashlib


def seed_of(*parts: object) -> int:
    """A random.Random seed for the stream named by `parts` (e.g. "sample", seed, index)."""
    h = hashlib.sha256(":".join(map(str, ("commsim-sweep",) + parts)).encode()).digest()
    return int.from_bytes(h[:8], "little")
