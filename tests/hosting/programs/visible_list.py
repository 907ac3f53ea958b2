"""What a rank sees under a CUDA_VISIBLE_DEVICES list: the count, and for each ordinal the
NVML index of the GPU with the same UUID (NVML ignores the variable, row W1). One RESULT
line per rank."""

import json
import os

import pynvml
import torch

pynvml.nvmlInit()
by_uuid = {pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)): i
           for i in range(pynvml.nvmlDeviceGetCount())}
n = torch.cuda.device_count()
order = [by_uuid["GPU-" + str(torch.cuda.get_device_properties(i).uuid)] for i in range(n)]
print("RESULT " + json.dumps({"rank": int(os.environ["RANK"]), "count": n, "order": order,
                              "env": os.environ.get("CUDA_VISIBLE_DEVICES"),
                              "nvml_count": pynvml.nvmlDeviceGetCount()}), flush=True)
