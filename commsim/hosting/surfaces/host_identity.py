"""Host identity surface: the hostname, the /dev/shm and the pid a hosted process observes.

- `socket.gethostname`, `os.uname().nodename`, `platform.node()` / `platform.uname().node`
  give the rank's simulated host (the topology's host name), so "same node" checks that
  compare hostnames see two trays as two nodes.
- POSIX shared memory (`multiprocessing.shared_memory`, through `_posixshmem.shm_open` /
  `shm_unlink`) lives in the host's private directory `<run dir>/shm/<namespace>`: processes
  of one simulated host share it, another host's processes cannot open its segments, as two
  OS instances do not share /dev/shm (reference section 4.3; vLLM's same-node probe relies on it).
- `os.getpid()`: in inproc mode ranks share one OS process, so each rank sees its simulated
  pid (1000 + ...); in procs mode every rank is a real process and keeps its real pid.

Outside a hosted rank every call is the real one.
"""

from __future__ import annotations

import errno
import os
import platform
import socket
import sys
from typing import Any

import _posixshmem          # CPython's shm_open/shm_unlink, which multiprocessing calls

from commsim.hosting.state.session import hosted
from commsim.hosting.install.patches import Patches
from commsim.hosting.install.registry import register_surface

_real: dict[str, Any] = {}


def _gethostname() -> str:
    r = hosted()
    return r.host if r is not None else _real["gethostname"]()


def _uname() -> Any:
    u = _real["uname"]()
    r = hosted()
    if r is None:
        return u
    return os.uname_result((u.sysname, r.host, u.release, u.version, u.machine))


def _platform_uname() -> Any:
    u = _real["platform.uname"]()
    r = hosted()
    if r is None:
        return u
    return platform.uname_result(u.system, r.host, u.release, u.version, u.machine)


def _platform_node() -> str:
    r = hosted()
    return r.host if r is not None else _real["platform.node"]()


def _getpid() -> int:
    r = hosted()
    if r is not None and r.mode == "inproc" and r.pid:
        # multiprocessing keeps its books (children, finalizers) by the real pid
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if not caller.startswith(("multiprocessing", "concurrent", "torch.multiprocessing")):
            return r.pid
    return _real["getpid"]()


def shm_path(shm_dir: str, name: str) -> str:
    """Where a POSIX shm name lives for a host: one leading '/', no other '/' (shm_open(3))."""
    base = name[1:] if name.startswith("/") else name
    if not base or "/" in base or base in (".", ".."):
        raise OSError(errno.EINVAL, f"Invalid argument: {name!r}")
    return os.path.join(shm_dir, base)


def _shm_open(path: str, flags: int, mode: int = 0o777) -> int:
    r = hosted()
    if r is None:
        return _real["shm_open"](path, flags, mode)
    # O_NOFOLLOW: a link planted in the directory is never followed (the dir is 0700 anyway).
    return os.open(shm_path(r.shm_dir, path), flags | os.O_NOFOLLOW, mode & 0o777)


def _shm_unlink(path: str) -> None:
    r = hosted()
    if r is None:
        return _real["shm_unlink"](path)
    os.unlink(shm_path(r.shm_dir, path))


def _patch(patches: Patches) -> None:
    for target, name, fake in ((socket, "gethostname", _gethostname), (os, "uname", _uname),
                               (os, "getpid", _getpid), (_posixshmem, "shm_open", _shm_open),
                               (_posixshmem, "shm_unlink", _shm_unlink)):
        _real[name] = patches.attr(target, name, fake)
    _real["platform.uname"] = patches.attr(platform, "uname", _platform_uname)
    _real["platform.node"] = patches.attr(platform, "node", _platform_node)


register_surface("identity", _patch)
