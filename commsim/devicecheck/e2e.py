"""End-to-end: commsim's Communicator on real GPUs, one process per GPU, under torchrun.

    torchrun --nproc-per-node=2 -m commsim.devicecheck.e2e                     # one host
    torchrun --nnodes=2 --nproc-per-node=4 --node-rank=R \\
        --rdzv-backend=c10d --rdzv-endpoint=HEAD:29500 -m commsim.devicecheck.e2e   # two GB200 trays

Every rank builds a CudaDriver on its LOCAL_RANK GPU and a Communicator over the
torch.distributed group of process mode (commsim.group.torch_dist, the store of the gloo
default group), under the simulator's default policy order (multicast and symm included:
their fds cross through the driver's FdChannel), runs each op for each size and dtype
against a float64 reference of every rank's input, prints the backend it chose and exits
non-zero on a wrong result.
Rank 0 prints one summary line per case and `e2e: N passed, M failed`.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _input(rank: int, n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    return (torch.rand(n, generator=g, dtype=torch.float64) - 0.5).to(dtype)


def _reference(op: str, xs: list[torch.Tensor], rank: int) -> torch.Tensor:
    if op == "all_gather":
        return torch.cat(xs).double()
    s = sum(x.double() for x in xs)
    return s.reshape(-1).chunk(len(xs))[rank] if op == "reduce_scatter" else s


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> bool:
    scale = max(1.0, float(b.abs().max())) if b.numel() else 1.0
    return a.shape == b.shape and bool(((a.double() - b).abs() <= TOL[dtype] * scale).all())


def default_order() -> tuple[str, ...]:
    """The simulator's default policy order (the backend registry's)."""
    from commsim.policy import Policy
    return tuple(Policy().order)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m commsim.devicecheck.e2e", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="4096,262144,2097152", help="bytes per rank, comma-separated")
    p.add_argument("--dtypes", default="float32,float16,bfloat16")
    p.add_argument("--ops", default="all_reduce,all_gather,reduce_scatter")
    p.add_argument("--order", default=",".join(default_order()),
                   help="backend order of the policy (default: the simulator's, %(default)s)")
    args = p.parse_args(argv)

    import torch.distributed as dist

    from commsim.communicator import Communicator
    from commsim.group.torch_dist import ProcessWorld
    from commsim.policy import Policy

    from device.driver import CudaDriver

    group = ProcessWorld.from_env().join()
    rank, ws = group.rank, group.size
    drv = CudaDriver.create(int(os.environ.get("LOCAL_RANK", "0")))
    comm = Communicator(group, drv, Policy(order=tuple(args.order.split(","))))
    if rank == 0:
        print(comm.explain(), flush=True)
    passed = failed = 0
    for op in args.ops.split(","):
        for dname in args.dtypes.split(","):
            dtype = DTYPES[dname]
            for size in map(int, args.sizes.split(",")):
                n = size // torch.empty(0, dtype=dtype).element_size()
                n -= n % ws
                xs = [_input(r, n, dtype, size) for r in range(ws)]
                y = getattr(comm, op)(xs[rank])
                ok = _close(y, _reference(op, xs, rank), dtype)
                oks = group.all_gather_object(ok, tag="e2e: results")
                if rank == 0:
                    print(f"{op:15s} {dname:9s} {size:>9d} B  {comm.chosen(op, n * xs[0].element_size(), dname)}"
                          f"  {'ok' if all(oks) else 'WRONG on ranks ' + str([i for i, o in enumerate(oks) if not o])}",
                          flush=True)
                passed, failed = (passed + 1, failed) if all(oks) else (passed, failed + 1)
    comm.close()
    dist.barrier()
    if rank == 0:
        print(f"e2e: {passed} passed, {failed} failed", flush=True)
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
