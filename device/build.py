"""Compile device/kernels/*.cu at run time with NVRTC, cached on disk.

NVRTC needs no GPU, so CPU-only CI compile-checks every kernel for every architecture
(tests/device/test_kernels_compile.py). libnvrtc comes from PyPI (`cuda-toolkit[nvrtc]`,
the nvidia-cuda-nvrtc wheel); cuda-bindings' `cuda.bindings.nvrtc` finds it through
cuda-pathfinder. The kernels include no toolkit header (see kernels/commsim_common.cuh), so
NVRTC alone is enough.

Cache: `$COMMSIM_KERNEL_CACHE`, else `$XDG_CACHE_HOME/commsim/kernels`, else
`~/.cache/commsim/kernels`; one file per (unit, architecture, output kind), named by a hash of
the sources, the options and the NVRTC version, so an edit or an NVRTC upgrade never loads a
stale binary.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

KERNEL_DIR = Path(__file__).with_name("kernels")
COMMON_HEADER = "commsim_common.cuh"
# unit -> source file; multimem.* instructions exist from sm_90 (PTX ISA 8.1) on.
UNITS = {"peer": "peer.cu", "multimem": "multimem.cu"}
MIN_SM = {"peer": 80, "multimem": 90}
ARCHS = (80, 90, 100)           # what CI checks: A100, H100/H200/GH200, B200/GB200
OPTIONS = ("-std=c++17",)

# Entry points each unit defines (device/launch.py launches them by these names).
DTYPE_SUFFIXES = ("f32", "f16", "bf16")
ENTRIES = {
    "peer": tuple(f"{k}_{d}" for k in ("one_shot_all_reduce", "two_shot_all_reduce",
                                       "reduce_scatter", "fused_all_reduce_rmsnorm")
                  for d in DTYPE_SUFFIXES) + ("all_gather", "read_bytes"),
    "multimem": tuple(f"multimem_all_reduce_{d}" for d in DTYPE_SUFFIXES),
}


class NvrtcUnavailable(RuntimeError):
    """libnvrtc cannot be loaded; the message says what was looked for and how to install."""


class CompileError(RuntimeError):
    """NVRTC rejected a kernel; the message carries the compiler log."""


@dataclass(frozen=True)
class Built:
    unit: str
    arch: int
    kind: str            # "cubin" | "ptx"
    image: bytes
    path: Path
    cached: bool         # True when read from the cache rather than compiled now


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as e:  # cuda-bindings itself missing
        raise NvrtcUnavailable(f"cuda.bindings.nvrtc cannot be imported ({e}); install "
                               f"cuda-python (a commsim dependency)") from None
    try:
        err, major, minor = nvrtc.nvrtcVersion()
    except Exception as e:  # cuda-pathfinder raises when libnvrtc.so is nowhere
        raise NvrtcUnavailable(
            f"libnvrtc cannot be loaded ({type(e).__name__}: {e}); install it with "
            f"`pip install \"cuda-toolkit[nvrtc]\"` (the nvidia-cuda-nvrtc wheel)") from None
    if int(err) != 0:
        raise NvrtcUnavailable(f"nvrtcVersion failed: {err!r}")
    return nvrtc


def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the loaded libnvrtc; raises NvrtcUnavailable."""
    _, major, minor = _nvrtc().nvrtcVersion()
    return int(major), int(minor)


def supported_archs() -> tuple[int, ...]:
    nvrtc = _nvrtc()
    err, archs = nvrtc.nvrtcGetSupportedArchs()
    return tuple(int(a) for a in archs) if int(err) == 0 else ()


def cache_dir() -> Path:
    env = os.environ.get("COMMSIM_KERNEL_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "commsim" / "kernels"


def _sources(unit: str) -> tuple[bytes, bytes]:
    if unit not in UNITS:
        raise ValueError(f"unknown kernel unit {unit!r}; known: {', '.join(UNITS)}")
    return (KERNEL_DIR / UNITS[unit]).read_bytes(), (KERNEL_DIR / COMMON_HEADER).read_bytes()


def _options(arch: int, kind: str) -> list[str]:
    # sm_XX gives a CUBIN (NVRTC runs ptxas, so inline PTX is checked too); compute_XX gives
    # PTX for the driver to JIT (only for a device newer than this NVRTC knows).
    target = f"sm_{arch}" if kind == "cubin" else f"compute_{arch}"
    return [f"--gpu-architecture={target}", *OPTIONS]


def cache_key(unit: str, arch: int, kind: str) -> str:
    src, hdr = _sources(unit)
    h = hashlib.sha256()
    for part in (src, hdr, " ".join(_options(arch, kind)).encode(),
                 ".".join(map(str, nvrtc_version())).encode()):
        h.update(part)
        h.update(b"\0")
    return h.hexdigest()[:20]


def _log(nvrtc, prog) -> str:
    err, size = nvrtc.nvrtcGetProgramLogSize(prog)
    if int(err) != 0 or size <= 1:
        return ""
    buf = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, buf)
    return buf.rstrip(b"\0 ").decode(errors="replace")


def compile_unit(unit: str, arch: int, kind: str = "cubin") -> bytes:
    """Compile one unit for one architecture, without the cache. Raises CompileError."""
    if kind not in ("cubin", "ptx"):
        raise ValueError(f"kind must be 'cubin' or 'ptx', got {kind!r}")
    if arch < MIN_SM[unit]:
        raise CompileError(f"{UNITS[unit]} needs sm_{MIN_SM[unit]}+ (multimem instructions); "
                           f"sm_{arch} was asked for")
    nvrtc = _nvrtc()
    src, hdr = _sources(unit)
    err, prog = nvrtc.nvrtcCreateProgram(src, UNITS[unit].encode(), 1, [hdr],
                                         [COMMON_HEADER.encode()])
    if int(err) != 0:
        raise CompileError(f"nvrtcCreateProgram({UNITS[unit]}): {err!r}")
    try:
        opts = [o.encode() for o in _options(arch, kind)]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if int(err) != 0:
            raise CompileError(f"NVRTC {'.'.join(map(str, nvrtc_version()))} could not compile "
                               f"{UNITS[unit]} for sm_{arch} ({err.name}):\n{_log(nvrtc, prog)}")
        get_size, get = ((nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN) if kind == "cubin"
                         else (nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX))
        err, size = get_size(prog)
        if int(err) != 0 or size == 0:
            raise CompileError(f"{UNITS[unit]} for sm_{arch}: no {kind} produced ({err!r})")
        buf = b" " * size
        (err,) = get(prog, buf)
        if int(err) != 0:
            raise CompileError(f"{UNITS[unit]} for sm_{arch}: reading the {kind} failed ({err!r})")
        return bytes(buf)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def build(unit: str, arch: int, kind: str = "cubin") -> Built:
    """The compiled image of `unit` for `arch`, from the cache when it is there."""
    path = cache_dir() / f"{unit}-sm{arch}-{cache_key(unit, arch, kind)}.{kind}"
    if path.is_file():
        return Built(unit, arch, kind, path.read_bytes(), path, True)
    image = compile_unit(unit, arch, kind)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Atomic publish: concurrent ranks compiling the same unit never read a torn file.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(image)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return Built(unit, arch, kind, image, path, False)


def units_for(arch: int) -> tuple[str, ...]:
    return tuple(u for u in UNITS if arch >= MIN_SM[u])


def image_for_device(unit: str, sm: int) -> Built:
    """What a device of compute capability `sm` loads: a CUBIN for its exact architecture
    when this NVRTC knows it (no driver JIT, so a driver older than NVRTC still loads it),
    else PTX for the newest architecture NVRTC knows below it, for the driver to JIT."""
    archs = supported_archs()
    if sm in archs:
        return build(unit, sm, "cubin")
    older = [a for a in archs if a <= sm and a >= MIN_SM[unit]]
    if not older:
        raise CompileError(f"NVRTC {'.'.join(map(str, nvrtc_version()))} supports none of "
                           f"sm_{MIN_SM[unit]}..sm_{sm} for {UNITS[unit]}")
    return build(unit, max(older), "ptx")
