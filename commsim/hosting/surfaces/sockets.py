"""Sockets between ranks: what in-process ranks cannot serve, found at the call.

In inproc mode the ranks are greenlets of one interpreter, switched by commsim's scheduler
only at the calls it serves. A rank that listens on a socket and waits in `accept()` for a
peer rank to connect blocks the whole interpreter in the OS: the peer never runs, and the
program's own timeout ends it unnamed. FlashInfer 0.7.2.post1 passes POSIX-fd memory handles
this way (`flashinfer/comm/fd_exchange.py`: `exchange_fds` binds and listens on an AF_UNIX
stream socket per rank, peers connect and send the fd with SCM_RIGHTS; `broadcast_fd` and
the SOCK_DGRAM helpers use `sendmsg`/`recvmsg`). Such a program needs real processes.

So in a hosted inproc rank, the calls declared in `BETWEEN_RANKS` raise `NeedsProcesses`
(a BaseException: the program's `except Exception` does not swallow it) naming the call and
where the program made it; the inproc runner ends the run and `commsim exec` runs it again
in procs mode, saying so in the verdict. A socket that only finds a free port (`bind` to
port 0, then close: vLLM's `get_open_port`) or talks to a server outside the run
(`connect` over TCP) is not stopped. Outside an inproc rank every call is the real one.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

from commsim.hosting.install.patches import Patches
from commsim.hosting.install.registry import register_surface
from commsim.hosting.state.session import hosted

_INET = (socket.AF_INET, socket.AF_INET6)
# socket.socket method -> the address families on which it means a peer rank on the other
# end: a listening server waits for a rank to connect; an AF_UNIX connect or message
# reaches a rank's socket file (on one host; an fd passed with SCM_RIGHTS).
BETWEEN_RANKS: dict[str, tuple[int, ...]] = {
    "listen": (socket.AF_UNIX, *_INET),
    "accept": (socket.AF_UNIX, *_INET),
    "connect": (socket.AF_UNIX,),
    "sendmsg": (socket.AF_UNIX,),
    "recvmsg": (socket.AF_UNIX,),
    "recvfrom": (socket.AF_UNIX,),
    "sendto": (socket.AF_UNIX,),
}
_FAMILY = {socket.AF_UNIX: "AF_UNIX", socket.AF_INET: "AF_INET", socket.AF_INET6: "AF_INET6"}


BLOCKING_SOCKETS = "blocking sockets between ranks need real processes"


class NeedsProcesses(BaseException):
    """An inproc rank made a call that only real processes can serve (a socket between ranks,
    or another cause `why` names)."""

    def __init__(self, call: str, site: str, why: str = BLOCKING_SOCKETS) -> None:
        super().__init__(f"commsim hosting: {call} at {site}: {why} (--mode procs)")
        self.call = call
        self.site = site
        self.why = why


def call_site(skip: tuple[str, ...] = (__file__, socket.__file__)) -> str:
    """Where the program made the call: the first frame outside `skip` (this module and
    socket.py)."""
    f = sys._getframe(2)
    while f is not None and f.f_code.co_filename in skip:
        f = f.f_back
    if f is None:
        return "?"
    return f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno} in {f.f_code.co_name}"


def _guarded(name: str, families: tuple[int, ...], real: Any) -> Any:
    def call(self: socket.socket, *args: Any, **kwargs: Any) -> Any:
        r = hosted()
        if r is not None and r.mode == "inproc" and self.family in families:
            raise NeedsProcesses(f"socket.{name}({_FAMILY[self.family]})", call_site())
        return real(self, *args, **kwargs)
    call.__name__ = call.__qualname__ = name
    call.__doc__ = real.__doc__
    return call


def _install(patches: Patches) -> None:
    for name, families in BETWEEN_RANKS.items():
        patches.attr(socket.socket, name, _guarded(name, families, getattr(socket.socket, name)))


SURFACE = register_surface("sockets", _install)
install, uninstall = SURFACE.install, SURFACE.uninstall
