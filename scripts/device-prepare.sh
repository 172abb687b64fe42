#!/usr/bin/env bash
# Run HERE (online), before a call to the GPU machine: fill the git-ignored folders that must travel with
# the working tree, because that machine has no internet and nothing of ours.
#   .whl/          wheels its python3 (3.12, x86_64) lacks: torch-pruning and cloudpickle, at the versions our venv has
#   .device-data/  fashion-mnist/ (the four IDX .gz files) and ptb/ (Mikolov's valid/test texts)
# Prints the carry list and the total size that travels (the limit is 64 MiB, working tree included).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
FASHION_MNIST=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
PTB=${PTB:-../shared/datasets/ptb}
LIMIT_BYTES=$((64 * 1024 * 1024))

for folder in .whl/ .device-data/; do
    grep -qxF "$folder" .gitignore || echo "$folder" >>.gitignore
done

# The versions our venv runs are the ones the tests passed with; both wheels are pure Python (py3-none-any).
pruning=$("$PYTHON" -m pip show torch-pruning 2>/dev/null | sed -n 's/^Version: //p')
[ -n "$pruning" ] || { echo "torch-pruning is not installed in $PYTHON's environment: run scripts/setup.sh" >&2; exit 2; }
cloudpickle=$("$PYTHON" -m pip show cloudpickle 2>/dev/null | sed -n 's/^Version: //p')
[ -n "$cloudpickle" ] || { echo "cloudpickle is not installed in $PYTHON's environment: run scripts/setup.sh" >&2; exit 2; }
rm -rf .whl && mkdir -p .whl
"$PYTHON" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl \
    "torch-pruning==$pruning" "cloudpickle==$cloudpickle" 2> >(grep -v '^WARNING: Location ' >&2)

rm -rf .device-data && mkdir -p .device-data/fashion-mnist .device-data/ptb
for name in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
    [ -f "$FASHION_MNIST/$name.gz" ] || { echo "missing $FASHION_MNIST/$name.gz (apt-get install dataset-fashion-mnist)" >&2; exit 2; }
    cp "$FASHION_MNIST/$name.gz" .device-data/fashion-mnist/
done
# Offline copies of PTB often hold only valid and test; the LSTM then trains on valid (-o train_split=valid).
copied=0
for name in ptb.train.txt ptb.valid.txt ptb.test.txt; do
    if [ -f "$PTB/$name" ]; then cp "$PTB/$name" .device-data/ptb/ && copied=$((copied + 1)); fi
done
[ -f .device-data/ptb/ptb.valid.txt ] || { echo "missing $PTB/ptb.valid.txt: the LSTM cannot run there" >&2; exit 2; }

# What travels: tracked and untracked-but-not-ignored files, plus the carried folders.
tree_bytes=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{s+=$1} END {print s+0}')
carried_bytes=$(du -sb .whl .device-data | awk '{s+=$1} END {print s}')
total=$((tree_bytes + carried_bytes))
echo "wheels: $(ls .whl | tr '\n' ' ')"
echo "data: fashion-mnist (4 files), ptb ($copied files)"
awk -v t="$tree_bytes" -v c="$carried_bytes" 'BEGIN { printf "working tree %.1f MiB + carried %.1f MiB = %.1f MiB (limit 64 MiB)\n", t / 1048576, c / 1048576, (t + c) / 1048576 }'
[ "$total" -lt "$LIMIT_BYTES" ] || { echo "too large to carry" >&2; exit 1; }
echo 'carry: [".whl", ".device-data"]'
