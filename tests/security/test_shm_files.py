"""Found once: objects of 256 KiB and more went to predictable /dev/shm names without O_EXCL or
O_NOFOLLOW, mode 0644, and the IPC open markers were made with Path.touch(): symlinks planted
at those names made a run overwrite another file. Closed: a run's files live in a private
0700 directory with an unguessable name, each created O_CREAT|O_EXCL|O_NOFOLLOW, 0600; a
symlink planted at any name a run will use is refused, never followed."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from commsim.group.torch_dist import SHM_MIN, _obj_path, _put
from commsim.sim import shm
from commsim.sim.process_fabric import ProcessFabric, open_marker
from commsim.topology import build_preset

VICTIM_TEXT = "precious\n"


@pytest.fixture
def run_dir():
    prefix = shm.new_prefix()
    yield prefix
    shm.sweep(prefix)


@pytest.fixture
def victim(tmp_path):
    v = tmp_path / "victim"
    v.write_text(VICTIM_TEXT)
    v.chmod(0o644)
    return v


def untouched(v) -> bool:
    return v.read_text() == VICTIM_TEXT and stat.S_IMODE(v.stat().st_mode) == 0o644


class FakeStore:
    def __init__(self):
        self.kv = {}

    def set(self, k, v):
        self.kv[k] = v


def test_the_run_directory_is_private_and_unguessable(run_dir):
    st = os.lstat(shm.SHM_DIR / run_dir)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700
    assert st.st_uid == os.getuid()
    token = run_dir.rsplit("-", 1)[1]
    assert len(token) >= 32          # 128 random bits: nobody can plant at it in advance
    arr = shm.ShmMemory(run_dir).allocate(4096, "a1")
    assert stat.S_IMODE(os.stat(shm.segment_path(run_dir, "a1")).st_mode) == 0o600
    del arr


def test_a_symlink_at_the_run_directory_name_is_refused(victim, monkeypatch):
    planted = shm.SHM_DIR / f"{shm.PREFIX_HEAD}{os.getpid()}-{'ab' * 16}"
    monkeypatch.setattr(shm.secrets, "token_hex", lambda n: "ab" * 16)
    os.symlink(victim.parent, planted)
    try:
        with pytest.raises(FileExistsError):
            shm.new_prefix()
    finally:
        planted.unlink()
    assert untouched(victim)


@pytest.mark.parametrize("name", ["a7", "m9", "marker"])
def test_a_symlink_at_a_name_the_run_will_use_is_not_followed(run_dir, victim, name):
    """Each way a run creates a file: a device allocation, a multicast team table, a large
    object of a collective, an IPC open marker."""
    if name == "marker":
        path = str(open_marker(run_dir, 5, 1001))
    else:
        path = str(shm.segment_path(run_dir, name))
    os.symlink(victim, path)
    with pytest.raises(Exception) as info:
        if name == "a7":
            shm.ShmMemory(run_dir).allocate(1 << 20, "a7")
        elif name == "m9":
            fab = ProcessFabric(build_preset("hgx-h100-8"), 0, 0,
                                list(build_preset("hgx-h100-8").gpu_refs())[:2], run_dir)
            fab._next_mid = 9
            fab.new_multicast(fab.placement[0], 2, 1 << 21, 0)
        else:
            shm.touch(open_marker(run_dir, 5, 1001))
    assert isinstance(info.value, (OSError, MemoryError)), info.value
    assert untouched(victim)


def test_a_large_object_is_never_written_through_a_symlink(run_dir, victim):
    """A collective's object of SHM_MIN bytes or more goes to a file: the same key written
    twice replaces the run's own file, so a name that exists is unlinked, never written
    through, and the new file is created exclusively again."""
    path = _obj_path(run_dir, "g/world/0/1")
    os.symlink(victim, path)
    store = FakeStore()
    _put(store, "g/world/0/1", b"x" * SHM_MIN, run_dir)
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert untouched(victim)
    assert store.kv["g/world/0/1"].endswith(os.path.basename(path).encode())


def test_a_forged_run_directory_name_is_refused(tmp_path):
    """Under torchrun a rank learns the directory's name from the store: a name that is not a
    private directory of this user (another user's, a symlink, group-readable) is refused."""
    with pytest.raises(shm.UnsafeRunDir):
        shm.check_run_dir("../tmp")
    open_dir = shm.SHM_DIR / f"{shm.PREFIX_HEAD}{os.getpid()}-{'cd' * 16}"
    open_dir.mkdir(0o755)
    os.chmod(open_dir, 0o755)
    link = shm.SHM_DIR / f"{shm.PREFIX_HEAD}{os.getpid()}-{'ef' * 16}"
    os.symlink(tmp_path, link)
    try:
        for bad in (open_dir.name, link.name):
            with pytest.raises(shm.UnsafeRunDir):
                shm.check_run_dir(bad)
    finally:
        open_dir.rmdir()
        link.unlink()


def test_attach_does_not_follow_a_symlink(run_dir, victim):
    os.symlink(victim, shm.segment_path(run_dir, "a3"))
    assert shm.attach(run_dir, "a3", 4) is None
    assert untouched(victim)
