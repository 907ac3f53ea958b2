"""Device memory of a simulated GPU backed by POSIX shared memory (/dev/shm), for process mode.

Every run owns one private directory, `/dev/shm/commsim-<launcher pid>-<random>` (mode 0700,
created exclusively, so no other user can plant or read a segment there). Every allocation is
one file in it named by its tag (the allocation id), so an importer in another process finds the segment from the handle
bytes alone; every file is created O_CREAT|O_EXCL|O_NOFOLLOW, 0600, so a name planted
beforehand is refused, never followed. The directory's name is the run's "prefix"; the pid in
it says which launcher owns the run, so a later run (or `commsim clean`) removes the
directories of launchers that died without cleaning up (SIGKILL). A mapping outlives the
segment's name (POSIX shm_unlink semantics): the exporter unlinking at free does not pull the
bytes from under an importer that still maps them, which is also what the ledger then reports.
"""

from __future__ import annotations

import mmap
import os
import re
import secrets
import shutil
import stat
from pathlib import Path

import numpy as np

from commsim.util.pids import pid_alive

SHM_DIR = Path("/dev/shm")
PREFIX_HEAD = "commsim-"
_RUN_NAME = re.compile(rf"^{PREFIX_HEAD}(\d+)-[0-9a-f]+")
CREATE = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW


class UnsafeRunDir(OSError):
    """A run directory that is not ours alone (a symlink, another owner, group/other access)."""


def new_prefix() -> str:
    """Create a fresh private run directory and return its name (`commsim-<pid>-<random>`:
    128 random bits, so nobody can plant anything at it in advance)."""
    name = f"{PREFIX_HEAD}{os.getpid()}-{secrets.token_hex(16)}"
    os.mkdir(SHM_DIR / name, 0o700)    # fails on any existing name, a symlink included
    check_run_dir(name)
    return name


def check_run_dir(prefix: str) -> Path:
    """The run directory `prefix`, refused unless it is a real directory owned by this user
    that no one else can enter (a rank under torchrun learns the name from the store)."""
    if "/" in prefix or not _RUN_NAME.match(prefix):
        raise UnsafeRunDir(f"{prefix!r} is not a commsim run directory name")
    path = SHM_DIR / prefix
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise UnsafeRunDir(f"{path}: not a private directory of this user (mode "
                           f"{stat.filemode(st.st_mode)}, uid {st.st_uid})")
    return path


def segment_path(prefix: str, tag: str) -> Path:
    return SHM_DIR / prefix / tag


def create(path: Path, size: int) -> int:
    """An fd of a new file of `size` bytes: exclusive, 0600, never through a symlink."""
    fd = os.open(path, CREATE, 0o600)
    try:
        os.ftruncate(fd, size)
    except OSError:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    return fd


def touch(path: Path) -> None:
    """Create an empty marker file exclusively (an existing regular one is kept)."""
    try:
        os.close(os.open(path, CREATE, 0o600))
    except FileExistsError:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            raise


def _as_array(fd: int, size: int) -> np.ndarray:
    # mmap refuses length 0; a 0-byte cudaMalloc still needs a distinct object, so map one byte
    # and hand out an empty view of it.
    mm = mmap.mmap(fd, max(size, 1))
    return np.frombuffer(mm, dtype=np.uint8)[:size]


def attach(prefix: str, tag: str, size: int) -> np.ndarray | None:
    """Map an existing segment (an import in another process); None when it no longer exists
    (its exporter freed it), is smaller than the handle says, or is not a plain file."""
    try:
        fd = os.open(segment_path(prefix, tag), os.O_RDWR | os.O_NOFOLLOW)
    except (FileNotFoundError, OSError):
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size < max(size, 1):
            return None
        return _as_array(fd, size)
    finally:
        os.close(fd)   # the mapping keeps the segment alive; the fd is not needed


def exists(prefix: str, tag: str) -> bool:
    return segment_path(prefix, tag).exists()


def segments(prefix: str) -> list[Path]:
    """Every run directory whose name starts with `prefix`, and every file in them (what a
    sweep would remove)."""
    out: list[Path] = []
    for d in sorted(SHM_DIR.glob(f"{prefix}*")):
        out.append(d)
        if d.is_dir() and not d.is_symlink():
            out += sorted(d.iterdir())
    return out


def sweep(prefix: str) -> list[str]:
    """Remove a run's directory and every segment in it; returns the names removed. Safe
    after any failure: mappings held by still-living processes stay valid, only the names
    go."""
    path = SHM_DIR / prefix
    try:
        names = [p.name for p in path.iterdir()]
    except FileNotFoundError:
        return []
    shutil.rmtree(path, ignore_errors=True)
    return names


def sweep_stale() -> list[str]:
    """Remove what runs of this user left in /dev/shm when their launcher died without
    cleaning up (SIGKILL): every `commsim-<pid>-*` entry owned by this user whose pid is
    gone. Another user's files and live runs are never touched. Returns the names removed."""
    removed = []
    for p in SHM_DIR.glob(f"{PREFIX_HEAD}*"):
        m = _RUN_NAME.match(p.name)
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        if m is None or st.st_uid != os.getuid() or pid_alive(int(m.group(1))):
            continue
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(p, ignore_errors=True)
        else:                       # a flat segment of an older commsim
            p.unlink(missing_ok=True)
        removed.append(p.name)
    return removed


class ShmMemory:
    """MemoryProvider (commsim.sim.fabric) whose allocations are files of the run directory."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def allocate(self, size: int, tag: str) -> np.ndarray:
        path = segment_path(self.prefix, tag)
        try:
            fd = create(path, max(size, 1))
        except OSError as e:
            # /dev/shm full or the name taken: the GPU would answer out-of-memory.
            raise MemoryError(f"shm segment {path}: {e}") from e
        try:
            return _as_array(fd, size)
        except OSError as e:
            path.unlink(missing_ok=True)
            raise MemoryError(f"shm segment {path}: {e}") from e
        finally:
            os.close(fd)

    def release(self, array: np.ndarray, tag: str) -> None:
        segment_path(self.prefix, tag).unlink(missing_ok=True)

    # Shared memory other processes map: plain copies, never remapped pages.
    def copy_in(self, dst: np.ndarray, src: np.ndarray) -> None:
        np.copyto(dst, src)

    def broadcast(self, dsts: list[np.ndarray], src: np.ndarray) -> None:
        for d in dsts:
            np.copyto(d, src)

    def canonical(self, view: np.ndarray) -> None:
        return None

    def read_copy(self, view: np.ndarray) -> np.ndarray:
        return view.copy()
