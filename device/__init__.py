"""commsim's device layer: the Driver protocol on real GPUs (CudaDriver), the collective
kernels as CUDA C compiled with NVRTC, `commsim probe`, the CUDA conformance rig and the
device check. Importing it needs no GPU; see docs/device.md."""
