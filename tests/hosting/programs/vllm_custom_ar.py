"""vLLM's own tensor-parallel communicators built as its GPU worker builds them
(vllm/distributed/device_communicators/cuda_communicator.py, vLLM 0.33.0): a gloo CPU group
beside the NCCL world, `PyNcclCommunicator(group=cpu_group, device=device)` and, while
custom all-reduce is enabled (`set_custom_all_reduce`, what `disable_custom_all_reduce`
sets), `CustomAllreduce(group=cpu_group, device=device, symm_mem_enabled=False,
register_graph_buffers=True)`. An all-reduce goes where CudaCommunicator.all_reduce sends it
(custom all-reduce when `should_custom_ar`, else pynccl), once eagerly and once inside a CUDA
graph captured under `ca.capture()` (vLLM's graph_capture), then replayed.

    python vllm_custom_ar.py [--disable-custom-all-reduce] [--graph] [--no-eager] [--numel N]
                             [--dtype D] [--check]

--no-eager captures without an eager all-reduce first (vLLM's profile_cudagraph_memory, where
vllm-project/vllm#52778 first aborts).

Prints one RESULT line per rank: which communicator ran, whether custom all-reduce was
disabled or kept to MNNVL collectives only (`mnnvl_only`, a group spanning nodes; None
where the release has no such attribute), and whether every result equals the exact sum.
--check: exit 1 on a rank whose result is not exact (so a verdict alone says it, as the
mode-agreement harness compares verdicts).
"""

import json
import os
import sys

import torch
import torch.distributed as dist

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def arg(name: str, default: str) -> str:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def main() -> None:
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"]) % max(torch.cuda.device_count(), 1)
    device = torch.device(f"cuda:{local_rank}")
    torch.cuda.set_device(device)

    from vllm.distributed import parallel_state
    parallel_state.set_custom_all_reduce("--disable-custom-all-reduce" not in sys.argv)
    from vllm.distributed.device_communicators.custom_all_reduce import CustomAllreduce
    from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator

    cpu_group = dist.new_group(list(range(world)), backend="gloo")
    same_node = parallel_state.in_the_same_node_as(cpu_group, source_rank=0)
    pynccl = PyNcclCommunicator(group=cpu_group, device=device)
    ca = None
    if parallel_state._ENABLE_CUSTOM_ALL_REDUCE:
        ca = CustomAllreduce(group=cpu_group, device=device, symm_mem_enabled=False,
                             register_graph_buffers=True)

    used = []

    def all_reduce(x: torch.Tensor) -> torch.Tensor:
        # CudaCommunicator.all_reduce: custom all-reduce when it takes the input, else pynccl.
        if ca is not None and not ca.disabled and ca.should_custom_ar(x):
            out = ca.custom_all_reduce(x)
            if out is not None:
                used.append("custom")
                return out
        used.append("pynccl")
        return pynccl.all_reduce(x)

    numel = int(arg("--numel", "4096"))
    dtype = DTYPES[arg("--dtype", "bfloat16")]
    x = torch.arange(numel, device=device).to(dtype) % 7 + rank
    want = sum((torch.arange(numel).to(dtype) % 7 + r).float() for r in range(world))
    checks = [] if "--no-eager" in sys.argv else [all_reduce(x)]
    if "--graph" in sys.argv:
        stream = torch.cuda.Stream()
        ctx = ca.capture() if ca is not None and not ca.disabled else None
        if ctx is not None:
            ctx.__enter__()
        try:
            with torch.cuda.stream(stream):
                all_reduce(x)                       # warm-up, as vLLM's capture does
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, stream=stream):
                    y = all_reduce(x)
        finally:
            if ctx is not None:
                ctx.__exit__(None, None, None)
        g.replay()
        torch.cuda.synchronize()
        checks.append(y)
    exact = all(bool((c.float().cpu() == want).all()) for c in checks)
    if ca is not None:
        ca.close()
    print("RESULT " + json.dumps({"rank": rank, "used": used, "exact": exact,
                                  "same_node": same_node,
                                  "ca_disabled": None if ca is None else ca.disabled,
                                  "mnnvl_only": getattr(ca, "mnnvl_only", None)}), flush=True)
    dist.destroy_process_group()
    if "--check" in sys.argv and not exact:
        sys.exit(1)


if __name__ == "__main__":
    main()
