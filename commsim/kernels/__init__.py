"""Neutral kernel code: the workspace layout (`workspace`), the reference
collectives the simulator runs (`collectives`) and the context they run in (`context`).
device/kernels/*.cu mirror them; nothing here imports the simulator or the device binding.
"""
