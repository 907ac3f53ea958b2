"""The exec launcher's part of a procs-mode run under `--launcher mpirun`: what mpirun's
runtime gives the ranks of a real job, a way to find each other.

It hosts the run's store (kvstore.StoreServer, 127.0.0.1 only, serving only clients that prove
they hold the run's secret), writes the secret into the private run directory (0600, created
exclusively, never through a link; it never goes through the store), tells each rank where the store is, and marks a rank dead on the store
(sealed, like every value) as soon as its process ends, so a peer waiting for it in a
collective or a receive learns it within commsim.group.torch_dist.POLL seconds instead of
waiting out the timeout.
"""

from __future__ import annotations

import os
import time

from commsim.group.seal import Seal, new_secret
from commsim.group.torch_dist import mark_dead
from commsim.launch.config import RunConfig
from commsim.hosting.wire.kvstore import StoreClient, StoreServer
from commsim.hosting.wire.ranks import SECRET_FILE, STORE_ENV, T0_ENV


class MpiRendezvous:
    def __init__(self, cfg: RunConfig) -> None:
        secret = new_secret()
        fd = os.open(os.path.join(cfg.run_dir, SECRET_FILE),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secret)
        self._seal = Seal(secret)
        self._server = StoreServer(secret)
        self._client = StoreClient("127.0.0.1", self._server.port, timeout=10.0, secret=secret)
        self._t0 = time.time()
        self._ended: set[int] = set()

    def env(self) -> dict[str, str]:
        return {STORE_ENV: f"127.0.0.1:{self._server.port}", T0_ENV: repr(self._t0)}

    def ended(self, rank: int, status: int) -> None:
        """Rank `rank`'s process has exited: its peers stop waiting for it."""
        if rank in self._ended:
            return
        self._ended.add(rank)
        how = f"its process exited with status {status}" if status >= 0 else \
            f"its process was killed by signal {-status}"
        mark_dead(self._client, rank, how, self._seal)

    def close(self) -> None:
        self._client.close()
        self._server.close()
