"""The ledger: what each simulated process holds, with the call site that created it.

Kinds: allocation (cudaMalloc), vmm_handle (cuMemCreate), imported_handle
(cuMemImportFromShareableHandle), ipc_mapping (cudaIpcOpenMemHandle, refcounted), vmm_mapping
(cuMemMap), reservation (cuMemAddressReserve), exported_fd (POSIX fd from export or received
over a socket), multicast (cuMulticastCreate or imported), multicast_binding, graph_buffer
(registered by a backend). Closing a communicator must bring it back to zero; a process exit
with residue is a leak, reported item by item.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from types import CodeType
from typing import Iterator

KINDS = ("allocation", "vmm_handle", "imported_handle", "ipc_mapping", "vmm_mapping",
         "reservation", "exported_fd", "multicast", "multicast_binding", "graph_buffer")

# Frames of the simulator and of the hosted surfaces (commsim/hosting) are skipped: the call
# site is the user's code that called cuda-python, libcudart, NVML or torch.cuda.
_SKIP = (os.sep + os.path.join("commsim", "sim") + os.sep, os.sep + "commsim" + os.sep + "driver.py",
         os.sep + os.path.join("commsim", "hosting") + os.sep, os.sep + "ctypes" + os.sep)


_INSIDE: dict[str, bool] = {}     # file name -> part of the simulator (asked once per file)


Where = tuple[str, CodeType, int] | str


def _site(depth: int) -> Where:
    """(file, code, instruction offset) of the first frame outside the simulator, unformatted.
    Its line is worked out only when read (`_format`): `f_lineno` walks the code's line
    table up to the offset, a microsecond in a long function, at every ledger item."""
    f = sys._getframe(depth + 1)
    while f is not None:
        code = f.f_code
        fn = code.co_filename
        inside = _INSIDE.get(fn)
        if inside is None:
            inside = _INSIDE[fn] = any(s in fn for s in _SKIP)
        if not inside:
            return fn, code, f.f_lasti
        f = f.f_back
    return "<unknown>"


def _line(code: CodeType, offset: int) -> int | None:
    """The source line of the instruction at `offset` in `code` (what the frame's f_lineno
    said there)."""
    if offset < 0:
        return code.co_firstlineno
    for start, end, line in code.co_lines():
        if start <= offset < end:
            return line
    return None


def _format(where: Where) -> str:
    if isinstance(where, str):
        return where
    fn, code, offset = where
    return f"{os.path.basename(fn)}:{_line(code, offset)} in {code.co_name}"


def call_site(depth: int = 2) -> str:
    """The first frame outside the simulator: where user (or backend) code made the call."""
    return _format(_site(depth))


@dataclass
class Item:
    kind: str
    key: object
    # What it is: `text` with `args` filled in by str.format when read, like its site (a run
    # records a few hundred items per scenario and a report reads the few left over).
    text: str
    args: tuple
    # Where it was created: "file:line in function", or that frame's parts, formatted only
    # when read (every allocation, mapping and handle of a run records one; few are read).
    where: Where
    refs: int = 1

    @property
    def detail(self) -> str:
        return self.text.format(*self.args) if self.args else self.text

    @property
    def site(self) -> str:
        return _format(self.where)

    def __getstate__(self) -> dict:
        # A code object does not pickle (a ledger crosses processes in the rig), nor need the
        # arguments: a copy carries its detail and site formatted.
        return {**self.__dict__, "text": self.detail, "args": (), "where": self.site}

    def __str__(self) -> str:
        rc = f" x{self.refs}" if self.refs > 1 else ""
        return f"{self.kind}{rc}: {self.detail} (created at {self.site})"


@dataclass
class Ledger:
    pid: int
    items: dict[tuple[str, object], Item] = field(default_factory=dict)

    def add(self, kind: str, key: object, detail: str, *args: object, site: str | None = None) -> Item:
        """Hold (kind, key), or one more reference to it. `detail` is a str.format template
        for `args`, filled in only when read."""
        assert kind in KINDS, kind
        k = (kind, key)
        it = self.items.get(k)
        if it is not None:
            it.refs += 1
            return it
        it = Item(kind, key, detail, args, site or _site(2))
        self.items[k] = it
        return it

    def remove(self, kind: str, key: object, all_refs: bool = False) -> None:
        k = (kind, key)
        it = self.items.get(k)
        if it is None:
            return
        it.refs -= 1
        if all_refs or it.refs <= 0:
            del self.items[k]

    def has(self, kind: str, key: object) -> bool:
        return (kind, key) in self.items

    def count(self, kind: str | None = None) -> int:
        return sum(it.refs for it in self.items.values() if kind is None or it.kind == kind)

    def __iter__(self) -> Iterator[Item]:
        return iter(list(self.items.values()))

    def summary(self) -> dict[str, int]:
        out = {k: 0 for k in KINDS}
        for it in self.items.values():
            out[it.kind] += it.refs
        return {k: v for k, v in out.items() if v}

    def report(self) -> str:
        if not self.items:
            return f"pid {self.pid}: nothing held"
        return "\n".join([f"pid {self.pid}: {self.count()} item(s) held"] +
                         [f"  {it}" for it in self.items.values()])
