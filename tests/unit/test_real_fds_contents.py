"""A POSIX-fd handle handed to another OS process by its bytes (real_fds.contents /
from_contents, used by hosted symm_mem in procs mode): the descriptor made from them imports
as the same memory, the import adopts it (it then holds a reference, as a received fd does),
and bytes that are no commsim handle are refused before any descriptor is made."""

from __future__ import annotations

import os

import pytest

from commsim.driver import alloc_prop, check
from commsim.sim import real_fds
from commsim.sim.driver import FD, SimDriver
from commsim.sim.fabric import SimFabric
from commsim.topology.model import GpuRef
from commsim.topology.presets import build


def test_a_descriptor_made_from_an_exports_bytes_imports_the_same_memory() -> None:
    cluster = build("hgx-h100-8")
    fabric = SimFabric(cluster)
    host = cluster.hosts[0]
    a, b = (SimDriver(fabric, fabric.spawn(host.name, [GpuRef(host.name, i)])) for i in (0, 1))
    h = check("cuMemCreate", a.cuMemCreate(1 << 21, alloc_prop(0, FD), 0))
    fd = check("cuMemExportToShareableHandle", a.cuMemExportToShareableHandle(h, FD, 0))
    data = real_fds.contents(fd)
    assert data.startswith(real_fds.MAGIC)
    got = real_fds.from_contents(data)
    assert got != fd and os.fstat(got).st_ino != os.fstat(fd).st_ino     # a descriptor of its own
    ih = check("cuMemImportFromShareableHandle", b.cuMemImportFromShareableHandle(got, FD))
    assert b.ledger.count("exported_fd") == 1                           # adopted by the import
    assert b.close_fd(got) == 0 and a.close_fd(fd) == 0
    check("cuMemRelease", b.cuMemRelease(ih))
    check("cuMemRelease", a.cuMemRelease(h))
    for d in (a, b):
        assert fabric.exit_process(d.proc.pid) == []
    assert not fabric.allocs                                            # the memory went


def test_bytes_that_are_no_handle_are_refused() -> None:
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(ValueError, match="not the contents of a commsim POSIX-fd handle"):
        real_fds.from_contents(b"\0" * 91)
    assert set(os.listdir("/proc/self/fd")) == before
