"""Atomic file writes: a reader never sees half a file, and nothing is written on error."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import UserError


def write_atomic(path: str | os.PathLike[str], text: str, overwrite: bool = False) -> Path:
    """Write `text` to a temp file beside `path`, then move it into place. Without
    `overwrite`, an existing file is refused, also one that appears while writing (link()
    fails where rename would clobber it)."""
    out = Path(path)
    if out.exists() and not overwrite:
        raise UserError(f"{out}: already exists; pass --force to overwrite it")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
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
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out
