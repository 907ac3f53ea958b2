"""What a rank reads of the run's versions: NVML's driver version and CUDA driver version,
the CUDA runtime and driver versions of cuda-python. One RESULT line per rank."""

import json
import os

import pynvml
from cuda.bindings import runtime as rt

pynvml.nvmlInit()
err, runtime = rt.cudaRuntimeGetVersion()
err2, driver_cuda = rt.cudaDriverGetVersion()
print("RESULT " + json.dumps({
    "rank": int(os.environ["RANK"]), "nvml_driver": pynvml.nvmlSystemGetDriverVersion(),
    "nvml_cuda": pynvml.nvmlSystemGetCudaDriverVersion(), "runtime": int(runtime),
    "driver_cuda": int(driver_cuda), "errors": [int(err), int(err2)]}), flush=True)
pynvml.nvmlShutdown()
