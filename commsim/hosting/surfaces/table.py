"""The surface table: one entry per surface module, saying which foreign module it answers and,
per function, what is served and what is a loud not-simulated stand-in.

The per-function lists are read from each surface module's own declarations (the dicts and
tuples its install code patches from), so the table cannot drift from the code. The registry
installs the modules listed here (the launcher passes `MODULES` to `install_all`),
`docs/hosting-surfaces.md` carries the table as `docs_table()` prints it (a test compares),
and the tests enumerate surfaces from it. `python -m commsim.hosting.surfaces.table` prints
the table, `--write` rewrites it in the doc.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterable, Iterator, Mapping

from commsim.hosting.install import dispatch

Names = Mapping[str, Iterable[str]]     # foreign module -> names


@dataclass(frozen=True)
class Entry:
    module: str                          # the commsim surface module
    answers: str                         # what of the foreign package it answers
    served: Callable[[ModuleType], Names]
    not_simulated: Callable[[ModuleType], Names] = lambda m: {}
    others: str = "the real module's"    # what every other name of it does
    needs_launcher: bool = False         # only a launched run installs it (not tests' sim_ranks)


def _keys(d: Mapping[str, object]) -> list[str]:
    return sorted(d)


def _mpi_served(m: ModuleType) -> Names:
    return {name: sorted(k for k in vars(mod) if not k.startswith("_") and k != "__path__")
            for name, mod in m._MODULES.items()}


# The code of every stand-in dispatch.not_simulated makes: how a declared stand-in is told
# from a served function.
_STANDIN_CODE = dispatch.not_simulated("").__code__


def _accelerator(m: ModuleType, served: bool) -> Names:
    names = {**m.HOSTED, **m.CLASSES}
    stand = {n for n, f in names.items() if getattr(f, "__code__", None) is _STANDIN_CODE}
    return {"torch.accelerator": sorted(set(names) - stand if served else stand)}


def _extension(e: Any) -> str:
    """A compiled extension's row key: its module at its library's version range."""
    lo, hi = e.versions
    return f"{e.module} ({e.library} >={lo},<{hi})"


_PKG = "commsim.hosting.surfaces"
TABLE: tuple[Entry, ...] = (
    Entry(f"{_PKG}.host_identity", "the host a rank runs on, its pid and its /dev/shm",
          lambda m: {"socket": ["gethostname"], "os": ["getpid", "uname"],
                     "platform": ["node", "uname"], "_posixshmem": ["shm_open", "shm_unlink"]},
          needs_launcher=True),
    Entry(f"{_PKG}.torch_distributed.inproc", "torch.distributed for in-process ranks",
          lambda m: {"torch.distributed": _keys(m.SERVED)},
          lambda m: {"torch.distributed": sorted(set(m.NOT_SIMULATED) - set(m.SERVED))},
          needs_launcher=True),
    Entry(f"{_PKG}.torch_distributed.procs", "torch.distributed for process ranks (real gloo)",
          lambda m: {"torch.distributed": sorted(["init_process_group", "new_group", *m.TENSOR_CALLS])},
          needs_launcher=True),
    Entry(f"{_PKG}.cuda.bindings", "cuda-python (cuda.bindings.runtime / .driver, cuda.cudart / "
          "cuda.cuda of 12.x)",
          lambda m: {m.RUNTIME: sorted(m.cuda_runtime_api.SIMULATED),
                     m.DRIVER: sorted({*m.cuda_driver_api.SIMULATED, *m.cuda_driver_vmm.SIMULATED})},
          others="an API function: not simulated, raising NotImplementedError; the binding's "
                 "types, enums and constants: the real ones"),
    Entry(f"{_PKG}.cuda.cudart", "libcudart.so through ctypes",
          lambda m: {"libcudart": sorted(m.SIMULATED)},
          others="any other runtime symbol: not simulated; an unknown symbol: ctypes' AttributeError"),
    Entry(f"{_PKG}.nvml", "libnvidia-ml through ctypes (pynvml)",
          lambda m: {"libnvidia-ml": sorted(m.SIMULATED)},
          others="any other nvml* symbol: not simulated"),
    Entry(f"{_PKG}.torch.cuda", "torch.cuda of a CPU build",
          lambda m: {"torch.cuda": sorted(m.SIMULATED)},
          lambda m: {"torch.cuda": sorted(m._UNSIMULATED_CLASSES)},
          others="any other public torch.cuda function: not simulated, in a hosted rank"),
    Entry(f"{_PKG}.torch.compiled", "torch._C's CUDA and NCCL calls of a CUDA build (none in a CPU build)",
          lambda m: {"torch._C": _keys(m.SERVED)},
          lambda m: {"torch._C": sorted(m.NOT_SIMULATED)},
          others="the build's own (host-side settings)"),
    Entry(f"{_PKG}.torch.factories", "CUDA tensors: factories and ops with device='cuda'",
          lambda m: {"aten (CUDA key)": sorted(m._CUDA_FACTORIES)},
          others="every PyTorch op on a hosted CUDA tensor runs on its CPU bytes; an op of "
                 "another namespace: not simulated"),
    Entry(f"{_PKG}.torch.ipc", "CUDA tensors between processes (torch.multiprocessing)",
          lambda m: {"torch.multiprocessing.reductions": ["rebuild_cuda_tensor", "reduce_tensor"]}),
    Entry(f"{_PKG}.torch.nvtx", "torch.cuda.nvtx ranges",
          lambda m: {"torch.cuda.nvtx": ["_nvtx"]}),
    Entry(f"{_PKG}.torch.accelerator", "torch.accelerator",
          lambda m: _accelerator(m, True), lambda m: _accelerator(m, False)),
    Entry(f"{_PKG}.mpi.mpi4py", "mpi4py (where installed, and under --launcher mpirun)",
          _mpi_served,
          lambda m: {"mpi4py.MPI": sorted(m.MPI_NAMES), "mpi4py.MPI.Comm": sorted(m.mpi_comm.COMM_NAMES)},
          others="AttributeError, as a module without the name", needs_launcher=True),
    Entry(f"{_PKG}.sockets", "sockets between in-process ranks (refused: the run goes to procs)",
          lambda m: {"socket.socket (procs mode)": _keys(m.BETWEEN_RANKS)},
          lambda m: {"socket.socket (inproc rank)": _keys(m.BETWEEN_RANKS)},
          others="the real socket's", needs_launcher=True),
    Entry(f"{_PKG}.class_state", "library classes and modules keeping one process's state in "
          "class attributes or module globals (refused in-process: the run goes to procs)",
          lambda m: {f"{'.'.join(filter(None, (mod, cls)))} (procs mode)": list(meths)
                     for mod, classes in m.PER_PROCESS.items() for cls, meths in classes.items()},
          lambda m: {f"{'.'.join(filter(None, (mod, cls)))} (inproc rank)": list(meths)
                     for mod, classes in m.PER_PROCESS.items() for cls, meths in classes.items()},
          others="the real class's", needs_launcher=True),
    Entry(f"{_PKG}.rank_locals", "threading.local, per rank (in-process ranks share a thread)",
          lambda m: {"threading": ["local"]}, needs_launcher=True),
    Entry(f"{_PKG}.nccl.libnccl", "libnccl.so through ctypes",
          lambda m: {"libnccl": sorted(m.SIMULATED)},
          others="any other NCCL symbol: not simulated"),
    Entry(f"{_PKG}.torch_distributed.symm_mem", "torch.distributed._symmetric_memory",
          lambda m: {m.MODULE: _keys(m.SERVED)},
          lambda m: {m.MODULE: sorted(m.NOT_SIMULATED)}),
    Entry(f"{_PKG}.compiled.guard", "compiled CUDA extensions (vllm._C, FlashInfer JIT modules)",
          lambda m: {_extension(e): sorted(e.served) for e in m.EXTENSIONS},
          lambda m: {_extension(e): list(e.not_served) for e in m.EXTENSIONS},
          others="any other FlashInfer JIT module: refused, naming it"),
)
MODULES: tuple[str, ...] = tuple(e.module for e in TABLE)


def served(entry: Entry) -> dict[str, list[str]]:
    """What `entry` serves, read from its module (foreign module -> sorted names)."""
    m = importlib.import_module(entry.module)
    return {k: sorted(v) for k, v in entry.served(m).items()}


def not_simulated(entry: Entry) -> dict[str, list[str]]:
    m = importlib.import_module(entry.module)
    return {k: sorted(v) for k, v in entry.not_simulated(m).items()}


def _cell(names: Mapping[str, list[str]]) -> str:
    return "<br>".join(f"{k}: " + ", ".join(f"`{n}`" for n in v) for k, v in names.items() if v) or "-"


HEADER = "| surface module | answers | served | not simulated (loud stand-in) | every other name |"


def docs_table() -> Iterator[str]:
    yield HEADER
    yield "|---|---|---|---|---|"
    for e in TABLE:
        short = e.module.removeprefix(_PKG + ".")
        yield (f"| `{short}` | {e.answers} | {_cell(served(e))} | {_cell(not_simulated(e))} "
               f"| {e.others} |")


DOC = Path(__file__).resolve().parents[3] / "docs" / "hosting-surfaces.md"


def doc_with_table(text: str) -> str:
    """`text` (the doc) with its table block replaced by `docs_table()`."""
    lines = text.splitlines()
    start = lines.index(HEADER)
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "\n".join([*lines[:start], *docs_table(), *lines[end:]]) + "\n"


def main(argv: list[str]) -> int:
    if argv[1:] == ["--write"]:
        DOC.write_text(doc_with_table(DOC.read_text()))
    else:
        print("\n".join(docs_table()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
