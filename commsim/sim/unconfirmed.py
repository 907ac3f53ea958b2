"""The simulator's choices where no public source confirms a CUDA answer.

Every semantic rule of the simulator cites its row in the code that applies it (the rows' cases
and sources: tests/conformance/test_rules.py, docs/fidelity-rules.md,
docs/lifecycle-rules.md). The rows marked UNCONFIRMED have no primary source for the exact
code; this one table holds the code chosen for each, so a GPU run (device/) that observes a
different answer has exactly one place to correct. tests/conformance asserts each entry as
"UNCONFIRMED: chosen".
"""

from __future__ import annotations

from cuda.bindings import driver as cu
from cuda.bindings import runtime as cudart

E = cudart.cudaError_t
R = cu.CUresult

# row -> (chosen code, why this one)
UNCONFIRMED: dict[str, tuple[object, str]] = {
    "L7": (E.cudaErrorInvalidResourceHandle, "second context opening the same exporter's handle"),
    "L13": (E.cudaErrorInvalidValue, "flags != cudaIpcMemLazyEnablePeerAccess: docs require it"),
    "V4": (R.CUDA_ERROR_NOT_SUPPORTED, "cuMemCreate(FABRIC) where attribute 128 is 0"),
    "V7": (R.CUDA_ERROR_NOT_PERMITTED, "FABRIC import from another NVLink domain (flagged)"),
    "V10": (R.CUDA_ERROR_INVALID_VALUE, "cuMemMap onto a range that is not reserved or is mapped"),
    "V12": (R.CUDA_ERROR_INVALID_VALUE, "cuMemUnmap of a sub-range of a mapping"),
    "V15": (R.CUDA_ERROR_INVALID_VALUE, "cuMemAddressFree with a ptr/size other than reserved"),
    "M1": (R.CUDA_ERROR_NOT_SUPPORTED, "cuMulticastCreate where attribute 132 is 0"),
    "M6": (R.CUDA_ERROR_INVALID_VALUE, "cuMulticastUnbind offset/size other than bound (UB: flagged)"),
    "X1": (R.CUDA_ERROR_INVALID_VALUE, "export of a handle type not requested at cuMemCreate"),
    "X2": (R.CUDA_ERROR_SYSTEM_NOT_READY, "cuMemCreate(FABRIC) / multicast bind while the GPU's "
           "fabric state is not COMPLETED (fabric manager not done; M3's code)"),
    "X3": (R.CUDA_ERROR_NOT_SUPPORTED, "cuMulticastAddDevice of a GPU outside the creator's "
           "NVSwitch domain"),
    "X4": (R.CUDA_ERROR_INVALID_VALUE, "POSIX-fd import of a descriptor this process does not hold"),
    # the fidelity rules, docs/fidelity-rules.md
    "I3": (R.CUDA_ERROR_NOT_PERMITTED, "FABRIC import from a host in another IMEX domain (V5's code)"),
    "MC4": (R.CUDA_ERROR_NOT_PERMITTED, "cuMulticastCreate(FABRIC) without a usable IMEX channel"),
    "H5": (E.cudaErrorInvalidResourceHandle, "cudaIpcOpenMemHandle of memory its exporter freed"),
    "W6": (E.cudaErrorDeviceUninitialized, "cudaIpcOpenMemHandle of a handle from a process in another "
           "container (pid / IPC namespace) of the same host: 201, \"invalid device context\" as in "
           "vllm-project/vllm#55906"),
    # the lifecycle rules, docs/lifecycle-rules.md (commsim/sim/stream_capture.py)
    "CG3": (E.cudaErrorStreamCaptureUnsupported, "legacy IPC export / open during a capture that "
            "is not RELAXED: refused like cudaMalloc (CG1), and the capture invalidated"),
    "CG4": (E.cudaErrorIllegalState, "cudaStreamBeginCapture while capturing, or "
            "cudaStreamEndCapture without a capture"),
}


# A copy or memset whose device range runs past the allocation behind its pointer (or whose
# pointer is no device memory): the CUDA driver API reference (group CUDA__MEM: cuMemcpyHtoD,
# cuMemcpyDtoH, cuMemcpyDtoD, cuMemsetD8/16/32) lists CUDA_ERROR_INVALID_VALUE among their
# codes without naming the case that answers it; that code is chosen for all of them alike,
# checked before a byte moves. UNCONFIRMED.
OUT_OF_RANGE_COPY = E.cudaErrorInvalidValue


def code(row: str):
    return UNCONFIRMED[row][0]


# row -> what was searched for the exact code and did not pin it (kept so the next search
# starts where this one stopped). Settled and moved to the rules docs with their sources:
# V1, M5 (docs/driver-rules.md).
SEARCHED: dict[str, str] = {
    "L7": "docs state the one-context restriction only; no report of a second context's open "
          "(commsim has no cuCtxCreate, so the row is unreachable)",
    "L13": "cudaIpcOpenMemHandle docs (flags must be the lazy flag); no report or library "
           "check of another flag's code",
    "V4": "NVIDIA/nccl src/allocator.cc (v2.23.4-1 to v2.30.7-1) retries a FABRIC cuMemCreate "
          "answered NOT_PERMITTED or NOT_SUPPORTED without FABRIC (for this code), but "
          "pytorch/pytorch#173606 (Jan 2026) says cuMemCreate accepts FABRIC on devices that "
          "cannot use it and the export then fails 'invalid argument' (the device's attribute "
          "not stated): conflicting, kept",
    "V7": "NCCL src/mnnvl.cc, src/graph/paths.cc (v2.30.7-1) and FlashInfer mnnvl.py check "
          "clusterUuid before any import, so no caller meets the code",
    "V10": "cuda.h cuMemMap return list; issues on cuMemMap errors (microsoft/mscclpp#451: a "
           "granularity mismatch, not a double map)",
    "V12": "cuda.h cuMemUnmap; issues on partial unmaps found only other APIs' (munmap, HIP)",
    "V15": "NVIDIA/cuda-python#2345 (freeing a reservation never made 'can' give "
           "CUDA_ERROR_INVALID_VALUE: a reading, not a run), NVlabs/instant-ngp#954 (INVALID_VALUE "
           "from cuMemAddressFree of an arena still mapped: another condition)",
    "M1": "NCCL src/transport/nvls.cc (v2.30.7-1), PyTorch c10d cuda/utils.cpp "
          "(deviceSupportsMulticast, pytorch/pytorch#136577), UCC tl_cuda_nvls, "
          "ThunderKittens#149 and vllm-project/vllm#33274 all read attribute 132 before "
          "cuMulticastCreate, so no report shows the create's code",
    "M6": "cuda.h cuMulticastUnbind (undefined); no report",
    "X1": "NVIDIA/cuda-python#27 (INVALID_VALUE from a NULL out-pointer, another cause)",
    "X2": "cuda.h cuMemCreate / cuMulticastBindMem return lists; no report of FABRIC create "
          "during fabric start-up",
    "X3": "cuda.h cuMulticastAddDevice return list; no report",
    "X4": "no report of importing an fd number the process does not hold",
    "I3": "kubernetes-sigs/dra-driver-nvidia-gpu#294 (the import fails; its code is not shown)",
    "MC4": "NVIDIA/nvbandwidth#35 (multicast needs IMEX; no code shown)",
    "H5": "microsoft/mscclpp#165, openucx/ucx#3030, deepseek-ai/DeepEP#497 (free before close "
          "is undefined; no reopen of a stale handle reported)",
    "W6": "vllm-project/vllm#55906 (201 from UCX's log, not from the CUDA call itself), "
          "NVIDIA/nccl#360",
    "CG3": "cudaStreamBeginCapture docs; no report of IPC calls inside a capture",
    "CG4": "cudaStreamBeginCapture / cudaStreamEndCapture docs (return lists omit the case); "
           "HIP's reimplementation (ROCm/rocm-systems#11589) is not CUDA's evidence",
}


# Granularity: typical values are UNCONFIRMED; 2 MiB matches what FlashInfer rounds to
# for both allocation granularities and the multicast granularity.
GRANULARITY_MIN = 2 << 20
GRANULARITY_RECOMMENDED = 2 << 20
MULTICAST_GRANULARITY_MIN = 2 << 20
MULTICAST_GRANULARITY_RECOMMENDED = 2 << 20
HOST_PAGE = 4096
# Peer mappings one importer may hold before cudaErrorTooManyPeers (row L12); the real limit
# is per GPU generation and not documented, so it is set high enough never to bite by accident.
MAX_PEER_MAPPINGS = 4096
# Row H2: drivers before this branch answer a second open of one handle in one context with
# cudaErrorAlreadyMapped; later ones return the same pointer (the refcount sentence of the
# current cuIpcOpenMemHandle docs). The branch where it changed is UNCONFIRMED. Searched:
# openucx/ucx#3192 (an NVIDIA engineer, 2020: "cuda 11.1 will allow opening a handle multiple
# times", i.e. R455), against microsoft/mscclpp#165 (2023) and openucx/ucx#11216 (2026) still
# meeting "resource already mapped" (whether in one context is not said). Kept at 470 until a
# release note or a GPU run pins it; the run's driver version decides (commsim/versions.py).
IPC_REOPEN_REFCOUNT_SINCE = 470
# Row H6: an open of a legacy handle whose memory is gone (freed, or its exporter exited)
# is answered by the checks its device alone decides first (L8 host, W6 namespace, L10/P1/P2
# peer access), then by H5's code. The CUDA docs (cudaIpcOpenMemHandle, CUDA 12/13 runtime
# API) list the codes, not the order the driver checks in: UNCONFIRMED. Answered this way,
# an importer's error does not depend on whether its exporter has exited yet, which the
# program cannot order and which real processes race on.
IPC_DEVICE_RULES_BEFORE_GONE = True
