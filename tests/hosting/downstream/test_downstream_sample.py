"""A sample downstream test file, as a project using commsim would write it: its own
distributed tests, marked to run as ranks of a simulated machine (the commsim pytest plugin,
loaded by its pytest11 entry point). It runs in the suite."""

import socket

import pytest
import torch
import torch.distributed as dist


@pytest.mark.commsim(machine="gb200-nvl72:2", ranks=4)
def test_tensor_parallel_all_reduce(commsim_rank):
    dist.init_process_group("cpu:gloo,cuda:nccl")     # CPU tensors and objects: gloo
    t = torch.ones(8) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    assert t.tolist() == [10.0] * 8
    hosts = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    assert hosts == ["gb200-nvl72-tray00"] * 2 + ["gb200-nvl72-tray01"] * 2
    assert commsim_rank.host == hosts[dist.get_rank()]
    dist.destroy_process_group()


@pytest.mark.commsim(machine="hgx-h100-8", ranks=2, visible="one")
def test_one_gpu_per_rank(commsim_rank):
    import os
    assert os.environ["CUDA_VISIBLE_DEVICES"] == str(commsim_rank.rank)
    assert len(commsim_rank.visible) == 1


@pytest.mark.commsim(machine="hgx-h100-8", ranks=2)
def test_all_reduce_of_cuda_tensors(commsim_rank):
    dist.init_process_group("nccl")
    torch.cuda.set_device(dist.get_rank())
    inputs = [torch.randn(64, generator=torch.Generator().manual_seed(r)) for r in range(2)]
    x = inputs[dist.get_rank()].cuda()
    dist.all_reduce(x)
    assert x.device == torch.device("cuda", dist.get_rank())
    torch.testing.assert_close(x.cpu(), inputs[0] + inputs[1])
    dist.destroy_process_group()
