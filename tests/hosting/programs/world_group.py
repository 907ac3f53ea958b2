"""The default group as serving stacks reach it: dist.group.WORLD, GroupMember.WORLD and
distributed_c10d._get_default_group(). One RESULT line."""

import json

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

before = dist.group.WORLD
dist.init_process_group(backend="nccl")
world = dist.group.WORLD
print("RESULT " + json.dumps({
    "rank": dist.get_rank(), "before": before is None,
    "same": world is dist.GroupMember.WORLD and world is c10d._get_default_group(),
    "size": dist.get_world_size(world), "group_rank": world.rank(),
    "named": isinstance(world.group_name, str) and bool(world.group_name),
    "is_process_group": isinstance(world, dist.ProcessGroup),
    "sub_is_process_group": isinstance(dist.new_group([0, 1]), dist.ProcessGroup)}))
dist.destroy_process_group()
