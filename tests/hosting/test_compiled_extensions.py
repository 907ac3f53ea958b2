"""Compiled CUDA extensions in a hosted rank: the named error from the one registry
(commsim/hosting/surfaces/compiled/extensions.py), never an unnamed loader error."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import pytest

from commsim.hosting.surfaces.compiled import extensions, guard
from commsim.hosting.surfaces.compiled.extensions import CompiledExtensionNotServed
from sim_ranks import module_surfaces, ranks, solo  # noqa: F401  (fixture)

pytestmark = pytest.mark.usefixtures("module_surfaces", "extension_guard")


@pytest.fixture(scope="module")
def extension_guard():
    guard.install()
    yield
    guard.uninstall()


def test_every_declaration_has_a_version_range_and_ranges_of_one_module_do_not_overlap():
    seen: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for e in extensions.EXTENSIONS:
        lo, hi = (extensions._release(v) for v in e.versions)
        assert lo < hi, e
        for other in seen.get((e.library, e.module), []):
            olo, ohi = (extensions._release(v) for v in other)
            assert hi <= olo or ohi <= lo, e
        seen.setdefault((e.library, e.module), []).append(e.versions)
        assert not set(e.served) & set(e.not_served), e
    assert extensions.version_in("0.7.2.post1", ("0.7.2", "0.8"))
    assert not extensions.version_in("0.8.0", ("0.7.2", "0.8"))


def test_the_message_names_the_module_what_is_served_and_what_is_not(monkeypatch):
    monkeypatch.setattr(extensions, "_installed", lambda lib: "0.7.2.post1")
    text = str(extensions.not_served_error("flashinfer-jit", "pcie_ipc_comm"))
    assert text.startswith("commsim hosting: flashinfer JIT module 'pcie_ipc_comm' is a "
                           "compiled CUDA extension; served: pcie_ipc_memop_supported, "
                           "pcie_ipc_set_memop_enabled, pcie_ipc_workspace_size; not served: "
                           "pcie_ipc_init, pcie_ipc_all_reduce, pcie_ipc_dispose (")
    assert "(flashinfer-python 0.7.2.post1;" in text
    text = str(extensions.not_served_error("flashinfer-jit", "trtllm_comm",
                                           op="trtllm_custom_all_reduce"))
    assert text.startswith("commsim hosting: flashinfer JIT module 'trtllm_comm' is a compiled "
                           "CUDA extension; served: trtllm_allreduce_fusion, "
                           "trtllm_lamport_initialize, trtllm_lamport_initialize_all, "
                           "trtllm_moe_allreduce_fusion, trtllm_moe_finalize_allreduce_fusion; "
                           "not served: trtllm_custom_all_reduce ("), text
    assert "(flashinfer-python 0.7.2.post1; trtllm_custom_all_reduce called; " in text
    other = str(extensions.not_served_error("flashinfer-jit", "gemm_sm100"))
    assert "not served: every op (not declared for flashinfer-python 0.7.2.post1)" in other
    monkeypatch.setattr(extensions, "_installed", lambda lib: "0.4.1")
    assert ("served: trtllm_allreduce_fusion, trtllm_lamport_initialize, "
            "trtllm_lamport_initialize_all, trtllm_moe_allreduce_fusion, "
            "trtllm_moe_finalize_allreduce_fusion; not served: trtllm_custom_all_reduce (") in str(
        extensions.not_served_error("flashinfer-jit", "trtllm_comm"))
    monkeypatch.setattr(extensions, "_installed", lambda lib: "0.5.3")
    assert "not declared for flashinfer-python 0.5.3" in str(
        extensions.not_served_error("flashinfer-jit", "trtllm_comm"))


def test_a_declared_extension_module_is_found_but_not_loaded_in_a_rank(monkeypatch):
    """The import-path guard on a compiled module that is installed here (cuda-python's
    nvjitlink binding stands in for vllm._C, which is not): find_spec answers as installed,
    the import in a rank raises the named ImportError, outside a rank it loads."""
    name = "cuda.bindings.nvjitlink"
    monkeypatch.setattr(guard, "_IMPORTED", frozenset({name}))
    monkeypatch.delitem(sys.modules, name, raising=False)
    _, (r,) = ranks("hgx-h100-8", [(0, 0)])
    spec = solo(r, lambda: importlib.util.find_spec(name))
    assert spec.origin.endswith(".so")
    with pytest.raises(CompiledExtensionNotServed, match=r"^commsim hosting: cuda\.bindings\."
                       r"nvjitlink is a compiled CUDA extension; served: none; not served: "):
        solo(r, lambda: importlib.import_module(name))
    assert name not in sys.modules
    assert importlib.import_module(name).__file__ == spec.origin      # not a hosted rank


def test_a_served_module_gives_its_ops_and_the_named_error_for_the_others(monkeypatch):
    from commsim.hosting.surfaces.compiled.served import ServedModule
    monkeypatch.setattr(extensions, "_installed", lambda lib: "0.7.2.post1")
    ext, _, _ = extensions.declared("flashinfer-jit", "trtllm_comm")
    m = ServedModule(ext, "flashinfer-jit")
    from commsim.hosting.surfaces.compiled import flashinfer_trtllm
    assert m.trtllm_allreduce_fusion is flashinfer_trtllm.trtllm_allreduce_fusion
    with pytest.raises(CompiledExtensionNotServed, match="trtllm_custom_all_reduce called"):
        m.trtllm_custom_all_reduce
    with pytest.raises(AttributeError, match="has no attribute 'no_such_op'"):
        m.no_such_op


def test_every_served_op_cites_the_kernel_source_it_follows():
    """Each served op names its kernel source in the table, resolves to a documented function,
    and a FlashInfer op's module names the repository, the commit and the kernel files."""
    for e in extensions.EXTENSIONS:
        for name, op in e.served.items():
            assert ".cu" in op.source, name
            module, _, fn = op.impl.partition(":")
            impl = getattr(importlib.import_module(module), fn)
            assert impl.__doc__, name
            if e.library == "flashinfer-python":
                doc = sys.modules[module].__doc__
                assert "flashinfer-ai/flashinfer at " in doc and ".cuh" in doc and ".cu" in doc, name


def test_a_cuda_error_in_flashinfer_s_custom_all_reduce_raises_where_vllm_s_exits():
    """The same object under two libraries: vLLM's CUDACHECK prints and exits the process,
    FlashInfer's CHECK_CUDA_SUCCESS throws its cuda_error ("<error>\\n<file>"), a RuntimeError
    in Python. 400 is cudaErrorInvalidResourceHandle, the seed's error."""
    from commsim.hosting.surfaces.compiled import flashinfer_vllm_ar, vllm_custom_ar
    ar = vllm_custom_ar._Allreduce(rank=0, signals=[0, 0], device=0,
                                   cuda_error_raises_from=flashinfer_vllm_ar._HEADER)
    with pytest.raises(RuntimeError, match=r"^invalid resource handle\ninclude/flashinfer/comm/"
                       r"vllm_custom_all_reduce\.cuh$"):
        vllm_custom_ar._cudacheck(None, ar, (400,))
    assert vllm_custom_ar._cudacheck(None, ar, (0, 7)) == 7
