"""PyTorch behaviours that changed between releases, by the release that changed them.

What commsim serves for `torch.distributed._symmetric_memory` follows the run's PyTorch
version (`cluster.versions.torch`, commsim/versions.py), not the torch installed here: the
hosted program imports the installed torch's Python, and commsim's surface answers each call
as the release under simulation did. One row per change, with the pull request and the
release it first shipped in (PyTorch RELEASE.md's release cadence table gives each branch
cut: a change merged before a cut is in that release). docs/fidelity-rules.md, section
"Versions", lists the rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from commsim.versions import Versions


@dataclass(frozen=True)
class TorchChange:
    """A behaviour that holds from release `since` on (before it, the older behaviour)."""

    row: str
    since: tuple[int, int]
    what: str
    source: str


CHANGES: dict[str, TorchChange] = {c.row: c for c in (
    TorchChange(
        "TV1", (2, 11),
        "symm_mem.rendezvous no longer calls enable_symm_mem_for_group: before 2.11 a "
        "rendezvous registered the group, so is_symm_mem_enabled_for_group(group) was True "
        "after it; from 2.11 it stays False unless the deprecated call was made (async-TP and "
        "one-shot all-reduce lowering silently skip the group)",
        "pytorch/pytorch#172163 (merged 2026-01, after the 2.10 cut of Dec 2025, before the "
        "2.11 cut of 16 Feb 2026); the 2.10 __init__.py's rendezvous calls it; "
        "pytorch/pytorch#193027 reports the False; flashinfer-ai/flashinfer#2955 (a "
        "maintainer: 2.11 deprecates the call)"),
    TorchChange(
        "TV2", (2, 11),
        "enable_symm_mem_for_group warns FutureWarning (\"deprecated. There is no need to call "
        "this function anymore.\"); before 2.11 it is silent",
        "pytorch/pytorch#172163; the installed 2.13's __init__.py (@deprecated)"),
)}

# pytorch/pytorch#193115 (makes is_symm_mem_enabled_for_group True for any resolvable group)
# was opened 2026-08-12, after the 2.14 cut of 10 Aug 2026: 2.14 is served as 2.11-2.13.
# UNCONFIRMED: whether it was cherry-picked into 2.14 or merged at all.


def holds(versions: Versions, row: str) -> bool:
    """Whether the run's PyTorch release has change `row` (CHANGES)."""
    return tuple(versions.torch[:2]) >= CHANGES[row].since
