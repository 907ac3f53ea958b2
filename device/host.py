"""Host identity as a real process learns it: hostname, shm namespace, IMEX channels.

These are the non-CUDA facts discovery exchanges (a process learns nothing else); the simulator
answers the same questions from the topology (SimDriver.gethostname / shm_namespace /
imex_channels).
"""

from __future__ import annotations

import glob
import os
import re
import socket

IMEX_DIR = "/dev/nvidia-caps-imex-channels"


def gethostname() -> str:
    return socket.gethostname()


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _inode(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError:
        return "?"
    return f"{st.st_dev}:{st.st_ino}"


def shm_namespace() -> str:
    """Equal for exactly the processes that share POSIX shared memory (what vLLM's
    `in_the_same_node_as` tests, row F7): same kernel (boot id; a hostname is not
    enough, containers rename it), same IPC namespace, same /dev/shm mount."""
    boot = _read("/proc/sys/kernel/random/boot_id") or gethostname()
    try:
        ipc = os.readlink("/proc/self/ns/ipc")          # "ipc:[4026531839]"
    except OSError:
        ipc = "ipc:?"
    return f"{boot}/{ipc}/shm:{_inode('/dev/shm')}"


def imex_channels(directory: str = IMEX_DIR) -> tuple[int, ...]:
    """Numbers of the IMEX channel files this user can open for reading (the cuMemCreate
    FABRIC prerequisite, row V2). The device files are checked with access(2), not
    opened: opening is what CUDA does, and a probe should not hold one."""
    out = []
    for path in glob.glob(os.path.join(directory, "channel*")):
        m = re.fullmatch(r"channel(\d+)", os.path.basename(path))
        if m and os.access(path, os.R_OK):
            out.append(int(m.group(1)))
    return tuple(sorted(out))
