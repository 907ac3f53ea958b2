"""Hits a CUDA error, then ends with os._exit(0): no cleanup, status 0."""

import os

from cuda.bindings import runtime as cudart

(err,) = cudart.cudaSetDevice(99)
print(f"cudaSetDevice(99): {int(err)}", flush=True)
os._exit(0)
