#!/usr/bin/env bash
# Device check for a machine with one NVIDIA GPU, in under 5 minutes, with no network.
#
#   scripts/device_check.sh            # results go to $OUT (default: ./device-check-out)
#
# Four steps, each under its own watchdog (the budgets add up to 280 s):
# 1. commsim/devicecheck/check.py (150 s): two processes on GPU 0 exchange legacy IPC and
#    POSIX-fd handles (the fd over a real AF_UNIX socket with SCM_RIGHTS) and run every peer
#    kernel over the mapped buffers with exact numerics; `commsim probe` describes the machine
#    and the hardware's answers to cuMemCreate(FABRIC) and a one-device cuMulticastCreate must
#    equal what the simulator predicts on that scenario; the one-shot kernel's bandwidth is
#    set against a device-to-device copy of the same bytes.
# 2. commsim/devicecheck/e2e.py under torchrun (40 s): the communicator end to end, one process
#    per GPU, in the simulator's default backend order (multicast and symm included).
# 3. tests/conformance under COMMSIM_DEVICE=cuda (90 s): every conformance row this host can
#    stand in for, on the real driver; the others skip saying what differs.
# 4. scripts/device_report.py: $OUT/summary.md, $OUT/rows.tsv (one line per conformance row),
#    $OUT/figures.json, from the three steps' outputs.
# Exit 0 when everything agrees, 1 on a disagreement, 2 without a GPU (or without what the
# check needs), 3 when a watchdog fired.
#
# Python: .venv when `make venv` built one; otherwise the machine's python3 when it already
# holds torch, cuda-python, NVML and numpy (a GPU image), with what it lacks (greenlet) from
# wheels carried in .whl/ (docs/device.md says how to fetch them); otherwise `make venv`.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/device-check-out}"
mkdir -p "$OUT"
t0=$(date +%s)

if [ -x .venv/bin/python ] && [ -f .venv/.installed ]; then
  PY=.venv/bin/python
elif python3 -c 'import torch, numpy, pynvml, cuda.bindings.driver' 2>/dev/null; then
  PY=python3
  site="$(mktemp -d)"
  if compgen -G '.whl/*.whl' >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/*.whl \
      || { echo "device check: installing the carried wheels in .whl/ failed" >&2; exit 2; }
  fi
  export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}"
  if ! python3 -c 'import greenlet' 2>/dev/null; then
    echo "device check: python3 lacks greenlet; carry its wheel in .whl/ (see docs/device.md)" >&2
    exit 2
  fi
else
  make venv || exit 2
  PY=.venv/bin/python
fi
echo "device check: python $($PY -c 'import sys; print(sys.version.split()[0])') ($PY)"

# Compiled kernels are cached beside the results, so a second run skips NVRTC.
export COMMSIM_KERNEL_CACHE="${COMMSIM_KERNEL_CACHE:-$OUT/commsim-kernels}"
rc=0
step() {  # step NAME SECONDS CMD...: run under a watchdog, log to $OUT/NAME.log, keep the worst rc
  local name=$1 secs=$2; shift 2
  local r=0
  timeout --signal=KILL "$secs" "$@" > >(tee "$OUT/$name.log") 2>&1 || r=$?
  case "$r" in
    0) ;;
    137) echo "device check: $name: watchdog fired after $secs s" >&2; r=3 ;;
    2) ;;
    *) r=1 ;;
  esac
  echo "$name $r" >>"$OUT/steps.txt"
  if [ "$r" -eq 2 ] && [ "$name" = check ]; then exit 2; fi   # no GPU: nothing else can run
  [ "$r" -gt "$rc" ] && rc=$r
  return 0
}
: >"$OUT/steps.txt"
step check 150 "$PY" -m commsim.devicecheck --out "$OUT"
ngpu="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
[ "${ngpu:-0}" -ge 1 ] || ngpu=1
step e2e 40 "$PY" -m torch.distributed.run --standalone --nproc-per-node="$ngpu" -m commsim.devicecheck.e2e --sizes 4096,262144
step conformance 90 env COMMSIM_DEVICE=cuda "$PY" -m pytest tests/conformance -q -p no:cacheprovider \
  -p no:xdist -rs --junitxml="$OUT/conformance.xml"
"$PY" scripts/device_report.py --out "$OUT" --seconds "$(( $(date +%s) - t0 ))" || rc=1
exit "$rc"
