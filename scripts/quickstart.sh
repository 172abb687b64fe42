#!/usr/bin/env bash
# The README's first command: set everything up, then run the main job on this machine — a short
# scaling sweep of LeNet on Fashion-MNIST over 1 and 2 local workers and three strategies (all-reduce,
# central and sharded parameter server; sync and async), printing each run's progress, then the table
# and the reading. Most of a run's time is starting processes and evaluating; 60 steps keep the
# measured part long enough to read.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
out="bench-results/quickstart-$(date +%Y%m%d-%H%M%S)"
.venv/bin/scaletrain bench lenet --workers 1,2 \
    --strategies allreduce-join,ps-central-async,ps-sharded-join \
    --batch-sizes 64 --steps 60 --out "$out"
echo "pictures beside the report: $out/*.png"
