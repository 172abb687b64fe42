#!/usr/bin/env bash
# The README's first command: set everything up, then run the main job on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/scaletrain train lenet --epochs 1 --out "runs/quickstart-$(date +%Y%m%d-%H%M%S)"
