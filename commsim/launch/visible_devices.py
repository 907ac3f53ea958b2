"""`--visible LIST`: the CUDA_VISIBLE_DEVICES a rank's process gets, of any length and order,
as a user exports it before launching (`CUDA_VISIBLE_DEVICES=3,1 torchrun ...`), or one list
per rank (`"0,1;1,0;GPU-8932f937;3"`, as Ray or SLURM's --gpu-bind give each process its own).

Entries are indices or `GPU-` UUIDs (full or a unique prefix); the list ends at its first
invalid entry (sim/visibility.py states the rules and their source, the CUDA C++ Programming
Guide's CUDA_VISIBLE_DEVICES text). NVML ignores the variable (row W1). With one list for
all, torchrun numbers local ranks 0.. and a program picks ordinal LOCAL_RANK, so local rank l
drives the l-th visible GPU; with more ranks than visible GPUs several processes share one
(the placement wraps round). With a list per rank, each rank drives ordinal 0 of its own
list, as a process given its own devices does. NCCL refuses two ranks of one communicator
on one GPU (NC10, scenario runs); the hosted torch.distributed "nccl" backend, served
in-process as gloo, does not model that refusal.
"""

from __future__ import annotations

import re
from typing import Sequence

from commsim.errors import UserError
from commsim.sim import visibility

_LIST = re.compile(r"[A-Za-z0-9/\-]+(,[A-Za-z0-9/\-]+)*")
_WORDS = ("all", "one")


def is_list(text: str) -> bool:
    """A CUDA_VISIBLE_DEVICES list, or one per rank joined by ';'."""
    return text not in _WORDS and all(_LIST.fullmatch(part) for part in text.split(";"))


def lists(text: str) -> list[str]:
    """The per-rank lists of `text` (one element: the same list for every rank)."""
    return text.split(";")


host_uuids = visibility.host_uuids


def for_rank(text: str, rank: int) -> str:
    """The CUDA_VISIBLE_DEVICES rank `rank` gets."""
    parts = lists(text)
    return parts[0] if len(parts) == 1 else parts[rank]


def seen(text: str, uuids: Sequence[str]) -> tuple[int, ...]:
    """The host GPU indices a process with CUDA_VISIBLE_DEVICES=`text` sees, in ordinal
    order, on a host whose GPUs have `uuids`."""
    return visibility.cuda_visible(text, uuids)


def check(text: str, host: str, uuids: Sequence[str]) -> tuple[int, ...]:
    """`seen`, refusing a list that leaves a process no GPU at all (the run could place nothing)."""
    got = seen(text, uuids)
    if not got:
        raise UserError(f"--visible {text}: host {host} has GPUs 0..{len(uuids) - 1}; the list's "
                        f"first entry is not one of them, so CUDA would see no device there "
                        f"(it hides every entry from the first invalid one on)")
    return got
