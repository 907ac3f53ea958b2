"""The compiled CUDA extensions of serving libraries, declared once: what a hosted rank gets
when it loads one.

A serving stack reaches its kernels through a compiled module: vLLM imports `vllm._C` and
`vllm._C_stable_libtorch` (the custom all-reduce ops then resolve as
`torch.ops._C_custom_ar.*`); FlashInfer builds or loads a JIT module per kernel family
(`gen_trtllm_comm_module().build_and_load()`). None of them can load in a hosted rank (there
is no libcuda.so.1 and no GPU to compile for), and nvcc, Triton or CuTe-DSL must not start
there. So each such module is declared here, per library and version range, with the ops
commsim serves for it (a reference implementation over the simulated driver, registered
where the library looks it up) and the ops it does not. Loading a declared module in a
hosted rank gives the served module or `CompiledExtensionNotServed` naming the module, what
is served and what is not; serving an op later is one entry in `served`.

Op lists follow each library's Python callers at the named version (the attribute calls on
the loaded module): FlashInfer 0.7.2.post1 `flashinfer/comm/trtllm_ar.py`,
`trtllm_mnnvl_ar.py`, `vllm_ar.py`, `pcie_ipc_ar.py`; FlashInfer 0.4.1 (its sdist)
`flashinfer/comm/trtllm_ar.py`, whose `trtllm_create_ipc_workspace_for_all_reduce_fusion`
needs `trtllm_lamport_initialize`: its csrc/trtllm_allreduce.cu and
include/flashinfer/comm/trtllm_allreduce.cuh fill the buffer with negative zero as 0.7.2.post1's
do (`lamport_initialize_kernel`, `lamportInitializeAll` dividing by sizeof(T) again), so the same
reference serves both; its `trtllm_allreduce_fusion` (21 arguments: no
`block_quant_group_size`, `weight_bias`), `trtllm_moe_allreduce_fusion` (20) and
`trtllm_moe_finalize_allreduce_fusion` (13) are served by functions of those signatures over
the same references ("op=function" below; flashinfer_trtllm.py and flashinfer_trtllm_moe.py
say why the kernels agree). vLLM 0.33.0 ships no `vllm._C`: its
CUDA platform (`vllm/platforms/cuda.py`) imports `vllm._C_stable_libtorch`, which registers
the namespaces `_C`, `_C_cache_ops`, `_C_cuda_utils` and `_C_custom_ar`; the `_C_custom_ar`
schemas below are the strings that library registers (read from the installed 0.33.0 wheel,
`csrc/torch_bindings.cpp` at v0.33.0), the ops `vllm/_custom_ops.py` calls for
`vllm/distributed/device_communicators/custom_all_reduce.py`. vLLM 0.34.0's
`_C_stable_libtorch.abi3.so` registers the same fifteen `_C_custom_ar` schema strings (both
wheels' strings compared), so one declaration covers [0.33.0, 0.35); a release that changes
one gets a declaration of its own. The served ops follow the v0.33.0 kernels; that 0.34.0's
`csrc/custom_all_reduce.cuh` computes the same is UNCONFIRMED (the wheel carries no source).

A served op of a Python extension module is declared as "<namespace>.<op>" with its schema
and the function that implements it (`ServedOp`); loading the module in a hosted rank
registers them with torch.library (served.py). The ops the module registers and commsim
does not serve are defined from `REFUSED_SCHEMAS` and raise the named error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

__all__ = ["CompiledExtension", "CompiledExtensionNotServed", "EXTENSIONS", "REFUSED_SCHEMAS",
           "ServedOp", "declared", "not_served_error", "version_in"]


class CompiledExtensionNotServed(ImportError):
    """A hosted rank loaded a compiled CUDA extension commsim does not serve. An ImportError:
    what a library that cannot load its extension meets (vLLM's `_custom_ops` catches it and
    warns; FlashInfer's callers see it at the first op)."""


@dataclass(frozen=True)
class ServedOp:
    """A served op: its schema as the extension registers it, its reference implementation
    ("module:function", called with the rank first, then the op's arguments in schema order;
    imported only when the extension loads in a hosted rank) and the kernel source it follows."""

    schema: str          # "" for a JIT module's function (no torch schema: called as is)
    impl: str
    source: str


@dataclass(frozen=True)
class CompiledExtension:
    library: str                     # the distribution (importlib.metadata name)
    versions: tuple[str, str]        # [first, past-last) release, e.g. ("0.7.2", "0.8")
    module: str                      # import name, or the JIT module's spec name
    kind: str                        # "import" (a Python extension module), "flashinfer-jit" or
                                     # "sgl_kernel" (its common_ops, loaded from a path)
    not_served: tuple[str, ...]
    served: dict[str, Any] = field(default_factory=dict)   # op -> ServedOp (or what the kind loads)


def _ops(text: str) -> tuple[str, ...]:
    return tuple(text.split())


_VLLM_AR = "commsim.hosting.surfaces.compiled.vllm_custom_ar"
_VLLM_AR_SOURCE = "vllm-project/vllm v0.33.0 csrc/custom_all_reduce.cu, csrc/custom_all_reduce.cuh"
_VLLM_AR_SCHEMAS = (
    "meta_size() -> int",
    "init_custom_ar(int[] ipc_tensors, Tensor rank_data, int rank, bool fully_connected) -> int",
    "register_buffer(int fa, int[] ipc_tensors) -> ()",
    "get_graph_buffer_ipc_meta(int fa) -> (int[], int[])",
    "register_graph_buffers(int fa, int[][] handles, int[][] offsets) -> ()",
    "all_reduce(int fa, Tensor inp, Tensor! out, int reg_buffer, int reg_buffer_sz_bytes) -> ()",
    "dispose(int fa) -> ()",
    "allocate_shared_buffer_and_handle(int size) -> (int, Tensor)",
    "open_mem_handle(Tensor mem_handle) -> int",
    "free_shared_buffer(int ptr) -> ()",
)


def _torch_ops(namespace: str, impl: str, source: str, schemas: tuple[str, ...]) -> dict[str, ServedOp]:
    """Served torch.library ops "<namespace>.<op>", each implemented by the function of the
    op's name in the module `impl`."""
    return {f"{namespace}.{s.partition('(')[0]}": ServedOp(s, f"{impl}:{s.partition('(')[0]}", source)
            for s in schemas}


_VLLM_AR_SERVED = _torch_ops("_C_custom_ar", _VLLM_AR, _VLLM_AR_SOURCE, _VLLM_AR_SCHEMAS)

# sglang-kernel 0.4.10 registers its custom all-reduce (`sglang::CustomAllreduce`, adapted
# from vLLM's) under `sgl_kernel` from `sgl_kernel/sm90/common_ops.abi3.so` or
# `sm100/common_ops.abi3.so` (both wheels' strings compared): `init_custom_ar` and
# `all_reduce` with the schema strings below, the others by signature alone (`m.def(name,
# &fn)`: torch infers the schema, its argument names UNCONFIRMED; callers pass them by
# position, sgl_kernel/allreduce.py). Its Python side calls them as vLLM's does
# (sglang/srt/distributed/device_communicators/custom_all_reduce.py at 0.5.23), so vLLM's
# reference serves them; that sgl-kernel's kernel and Signal match vLLM v0.33.0's is
# UNCONFIRMED (the wheel carries no source).
_SGL_AR_SOURCE = "sglang-kernel 0.4.10 sgl_kernel/sm90|sm100/common_ops.abi3.so (schemas); " \
                 "kernel as vllm-project/vllm v0.33.0 csrc/custom_all_reduce.cuh (UNCONFIRMED)"
_SGL_AR_SCHEMAS = (
    "meta_size() -> int",
    "init_custom_ar(int[] ipc_tensors, Tensor rank_data, int rank, bool full_nvlink) -> int",
    "register_buffer(int fa, int[] fake_ipc_ptrs) -> ()",
    "get_graph_buffer_ipc_meta(int fa) -> (int[], int[])",
    "register_graph_buffers(int fa, int[][] handles, int[][] offsets) -> ()",
    "all_reduce(int fa, Tensor inp, Tensor! out, int reg_buffer, int reg_buffer_sz_bytes) -> ()",
    "dispose(int fa) -> ()",
)

# Ops a served extension registers that commsim does not serve: "<namespace>.<op>" -> schema.
REFUSED_SCHEMAS: dict[str, str] = {
    "_C_custom_ar.custom_all_gather":
        "custom_all_gather(int fa, Tensor inp, Tensor! out, int reg_buffer, int reg_buffer_sz_bytes) -> ()",
    "_C_custom_ar.custom_reduce_scatter":
        "custom_reduce_scatter(int fa, Tensor inp, Tensor! out, int reg_buffer, "
        "int reg_buffer_sz_bytes) -> ()",
    "_C_custom_ar.mnnvl_lamport_all_gather":
        "mnnvl_lamport_all_gather(int fa, Tensor inp, Tensor! out, int local_buffer, "
        "int multicast_buffer, int epoch_buffer, int stage_sz_bytes) -> ()",
    "_C_custom_ar.mnnvl_lamport_reduce_scatter":
        "mnnvl_lamport_reduce_scatter(int fa, Tensor inp, Tensor! out, int local_buffer, "
        "int epoch_buffer, int stage_sz_bytes) -> ()",
    "_C_custom_ar.mnnvl_multimem_reduce_scatter":
        "mnnvl_multimem_reduce_scatter(int fa, Tensor inp, Tensor! out, int local_buffer, "
        "int multicast_buffer, int stage_sz_bytes, int block_limit) -> ()",
}
_VLLM_AR_REFUSED = tuple(n for n in REFUSED_SCHEMAS if n.startswith("_C_custom_ar."))

def _jit_ops(module: str, source: str, names: str) -> dict[str, ServedOp]:
    """A FlashInfer JIT module's served functions, each implemented by the function of the
    same name in `module`, or "op=function" where one release's signature needs a function
    of its own (imported when the module loads in a hosted rank, not here)."""
    pairs = (n.partition("=") for n in names.split())
    return {op: ServedOp("", f"commsim.hosting.surfaces.compiled.{module}:{fn or op}", source)
            for op, _, fn in pairs}


# Sources as each module's docstring details them (flashinfer-ai/flashinfer at the commit
# whose csrc matches the 0.7.2.post1 wheel).
_FI_TRTLLM = "flashinfer csrc/trtllm_allreduce.cu, include/flashinfer/comm/trtllm_allreduce*.cuh"
_FI_TRTLLM_041 = ("flashinfer-python 0.4.1 sdist (v0.4.1, a88349f9f43d) csrc/trtllm_allreduce.cu, "
                  "csrc/trtllm_allreduce_fusion.cu, include/flashinfer/comm/trtllm_allreduce*.cuh")
_FI_TRTLLM_MOE = ("flashinfer csrc/trtllm_moe_allreduce_fusion.cu, "
                  "include/flashinfer/comm/trtllm_moe_allreduce_fusion.cuh")
_FI_VLLM_AR = ("flashinfer csrc/vllm_custom_all_reduce.cu, "
               "include/flashinfer/comm/vllm_custom_all_reduce.cuh")
_FI_PCIE_IPC = ("flashinfer csrc/pcie_ipc_all_reduce.cu, "
                "include/flashinfer/comm/pcie_ipc_all_reduce.cuh, pcie_ipc_ce_memop.cuh")
_FI_TRTLLM_MOE_041 = ("flashinfer-python 0.4.1 sdist (v0.4.1, a88349f9f43d) "
                      "csrc/trtllm_moe_allreduce_fusion.cu, "
                      "include/flashinfer/comm/trtllm_moe_allreduce_fusion.cuh")
_FI_MNNVL = "flashinfer csrc/trtllm_mnnvl_allreduce.cu, include/flashinfer/comm/trtllm_mnnvl_allreduce.cuh"

EXTENSIONS: tuple[CompiledExtension, ...] = (
    CompiledExtension("flashinfer-python", ("0.4.1", "0.4.2"), "trtllm_comm", "flashinfer-jit", _ops(
        "trtllm_custom_all_reduce"),
        served={**_jit_ops("flashinfer_trtllm", _FI_TRTLLM_041, "trtllm_lamport_initialize "
                           "trtllm_lamport_initialize_all "
                           "trtllm_allreduce_fusion=trtllm_allreduce_fusion_v041"),
                **_jit_ops("flashinfer_trtllm_moe", _FI_TRTLLM_MOE_041,
                           "trtllm_moe_allreduce_fusion=trtllm_moe_allreduce_fusion_v041 "
                           "trtllm_moe_finalize_allreduce_fusion="
                           "trtllm_moe_finalize_allreduce_fusion_v041")}),
    CompiledExtension("flashinfer-python", ("0.7.2", "0.8"), "trtllm_comm", "flashinfer-jit", _ops(
        "trtllm_custom_all_reduce"),
        served={**_jit_ops("flashinfer_trtllm", _FI_TRTLLM, "trtllm_lamport_initialize "
                           "trtllm_lamport_initialize_all trtllm_allreduce_fusion"),
                **_jit_ops("flashinfer_trtllm_moe", _FI_TRTLLM_MOE, "trtllm_moe_allreduce_fusion "
                           "trtllm_moe_finalize_allreduce_fusion")}),
    CompiledExtension("flashinfer-python", ("0.7.2", "0.8"), "trtllm_mnnvl_comm", "flashinfer-jit", (),
                      served=_jit_ops("flashinfer_mnnvl", _FI_MNNVL, "trtllm_mnnvl_allreduce_fusion")),
    CompiledExtension("flashinfer-python", ("0.7.2", "0.8"), "vllm_comm", "flashinfer-jit", (),
                      served=_jit_ops("flashinfer_vllm_ar", _FI_VLLM_AR, "meta_size "
                                      "init_custom_ar register_buffer get_graph_buffer_ipc_meta "
                                      "register_graph_buffers all_reduce dispose")),
    CompiledExtension("flashinfer-python", ("0.7.2", "0.8"), "pcie_ipc_comm", "flashinfer-jit", _ops(
        "pcie_ipc_init pcie_ipc_all_reduce pcie_ipc_dispose"),
        served=_jit_ops("flashinfer_pcie_ipc", _FI_PCIE_IPC, "pcie_ipc_memop_supported "
                        "pcie_ipc_workspace_size pcie_ipc_set_memop_enabled")),
    CompiledExtension("vllm", ("0.33.0", "0.35"), "vllm._C_stable_libtorch", "import", (
        *_VLLM_AR_REFUSED, "_C.*", "_C_cache_ops.*", "_C_cuda_utils.*"), served=_VLLM_AR_SERVED),
    CompiledExtension("vllm", ("0.33.0", "0.35"), "vllm._moe_C_stable_libtorch", "import", ()),
    CompiledExtension("vllm", ("0.33.0", "0.35"), "vllm.cumem_allocator", "import", ()),
    # Loaded by sgl_kernel/load_utils.py's _load_architecture_specific_ops from a file path
    # (kind "sgl_kernel"); the other compiled modules of the package are plain imports.
    CompiledExtension("sglang-kernel", ("0.4.10", "0.4.11"), "common_ops", "sgl_kernel",
                      ("sgl_kernel.*",),
                      served=_torch_ops("sgl_kernel", _VLLM_AR, _SGL_AR_SOURCE, _SGL_AR_SCHEMAS)),
    *(CompiledExtension("sglang-kernel", ("0.4.10", "0.4.11"), f"sgl_kernel.{m}", "import", ())
      for m in ("flash_ops", "flashmla_ops", "spatial_ops")),
)


def _release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string ("0.7.2.post1" -> (0, 7, 2))."""
    m = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(p) for p in m.group(0).split(".")) if m else ()


def version_in(version: str, versions: tuple[str, str]) -> bool:
    return _release(versions[0]) <= _release(version) < _release(versions[1])


def _installed(library: str) -> str | None:
    try:
        return metadata.version(library)
    except metadata.PackageNotFoundError:
        return None


def declared(kind: str, module: str) -> tuple[CompiledExtension | None, str, str | None]:
    """(the declaration for `module` at the installed version or None, its library, the
    installed version) among the declarations of `kind`."""
    libraries = {e.library for e in EXTENSIONS if e.kind == kind and e.module == module}
    if kind == "flashinfer-jit":
        libraries.add("flashinfer-python")
    for library in sorted(libraries):
        version = _installed(library)
        for e in EXTENSIONS:
            if (e.kind, e.module, e.library) == (kind, module, library) and version \
                    and version_in(version, e.versions):
                return e, library, version
        return None, library, version
    return None, "", None


def not_served_error(kind: str, module: str, op: str | None = None) -> CompiledExtensionNotServed:
    """The named error for loading `module` in a hosted rank, or for calling its op `op` that
    is declared but not served."""
    ext, library, version = declared(kind, module)
    what = f"flashinfer JIT module {module!r}" if kind == "flashinfer-jit" else module
    at = f"{library} {version}" if version else library
    if ext is None:
        served, not_served = "none", f"every op (not declared for {at})"
    else:
        served = ", ".join(sorted(ext.served)) or "none"
        not_served = ", ".join(ext.not_served) or ("none" if ext.served else "every op")
    called = f"{op} called; " if op else ""
    return CompiledExtensionNotServed(
        f"commsim hosting: {what} is a compiled CUDA extension; served: {served}; not served: "
        f"{not_served} ({at}; {called}no JIT build or extension load runs in a hosted rank)",
        name=module)
