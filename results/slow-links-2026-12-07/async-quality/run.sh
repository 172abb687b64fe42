#!/bin/bash
# The three loopback runs of README.md's "Asynchronous owners: quality" (from the repository root; about 2 min each
# on 2 cores). Usage: bash results/slow-links-2026-12-07/async-quality/run.sh [folder for the runs, default /tmp/aq]
S="$(pwd)/.venv/bin/scaletrain"
mkdir -p "${1:-/tmp/aq}" && cd "${1:-/tmp/aq}" || exit 2
COMMON="resnet20 -o dataset=fashion-mnist -o train_samples=12800 --data-dir /usr/share/datasets/fashion-mnist --epochs 6
--threads 1 --seed 0 --lr-schedule cosine --batch-size 64 --optimizer adamw --weight-decay 1e-4 --lr 2e-3 --workers 2
--strategy diloco-split --sync-every 128 --progress off"
run() { name=$1; shift; "$S" train $COMMON "$@" --out "$PWD/$name" > "$PWD/$name.log" 2>&1; echo "$name rc=$? $(tail -1 "$PWD/$name.log")"; }
run async-localsgd -S outer_exchange=sharded-async -S outer_lr=1 -S outer_momentum=0
run sync-localsgd -S outer_exchange=sharded -S outer_lr=1 -S outer_momentum=0
run async-nesterov -S outer_exchange=sharded-async
