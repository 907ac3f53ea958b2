"""NCCL's results, its error strings and its WARN / INFO lines, as NCCL prints them.

Sources (NVIDIA/nccl, tag v2.27.3-1):
- ncclResult_t values and `ncclGetErrorString` texts: src/nccl.h.in, src/init.cc.
- A failing CUDA runtime call inside NCCL is `WARN("Cuda failure '%s'", cudaGetErrorString)`
  and ncclUnhandledCudaError (CUDACHECK, src/include/checks.h); a failing driver call is
  `WARN("Cuda failure %d '%s'", err, cuGetErrorString)` and ncclUnhandledCudaError
  (CUCHECK, src/include/cudawrap.h); a failing system call is `WARN("Call to <name> failed:
  %s", strerror)` and ncclSystemError (SYSCHECK, checks.h).
- `ncclGetLastError` is the text of the last WARN (src/debug.cc keeps it in ncclLastError).
- A WARN line is "\\n<host>:<pid>:<tid> [<cudaDev>] <file>:<line> NCCL WARN <text>" and an
  INFO line "<host>:<pid>:<tid> [<cudaDev>] NCCL INFO <text>" (src/debug.cc); NCCL_DEBUG=WARN
  prints WARN lines, INFO prints both. The file:line of a WARN is left out here (it changes
  with every release); the thread id is printed as the pid (UNCONFIRMED: NCCL prints the
  kernel tid of the calling thread).
"""

from __future__ import annotations

import errno as _errno
import os
from dataclasses import dataclass, field
from typing import Any

from commsim.driver import error_name, error_string

SUCCESS, UNHANDLED_CUDA, SYSTEM, INTERNAL, INVALID_ARGUMENT, INVALID_USAGE, REMOTE, \
    IN_PROGRESS = range(8)
RESULT_NAMES = ("ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
                "ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress")
RESULT_CODES = {n: c for c, n in enumerate(RESULT_NAMES)}
ERROR_STRINGS = (
    "no error",
    "unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
    "unhandled system error (run with NCCL_DEBUG=INFO for details)",
    "internal error - please report this issue to the NCCL developers",
    "invalid argument (run with NCCL_DEBUG=WARN for details)",
    "invalid usage (run with NCCL_DEBUG=WARN for details)",
    "remote process exited or there was a network error",
    "NCCL operation in progress",
)


def error_text(code: int) -> str:
    """ncclGetErrorString(code)."""
    return ERROR_STRINGS[code] if 0 <= code < len(ERROR_STRINGS) else "unknown result code"


class NcclError(Exception):
    """An NCCL call's failure: its ncclResult_t `code` and the WARN text that went with it."""

    def __init__(self, code: int, warn: str, api: str = "", cause: str = "",
                 origin: int | None = None) -> None:
        super().__init__(f"{RESULT_NAMES[code]}: {warn}")
        self.code = code
        self.warn = warn
        self.api = api              # the CUDA / system call that failed, when one did
        self.cause = cause          # that call's CUDA result name (CUDA_ERROR_OUT_OF_MEMORY ...)
        self.origin = origin        # ncclRemoteError: the comm rank whose step failed
        self.decision: Any = None   # the search's NcclDecision, where init got that far

    @property
    def name(self) -> str:
        return RESULT_NAMES[self.code]


@dataclass
class NcclLog:
    """One process's NCCL debug output: every line NCCL_DEBUG would print at INFO, and which
    of them the process's NCCL_DEBUG level shows (`shown`)."""

    host: str
    pid: int
    device: int
    level: str = ""                 # NCCL_DEBUG: "", "WARN", "INFO", "TRACE"
    lines: list[tuple[str, str]] = field(default_factory=list)     # (WARN|INFO, text)
    last_error: str = ""

    def _prefix(self) -> str:
        return f"{self.host}:{self.pid}:{self.pid} [{self.device}]"

    def warn(self, text: str) -> None:
        self.last_error = text
        self.lines.append(("WARN", text))

    def info(self, text: str) -> None:
        self.lines.append(("INFO", text))

    def shown(self) -> list[str]:
        """The lines this process prints under its NCCL_DEBUG (src/debug.cc levels)."""
        lvl = self.level.upper()
        if lvl not in ("WARN", "INFO", "TRACE"):
            return []
        out = []
        for kind, text in self.lines:
            if kind == "WARN":
                out.append(f"\n{self._prefix()} NCCL WARN {text}")
            elif lvl != "WARN":
                out.append(f"{self._prefix()} NCCL INFO {text}")
        return out


def cuda_failure(log: NcclLog, api: str, result: Any) -> NcclError:
    """CUDACHECK / CUCHECK: the WARN and ncclUnhandledCudaError for a failed CUDA call.
    Runtime codes print their string, driver codes their number and string."""
    code = int(result)
    text = error_string(result)
    warn = (f"Cuda failure '{text}'" if api.startswith("cuda")
            else f"Cuda failure {code} '{text}'")
    log.warn(warn)
    return NcclError(UNHANDLED_CUDA, warn, api, error_name(result))


def system_failure(log: NcclLog, call: str, err: int) -> NcclError:
    """SYSCHECK: the WARN and ncclSystemError for a failed system call."""
    warn = f"Call to {call} failed: {os.strerror(err)}"
    log.warn(warn)
    return NcclError(SYSTEM, warn, call)


def shm_failure(log: NcclLog, create: bool, path: str, size: int, err: int) -> NcclError:
    """ncclShmOpen's failure (src/misc/shmutils.cc): its WARN, ncclSystemError."""
    warn = (f"Error while {'creating' if create else 'attaching to'} shared memory segment "
            f"{path} (size {size}), error: {os.strerror(err)} ({err})")
    log.warn(warn)
    return NcclError(SYSTEM, warn, "open" if not create else "fallocate")


ENOENT, ENOSPC = _errno.ENOENT, _errno.ENOSPC
