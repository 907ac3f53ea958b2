#!/usr/bin/env bash
# Device check for a machine with one NVIDIA GPU, in under 5 minutes (commsim/devicecheck/check.py):
# two processes on GPU 0 exchange legacy IPC and POSIX-fd handles (the fd over a real AF_UNIX
# socket with SCM_RIGHTS) and run every peer kernel over the mapped buffers with exact
# numerics; `commsim probe` describes the machine and the hardware's answers to
# cuMemCreate(FABRIC) and a one-device cuMulticastCreate must equal what the simulator
# predicts on that scenario; the one-shot kernel's bandwidth is set against a device-to-device
# copy of the same bytes. Then the communicator end to end (commsim/devicecheck/e2e.py), one
# process per GPU under torchrun, in the simulator's default backend order (multicast and symm
# included). Prints a summary; exits 0 when everything agrees, 1 on a disagreement, 2 without
# a GPU, 3 when the watchdog finds a hang.
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
rc=0
timeout --signal=KILL 240 .venv/bin/python -m commsim.devicecheck ${OUT:+--out "$OUT"} "$@" || rc=$?
if [ "$rc" -ne 0 ]; then
  exit "$rc"
fi
ngpu="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
ngpu="${ngpu:-1}"; [ "$ngpu" -ge 1 ] || ngpu=1
timeout --signal=KILL 50 .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node="$ngpu" -m commsim.devicecheck.e2e --sizes 4096,262144 || rc=$?
case "$rc" in
  0) ;;
  137) echo "device check: e2e watchdog: the end-to-end run did not finish in 50 s" >&2; exit 3 ;;
  *) exit 1 ;;
esac
