#!/usr/bin/env bash
# Run ON THE GPU MACHINE, from the repository root, before scripts/device-suite.sh. That machine has
# python3 with torch (2.11 + CUDA), numpy, matplotlib, pyyaml, pillow, tensorboard and pytest, but no
# internet and nothing of ours: this installs torch-pruning and cloudpickle from the carried .whl/ and
# scaletrain from the working tree (editable, no dependencies: torch stays the machine's own), offline,
# then checks that the carried data (.device-data/, made by scripts/device-prepare.sh) is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
pip_offline() { "$PYTHON" -m pip install -q --disable-pip-version-check --no-index --no-deps "$@"; }

"$PYTHON" - <<'PY'
import sys
import torch
major, minor = (int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}")
if (major, minor) < (2, 11):
    sys.exit(f"scaletrain needs torch >= 2.11, this python has {torch.__version__}")
PY

if ! "$PYTHON" -c "import torch_pruning, cloudpickle" 2>/dev/null; then
    ls .whl/torch_pruning-*.whl .whl/cloudpickle-*.whl >/dev/null 2>&1 || { echo "no torch-pruning or cloudpickle wheel in .whl/: run scripts/device-prepare.sh here first and carry .whl" >&2; exit 2; }
    pip_offline .whl/*.whl
fi
# Editable, so the `scaletrain` command runs this working tree. Should the machine's setuptools refuse,
# scripts/device-suite.sh still runs everything with PYTHONPATH=src (python -m scaletrain).
pip_offline --no-build-isolation -e . || echo "note: pip could not install scaletrain; the suite runs it from src/" >&2

for file in fashion-mnist/train-images-idx3-ubyte.gz fashion-mnist/t10k-labels-idx1-ubyte.gz ptb/ptb.valid.txt; do
    [ -f ".device-data/$file" ] || { echo "missing .device-data/$file: run scripts/device-prepare.sh here first and carry .device-data" >&2; exit 2; }
done
PYTHONPATH=src "$PYTHON" -c "import scaletrain, torch_pruning; print('scaletrain', scaletrain.__version__, 'torch-pruning', torch_pruning.__version__)"
