"""Says it is ready, then blocks in a system call for good (a read no one answers)."""

import os

r, w = os.pipe()
print("ready", flush=True)
os.read(r, 1)
