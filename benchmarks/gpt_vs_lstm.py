"""``gpt`` with its defaults against the LSTM's 2 epochs (Zaremba's small model, the seeds' figure 448): test
perplexity and training time, side by side, trained on ``ptb.valid.txt`` (the training text is not available
offline) with the same threads, one run after the other, ``--repeats`` times alternating.

Read from each run's ``summary.json`` and its wall clock: test perplexity, ``train_seconds`` (the timed steps)
and the run's wall seconds (data, evaluation and start included).

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/gpt_vs_lstm.py [--repeats 1 --threads 1 --data-dir ...]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from training_runs import run_records, train_run

RUNS = {"ptb-lstm": ["--epochs", "2"], "gpt": []}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data-dir", type=Path, default=Path(__file__).resolve().parents[2] / "shared/datasets/ptb")
    args = parser.parse_args()
    if not (args.data_dir / "ptb.valid.txt").is_file():
        parser.error(f"no ptb.valid.txt in {args.data_dir}; give --data-dir with the Penn Treebank files")
    rows: dict[str, list[tuple[float, float, float]]] = {name: [] for name in RUNS}
    with tempfile.TemporaryDirectory(prefix="gpt-vs-lstm-") as folder:
        for repeat in range(args.repeats):
            for name, flags in RUNS.items():
                out = Path(folder) / f"{name}-{repeat}"
                common = ["-o", "train_split=valid", "--data-dir", str(args.data_dir), "--threads", str(args.threads)]
                wall = train_run(name, out, [*common, *flags])
                _, summary = run_records(out)
                rows[name].append((summary["test_perplexity"], summary["train_seconds"], wall))
    print(f"{'workload':9} {'test perplexity':>15} {'train seconds':>13} {'wall seconds':>12}")
    for name, results in rows.items():
        medians = [statistics.median(column) for column in zip(*results, strict=True)]
        print(f"{name:9} {medians[0]:15.1f} {medians[1]:13.1f} {medians[2]:12.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
