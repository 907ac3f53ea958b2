"""A PyTorch symmetric-memory all-reduce written the way vLLM's SymmMemCommunicator and
PyTorch users write it: a torchrun program, nothing commsim-specific.

Each rank allocates a symmetric buffer, rendezvouses it over a group, checks the handle,
writes peer-visible data, and runs one_shot_all_reduce, two_shot_all_reduce_ and (where the
handle has a multicast address, as vLLM checks) multimem_all_reduce_ on a slice of the
buffer, printing one RESULT line of JSON. With `--expect-fail` a failed rendezvous is
reported as a RESULT (its error text) instead of ending the rank.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    group = dist.new_group(list(range(world)))
    device = torch.device(f"cuda:{local}")
    out = {"rank": rank, "nvshmem": symm_mem.is_nvshmem_available()}

    n = 1024
    buf = symm_mem.empty(n, dtype=torch.bfloat16, device=device)
    buf.zero_()
    try:
        handle = symm_mem.rendezvous(buf, group.group_name)
    except RuntimeError as e:
        if "--expect-fail" not in sys.argv:
            raise
        out["error"] = str(e)
        print("RESULT " + json.dumps(out), flush=True)
        return
    handle.barrier()
    out.update(world=handle.world_size, me=handle.rank, multicast=handle.multicast_ptr != 0,
               own_ptr_ok=handle.buffer_ptrs[handle.rank] == buf.data_ptr(),
               distinct=len(set(handle.buffer_ptrs)) == world,
               buffer_size=handle.buffer_size, pad_size=handle.signal_pad_size)

    # Peer-visible: every rank writes its rank, then reads its right neighbour's buffer.
    buf.fill_(float(rank))
    handle.barrier()
    right = (rank + 1) % world
    out["peer_value"] = handle.get_buffer(right, [4], torch.bfloat16).float().tolist()
    handle.barrier()

    # one_shot_all_reduce into a new tensor (vLLM's smaller-size path, PyTorch's default op).
    # (inputs below 256 are exact in bfloat16; the sums are rounded to it once.)
    k = 128
    buf[:k].copy_(torch.arange(k, dtype=torch.bfloat16).to(device) + rank)
    red = torch.ops.symm_mem.one_shot_all_reduce(buf[:k], "sum", group.group_name)
    expect = torch.arange(k, dtype=torch.float32) * world + sum(range(world))
    out["one_shot"] = bool(torch.equal(red.float().cpu(), expect.to(torch.bfloat16).float()))
    out["one_shot_device"] = str(red.device)

    m = 256
    # two_shot_all_reduce_ in place on a slice of the buffer (vLLM's SymmMemCommunicator).
    inp = torch.full((m,), float(rank + 1), dtype=torch.bfloat16, device=device)
    buf[:m].copy_(inp)
    torch.ops.symm_mem.two_shot_all_reduce_(buf[:m], "sum", group.group_name)
    total = world * (world + 1) / 2
    out["two_shot"] = buf[:m].float().cpu().tolist() == [total] * m

    if handle.multicast_ptr != 0:
        buf[:m].fill_(2.0)
        torch.ops.symm_mem.multimem_all_reduce_(buf[:m], "sum", group.group_name)
        out["multimem"] = buf[:m].float().cpu().tolist() == [2.0 * world] * m
    else:
        try:
            torch.ops.symm_mem.multimem_all_reduce_(buf[:m], "sum", group.group_name)
            out["multimem"] = "ran without multicast"
        except RuntimeError as e:
            out["multimem"] = str(e)
    if "--misuse" in sys.argv:
        out["misuse"] = misuse(group, buf, device)
    print("RESULT " + json.dumps(out), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def misuse(group, buf, device) -> dict:
    """What PyTorch answers to calls it refuses, as text (type: message)."""
    def err(fn):
        try:
            fn()
            return "no error"
        except Exception as e:  # noqa: BLE001 - the answer is the point
            return f"{type(e).__name__}: {e}"
    name = group.group_name
    plain = torch.zeros(64, dtype=torch.bfloat16, device=device)
    half = symm_mem.empty(64, dtype=torch.float16, device=device)
    h = symm_mem.rendezvous(buf, name)
    return {
        "plain_rendezvous": symm_mem.rendezvous(plain, name) is None,
        "bad_group": err(lambda: symm_mem.rendezvous(buf, 42)),
        "plain_op": err(lambda: torch.ops.symm_mem.one_shot_all_reduce(plain, "sum", name)),
        "max_op": err(lambda: torch.ops.symm_mem.two_shot_all_reduce_(buf[:64], "max", name)),
        "half_op": err(lambda: torch.ops.symm_mem.one_shot_all_reduce(half, "sum", name)),
        "odd_size": err(lambda: torch.ops.symm_mem.one_shot_all_reduce(buf[:3], "sum", name)),
        "cpu_empty": err(lambda: symm_mem.empty(4, device="cpu")),
        "too_big": err(lambda: h.get_buffer(0, [4096], torch.bfloat16)),
        "is_symm": [symm_mem.is_symm_mem_tensor(buf), symm_mem.is_symm_mem_tensor(plain)],
        "not_simulated": err(lambda: symm_mem.get_mem_pool(device)),
    }


if __name__ == "__main__":
    main()
