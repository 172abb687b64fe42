#!/usr/bin/env bash
# The GPU machine's suite: GPU tests, GPU figures and CPU measurements in one command of at most 8 minutes,
# everything written under $OUT (at most 8 files). On the GPU machine, after scripts/device-setup.sh:
#                            bash scripts/device-suite.sh                  (issue 50's visit, the default)
#                            bash scripts/device-suite.sh --visit issue24  (the visits of 2026-11-26/27)
# Here, or in CI (every part of both visits on the CPU at tiny sizes, about 1.5-2 minutes):
#                            OUT=/tmp/suite bash scripts/device-suite.sh --dry-run
# The logic is benchmarks/device_suite.py; this only finds python and the paths.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
OUT=${OUT:-device-suite-out}
export PYTHONPATH="$PWD/src:$PWD/benchmarks:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export SCALETRAIN_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} PYTHONUNBUFFERED=1
# 480 s is the suite's promise; the Python side ends its parts before 450 s, this is the last resort.
exec timeout -k 10 475 "$PYTHON" benchmarks/device_suite.py --out "$OUT" "$@"
