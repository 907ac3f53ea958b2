#!/usr/bin/env bash
# Device check for a machine with one NVIDIA GPU, in under 5 minutes (device/check.py):
# two processes on GPU 0 exchange legacy IPC and POSIX-fd handles (the fd over a real AF_UNIX
# socket with SCM_RIGHTS) and run every peer kernel over the mapped buffers with exact
# numerics; `commsim probe` describes the machine and the hardware's answers to
# cuMemCreate(FABRIC) and a one-device cuMulticastCreate must equal what the simulator
# predicts on that scenario; the one-shot kernel's bandwidth is set against a device-to-device
# copy of the same bytes. Prints a summary; exits 0 when everything agrees, 1 on a
# disagreement, 2 without a GPU, 3 when the watchdog finds a hang.
#
#   scripts/device_check.sh            # results also go to $OUT when it is set
set -euo pipefail
cd "$(dirname "$0")/.."

# The venv, as `make venv` builds it (the same commands where make is missing).
if [ ! -x .venv/bin/python ] || [ ! -f .venv/.installed ] || [ pyproject.toml -nt .venv/.installed ]; then
  if command -v make >/dev/null 2>&1; then
    make venv
  else
    PY="$(command -v python3.11 || command -v python3)"
    "$PY" -m venv .venv
    .venv/bin/pip install --quiet torch==2.13.0
    .venv/bin/pip install --quiet -e '.[test]'
    touch .venv/.installed
  fi
fi

# Compiled kernels are cached beside the results, so a second run skips NVRTC.
export COMMSIM_KERNEL_CACHE="${COMMSIM_KERNEL_CACHE:-${OUT:-/tmp}/commsim-kernels}"
exec timeout --signal=KILL 290 .venv/bin/python -m device.check ${OUT:+--out "$OUT"} "$@"
