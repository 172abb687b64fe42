#!/usr/bin/env bash
# The README's first command: set everything up, then run the main job on this machine — a short
# scaling sweep of LeNet on Fashion-MNIST over 1 and 2 local workers and the main strategies.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
out="bench-results/quickstart-$(date +%Y%m%d-%H%M%S)"
.venv/bin/scaletrain bench lenet --workers 1,2 \
    --strategies allreduce-join,ps-central-join,ps-sharded-join,ps-central-async \
    --batch-sizes 64 --steps 60 --out "$out"
echo "open $out/report.md (pictures beside it)"
