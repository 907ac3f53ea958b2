"""What mpi4py's calls give back and raise: Open MPI's constants and error classes,
`MPI.Exception`, `MPI.Status` and `MPI.Request` (mpi.h; mpi4py.MPI reference)."""

from __future__ import annotations

from typing import Any


ANY_SOURCE = -1          # Open MPI mpi.h: MPI_ANY_SOURCE
ANY_TAG = -1             # MPI_ANY_TAG
PROC_NULL = -2           # MPI_PROC_NULL
ROOT = -4                # MPI_ROOT
UNDEFINED = -32766       # MPI_UNDEFINED
COMM_TYPE_SHARED = 0     # MPI_COMM_TYPE_SHARED (first of Open MPI's split-type enum)
OMPI_COMM_TYPE_HOST = 9  # OMPI_COMM_TYPE_HOST (tenth of that enum; TensorRT-LLM and
#                          FlashInfer define it as 9 themselves: mpi4py does not export it)

# Open MPI's error classes (mpi.h) and strings (ompi/errhandler/errcode.c).
ERR_COMM, ERR_RANK, ERR_ROOT, ERR_TAG, ERR_ARG, ERR_TRUNCATE, ERR_OTHER = 5, 6, 8, 4, 13, 15, 16
ERR_TEXT = {ERR_COMM: "MPI_ERR_COMM: invalid communicator", ERR_RANK: "MPI_ERR_RANK: invalid rank",
            ERR_ROOT: "MPI_ERR_ROOT: invalid root", ERR_TAG: "MPI_ERR_TAG: invalid tag",
            ERR_ARG: "MPI_ERR_ARG: invalid argument of some other kind",
            ERR_TRUNCATE: "MPI_ERR_TRUNCATE: message truncated",
            ERR_OTHER: "MPI_ERR_OTHER: known error not in list"}


class Exception(RuntimeError):      # noqa: A001  (mpi4py's name: MPI.Exception)
    """mpi4py.MPI.Exception: an MPI error code; str() is the library's error string."""

    def __init__(self, ierr: int = ERR_OTHER, detail: str = "") -> None:
        self.ierr = int(ierr)
        text = ERR_TEXT.get(self.ierr, f"MPI error {self.ierr}")
        super().__init__(f"{text} ({detail})" if detail else text)

    def Get_error_code(self) -> int:
        return self.ierr

    def Get_error_class(self) -> int:
        return self.ierr

    def Get_error_string(self) -> str:
        return ERR_TEXT.get(self.ierr, f"MPI error {self.ierr}")

    error_code = property(Get_error_code)
    error_class = property(Get_error_class)


class Status:
    """mpi4py.MPI.Status: source and tag of a received message."""

    def __init__(self) -> None:
        self.source = ANY_SOURCE
        self.tag = ANY_TAG
        self.error = 0

    def Get_source(self) -> int:
        return self.source

    def Get_tag(self) -> int:
        return self.tag

    def Get_error(self) -> int:
        return self.error


class Request:
    """mpi4py.MPI.Request of isend / irecv: isend completes eagerly; irecv receives on
    wait() (or test(), when a message is there)."""

    def __init__(self, recv: Any = None, done: bool = False) -> None:
        self._recv = recv
        self._done = done
        self._value: Any = None

    def wait(self, status: Status | None = None) -> Any:
        if not self._done:
            self._value = self._recv(status)
            self._done = True
        return self._value

    def test(self, status: Status | None = None) -> tuple[bool, Any]:
        # UNCONFIRMED: a test() that does not block is not simulated for a pending irecv;
        # it completes the receive (a message that never comes is then a diagnosed hang).
        return True, self.wait(status)

    Wait = wait

    def Test(self, status: Status | None = None) -> bool:
        return self.test(status)[0]
