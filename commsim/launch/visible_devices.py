"""`--visible LIST`: one CUDA_VISIBLE_DEVICES for every rank, of any length and order, as a
user exports it before launching (`CUDA_VISIBLE_DEVICES=3,1 torchrun ...`).

Rules (CUDA C++ Programming Guide, "CUDA Environment Variables", CUDA_VISIBLE_DEVICES): the
process's device ordinals follow the list's order; "if one of the indices is invalid, only
the devices whose index precedes the invalid index are visible". An index the host has no
GPU for is invalid; a repeated index is taken as invalid too (UNCONFIRMED: the guide does not
say). NVML ignores the variable (row W1). torchrun numbers local ranks 0.. and a program
picks ordinal LOCAL_RANK, so local rank l drives the l-th visible GPU; with more ranks than
visible GPUs several processes share one (the placement wraps round). NCCL refuses two
ranks of one communicator on one GPU (NC10, scenario runs); the hosted torch.distributed
"nccl" backend, served in-process as gloo, does not model that refusal.
"""

from __future__ import annotations

import re

from commsim.errors import UserError

_LIST = re.compile(r"\d{1,4}(,\d{1,4})*")


def is_list(text: str) -> bool:
    return bool(_LIST.fullmatch(text))


def seen(text: str, gpu_count: int) -> tuple[int, ...]:
    """The host GPU indices a process with CUDA_VISIBLE_DEVICES=`text` sees, in ordinal order."""
    out: list[int] = []
    for i in (int(x) for x in text.split(",")):
        if i >= gpu_count or i in out:
            break                   # this index and every one after it are hidden
        out.append(i)
    return tuple(out)


def check(text: str, host: str, gpu_count: int) -> tuple[int, ...]:
    """`seen`, refusing a list that leaves a host no GPU at all (the run could place nothing)."""
    got = seen(text, gpu_count)
    if not got:
        raise UserError(f"--visible {text}: host {host} has GPUs 0..{gpu_count - 1}; the list's "
                        f"first index is not one of them, so CUDA would see no device there "
                        f"(it hides every index from the first invalid one on)")
    return got
