"""Install/uninstall pairs that nest: the bootstrap installs once per interpreter, a test may
install and uninstall around its own block; only the outermost pair does the work."""

from __future__ import annotations

import threading
from typing import Callable


def nested(install: Callable[[], None], uninstall: Callable[[], None]
           ) -> tuple[Callable[[], None], Callable[[], None]]:
    lock = threading.Lock()
    depth = [0]

    def do_install() -> None:
        with lock:
            depth[0] += 1
            if depth[0] == 1:
                install()

    def do_uninstall() -> None:
        with lock:
            if depth[0] == 0:
                return
            depth[0] -= 1
            if depth[0] == 0:
                uninstall()

    return do_install, do_uninstall
