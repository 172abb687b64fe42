#!/usr/bin/env bash
# Set up scaletrain on a fresh machine: a virtual environment in .venv with the CPU build of torch,
# the package (editable) with its test tools, and Fashion-MNIST from Debian's package when root.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && [ ! -e /usr/share/datasets/fashion-mnist ]; then
    apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist >/dev/null
elif [ ! -e /usr/share/datasets/fashion-mnist ]; then
    echo "note: Fashion-MNIST is not installed; as root run 'apt-get install dataset-fashion-mnist'," \
         "or scaletrain downloads it (checksum-verified) on first use when online." >&2
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
# torch first and pinned: an unpinned torch would pull GBs of CUDA packages on a CPU machine.
# pip warns "Location ... is ignored" for each index of this machine's local mirror setup: not ours to fix, and
# it is not a problem of the install, so those lines are left out; every other message stays.
quiet_pip() { .venv/bin/pip install -q --disable-pip-version-check "$@" 2> >(grep -v '^WARNING: Location ' >&2); }
quiet_pip torch==2.13.0
quiet_pip -e ".[dev]"
