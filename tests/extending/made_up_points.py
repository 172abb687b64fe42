"""A made-up dataset for tests/extending/test_new_workload.py: labelled 2-D points in a CSV file
(``x,y,label`` per line; ``train.csv`` and ``test.csv``), with its finder (the search order every
dataset is found by, :func:`scaletrain.data.locate.search`) and its reader in this one module."""

from __future__ import annotations

from pathlib import Path

import torch

from scaletrain.data.locate import Findable, cache_dir, search
from scaletrain.errors import DataError

SUBDIR = "points"


def _with_both_files(folder: Path) -> Path | None:
    return folder if (folder / "train.csv").is_file() and (folder / "test.csv").is_file() else None


def find_points(data_dir: Path | None) -> Path:
    """The folder holding ``train.csv`` and ``test.csv``: ``data_dir`` (or its ``points`` subfolder), else
    ``$SCALETRAIN_DATA/points``, else the cache."""
    points = Findable(
        name="points",
        subdirs=("", SUBDIR),
        found_in=(_with_both_files,),
        not_in_data_dir=lambda data_dir, looked: f"--data-dir {data_dir} holds no train.csv and test.csv",
        not_found=lambda searched: f"points not found: searched {', '.join(map(str, searched))}; give --data-dir",
    )
    return search(points, data_dir, [cache_dir() / SUBDIR])


def read_points(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs (N×2 float) and labels (N int64) of one CSV file."""
    rows = [line.split(",") for line in path.read_text(encoding="utf-8").split()]
    if not rows or any(len(row) != 3 for row in rows):
        raise DataError(f"{path} is not a points file (x,y,label per line); write it again")
    inputs = torch.tensor([[float(x), float(y)] for x, y, _ in rows])
    return inputs, torch.tensor([int(label) for _, _, label in rows])


def write_points(folder: Path, *, train: int = 512, test: int = 256, seed: int = 0) -> Path:
    """Two interleaved spirals, one per class (a dataset a linear model cannot fit, a small MLP can)."""
    generator = torch.Generator().manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for name, count in (("train.csv", train), ("test.csv", test)):
        labels = torch.randint(0, 2, (count,), generator=generator)
        radius = torch.rand(count, generator=generator) * 3 + 0.3
        angle = radius * 2.2 + labels * torch.pi
        noise = torch.randn(count, 2, generator=generator) * 0.08
        points = torch.stack([radius * torch.cos(angle), radius * torch.sin(angle)], dim=1) + noise
        lines = [f"{x:.5f},{y:.5f},{int(label)}" for (x, y), label in zip(points.tolist(), labels, strict=True)]
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder
