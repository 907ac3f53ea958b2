"""Input and output files. Inputs (`read_input`): a regular file of bounded size, checked
before a byte is read. Outputs: checked before the work that fills them, written atomically
(a reader never sees half a file, and nothing is written on error).

Every verb that writes a file (`sweep --json/--html`, `explain --plot`, `topo import -o`,
`scenario new -o`) calls `check_output` first, before any long work, and refuses a missing
directory (it never creates one), a directory given as the file, an unwritable place, and an
existing file without --force.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from commsim.errors import UserError


# A scenario, a topology capture or a sweep's shard report is far smaller than this.
INPUT_LIMIT = 64 << 20


def _kind(mode: int) -> str:
    """What a path that is not a regular file is, in words."""
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a socket" if stat.S_ISSOCK(mode) else "not a regular file"


def read_input(path: str | os.PathLike[str], limit: int = INPUT_LIMIT) -> bytes:
    """The bytes of a file the user named. Opened without blocking (a FIFO would wait for a
    writer for good) and refused, before a byte is read, unless it is a regular file of at
    most `limit` bytes (/dev/zero never ends). A missing file or a directory raises the
    OSError the caller already names."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"{path}: is {_kind(st.st_mode)}; give a regular file")
        if st.st_size > limit:
            raise UserError(f"{path}: {st.st_size:,} bytes, more than the {limit:,} an input "
                            f"file may have")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:                        # it grew while being read
        raise UserError(f"{path}: more than the {limit:,} bytes an input file may have")
    return data


def check_output(path: str | os.PathLike[str], flag: str, overwrite: bool = True,
                 suffix: str | None = None) -> Path:
    """`path` as the file a verb will write, or UserError naming `flag`, the path and the fix."""
    out = Path(path)
    if suffix is not None and out.suffix.lower() != suffix:
        raise UserError(f"{flag} {out}: give a {suffix} file name")
    if out.is_dir():
        raise UserError(f"{flag} {out}: is a directory; give a file name inside it")
    try:
        st = os.stat(out)         # follows a symlink: what the write would replace
    except OSError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        # Writing moves a new file over the path: a FIFO, a socket or a device (as root,
        # /dev/zero itself) would be replaced, not written to.
        raise UserError(f"{flag} {out}: exists and is {_kind(st.st_mode)}; give the path of a "
                        f"regular file")
    parent = out.parent
    if not parent.is_dir():
        raise UserError(f"{flag} {out}: directory {parent} does not exist; create it first")
    try:     # a real probe: permission bits do not tell (root, read-only mounts, /proc)
        fd, probe = tempfile.mkstemp(dir=parent, prefix=f".{out.name}.", suffix=".probe")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UserError(f"{flag} {out}: cannot write in {parent} ({e.strerror}); choose "
                        f"another path") from None
    if out.exists() and not overwrite:
        raise UserError(f"{flag} {out}: already exists; pass --force to overwrite it")
    if out.exists() and not os.access(out, os.W_OK):
        raise UserError(f"{flag} {out}: exists and is not writable; choose another path")
    return out


@contextmanager
def atomic_path(path: str | os.PathLike[str], overwrite: bool = True) -> Iterator[Path]:
    """A temp file beside `path` for the caller to fill; moved into place when the block ends
    without error, removed otherwise. Without `overwrite`, an existing file is refused, also
    one that appears while writing (link() fails where rename would clobber it)."""
    out = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    except OSError as e:
        raise UserError(f"{out}: cannot write here: {e.strerror}; choose another path") from None
    os.close(fd)
    try:
        yield Path(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file ordinary permissions
        if overwrite:
            os.replace(tmp, out)
        else:
            try:
                os.link(tmp, out)
            except FileExistsError:
                raise UserError(f"{out}: already exists; pass --force to overwrite it") from None
            except OSError:        # no hard links on this file system
                os.replace(tmp, out)
    except OSError as e:
        raise UserError(f"{out}: cannot write: {e.strerror}; choose another path") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_atomic(path: str | os.PathLike[str], text: str, overwrite: bool = False) -> Path:
    """Write `text` to `path` atomically (see atomic_path)."""
    out = Path(path)
    if out.exists() and not overwrite:
        raise UserError(f"{out}: already exists; pass --force to overwrite it")
    with atomic_path(out, overwrite) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    return out
