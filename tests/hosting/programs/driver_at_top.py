"""A test module that takes cuda-python's driver at its top, as FlashInfer's `comm/mnnvl.py`
does (`from cuda.bindings import driver`), and a program of the same checks: under
`pytest --commsim-machine` it is collected before any rank runs, under `commsim exec` each rank
imports it. Both must reach the simulated driver.

`python driver_at_top.py sees|past` runs one check as a program; the tests run them under the
pytest plugin with each rank seeing one GPU.
- sees: cuInit succeeds and the rank sees one device (the real binding on a machine without
  a driver fails cuInit);
- past: cuDeviceGet of the first ordinal past the visible ones, raised as the error it returns.
"""

import sys

import pytest
from cuda.bindings import driver


def _check(err: driver.CUresult, call: str) -> None:
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{call}: {err.name}")


def sees() -> None:
    _check(driver.cuInit(0)[0], "cuInit")
    err, n = driver.cuDeviceGetCount()
    _check(err, "cuDeviceGetCount")
    assert n == 1, f"{n} devices visible"


def past() -> None:
    _check(driver.cuInit(0)[0], "cuInit")
    _, n = driver.cuDeviceGetCount()
    _check(driver.cuDeviceGet(n)[0], f"cuDeviceGet({n})")


@pytest.mark.commsim(ranks=2, visible="one")
def test_sees():
    sees()


@pytest.mark.commsim(ranks=2, visible="one")
def test_past():
    past()


if __name__ == "__main__":
    {"sees": sees, "past": past}[sys.argv[1]]()
