"""commsim's device layer, the Driver protocol on real GPUs and nothing else:
CudaDriver (driver.py) over cuda-python, NVML (nvml.py), handle plumbing (handles.py), the
FdChannel over SCM_RIGHTS (fd_channel.py), host identity (host.py), and the collective kernels
as CUDA C (kernels/*.cu) compiled with NVRTC (build.py) and launched (launch.py). Tools that
use it live in commsim/probe/ and commsim/devicecheck/. Importing it needs no GPU; see
docs/device.md."""
