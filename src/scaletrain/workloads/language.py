"""What the Penn Treebank language models share: the words (Mikolov's version through :mod:`scaletrain.data.ptb`),
the metric (test perplexity, and validation perplexity where the validation text was not trained on) and the
chance level (a uniform guess over the vocabulary). Each model says how it computes a stream's perplexity."""

from __future__ import annotations

from abc import abstractmethod
from pathlib import Path
from typing import Any

import torch
from torch import nn

from scaletrain.data.ptb import PennTreebank, find_ptb, load_ptb
from scaletrain.workloads.base import Workload

__all__ = ["PennTreebankWorkload", "check_options"]


def check_options(options: Any, whole: tuple[str, ...]) -> None:
    """Refuse a language model's options: the ``whole`` ones below 1, ``dropout`` outside [0, 1), a
    ``train_split`` other than ``train`` or ``valid``."""
    for name in whole:
        if getattr(options, name) < 1:
            raise ValueError(f"workload option {name} must be ≥ 1, got {getattr(options, name)}")
    if not 0.0 <= options.dropout < 1.0:
        raise ValueError(f"workload option dropout must be in [0, 1), got {options.dropout}")
    if options.train_split not in ("train", "valid"):
        raise ValueError(f"workload option train_split must be 'train' or 'valid', got {options.train_split!r}")


class PennTreebankWorkload(Workload):
    """A language model on Penn Treebank; its options hold ``vocab_size`` and ``train_split``."""

    dataset = "Penn Treebank, Mikolov's version (10,000 words; ~930k train / 74k valid / 82k test words)"
    metric = "test_perplexity"

    def load_data(self, data_dir: Path | None, *, download: bool = True) -> PennTreebank:
        return load_ptb(find_ptb(data_dir), train_split=self.options.train_split, vocab_size=self.options.vocab_size)

    def chance_quality(self, data: PennTreebank) -> float:
        """The perplexity of guessing every word of the vocabulary alike."""
        return float(self.options.vocab_size)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, data: PennTreebank) -> dict[str, float]:
        results = {"test_perplexity": self.perplexity(model, data.test)}
        if data.valid is not None and self.options.train_split != "valid":
            results["valid_perplexity"] = self.perplexity(model, data.valid)
        return results

    @abstractmethod
    def perplexity(self, model: nn.Module, stream: torch.Tensor) -> float:
        """e^(mean negative log-likelihood per word) of ``model`` over the word ids ``stream``."""
