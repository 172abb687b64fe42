"""``gpt``: the transformer language model trains, splits its batches over 4 workers exactly as one process
computes them under every strategy (without clipping: a sharded server clips each owner's share,
docs/distributed.md), and keeps its tied embedding one parameter through training, a narrowed layer and
``load_model``. Small shapes on generated Penn Treebank-format text."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.helpers import assert_same_weights
from tests.helpers import model_weights as weights

import scaletrain
from scaletrain.workloads import create_workload

TINY = {"layers": "1", "heads": "2", "width": "16", "context": "8", "dropout": "0", "vocab_size": "50"}
COMMON = {"epochs": 2, "batch_size": 8, "lr_warmup": 4, "clip_norm": 0, "threads": 1}
COMMON |= {"progress": "off", "tensorboard": False}


@pytest.fixture(scope="module")
def ptb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import numpy as np

    rng = np.random.default_rng(1)
    words = [f"w{i}" for i in range(40)] + ["<unk>", "N"]
    folder = tmp_path_factory.mktemp("ptb")
    for split, lines in (("train", 300), ("valid", 40), ("test", 40)):
        text = "".join(" " + " ".join(rng.choice(words, size=int(rng.integers(3, 12)))) + " \n" for _ in range(lines))
        (folder / f"ptb.{split}.txt").write_text(text)
    return folder


@pytest.fixture(scope="module")
def alone(ptb: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("gpt-alone") / "run"
    return scaletrain.train("gpt", options=TINY, data_dir=ptb, out=out, **COMMON), out


def test_it_trains_with_adamw_and_a_cosine_schedule_by_default(alone: tuple[dict, Path]) -> None:
    summary, _ = alone
    assert (summary["optimizer"], summary["lr_schedule"], summary["lr_warmup"]) == ("AdamW", "cosine", 4)
    assert summary["metric"] == "test_perplexity" and summary["test_perplexity"] < 45  # 42 words: guessing is 45
    model = create_workload("gpt", TINY).build_model()
    assert model.output.weight is model.embedding.weight
    assert sum(p.numel() for p in model.parameters()) < sum(t.numel() for t in model.state_dict().values())


@pytest.mark.multiprocess
@pytest.mark.parametrize("spec", ["allreduce-split", "ps-central-split", "ps-sharded-split"])
def test_four_split_workers_equal_one_process_and_the_tie_holds(
    spec: str, ptb: Path, alone: tuple[dict, Path], tmp_path: Path
) -> None:
    summary = scaletrain.train("gpt", options=TINY, data_dir=ptb, out=tmp_path / "run", workers=4, strategy=spec,
                               **COMMON)  # fmt: skip
    assert summary["steps"] == alone[0]["steps"] > 0
    assert_same_weights(weights(tmp_path / "run"), weights(alone[1]))
    model = scaletrain.load_model(tmp_path / "run")
    assert model.output.weight is model.embedding.weight
    saved = torch.load(tmp_path / "run" / "model.pt", weights_only=False)
    state = saved.get("model", saved)
    assert torch.equal(state["output.weight"], state["embedding.weight"])


@pytest.mark.multiprocess
def test_a_narrowed_layer_keeps_the_tie(ptb: Path, tmp_path: Path) -> None:
    narrow = {"technique": "narrow", "technique_options": {"layer": "blocks.0.mlp.0", "fraction": "0.5", "epoch": "1"}}
    summary = scaletrain.train("gpt", options=TINY, data_dir=ptb, out=tmp_path / "run", workers=2,
                               strategy="ps-sharded-split", **COMMON, **narrow)  # fmt: skip
    assert summary["architecture"]["blocks.0.mlp.0"]["out"] == 32
    model = scaletrain.load_model(tmp_path / "run")
    assert model.output.weight is model.embedding.weight and model.blocks[0].mlp[0].out_features == 32
