#!/usr/bin/env bash
# Runs the whole suite in parallel. pytest exits 5 when nothing was collected (for example a
# -k filter that matches no test); that is reported, not hidden, and counts as a failure only
# when no filter was given.
set -u
cd "$(dirname "$0")/.."
.venv/bin/python -m pytest -n auto -q "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  if [ "$#" -gt 0 ]; then
    echo "pytest: no tests matched the given arguments ($*)" >&2
    exit 0
  fi
  echo "pytest: no tests were collected; the suite is empty, which is a failure" >&2
  exit 1
fi
exit "$rc"
