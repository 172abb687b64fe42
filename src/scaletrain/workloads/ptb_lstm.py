"""``ptb-lstm``: the Zaremba et al. (2014) "small" LSTM language model on Penn Treebank (SPEC §4).

Two LSTM layers of 200 units over a 200-dimensional word embedding, an output layer over the
10,000-word vocabulary, weights initialised uniformly in [−0.1, 0.1], the hidden state carried
from one window of ``num_steps`` words to the next within an epoch (truncated back-propagation),
gradient-norm clipping. Metric: perplexity e^H, H = mean negative log-likelihood per word (SPEC §3).

Loss scale: as in Zaremba's code, the objective is the per-word cross-entropy summed over the
``num_steps`` positions and averaged over the batch rows, so the sources' learning rates apply as
they are (Zaremba: lr 1.0, clip 5; Jäger: lr 0.05). The loss that is logged is the per-word mean.

Offline copies of PTB often hold only the validation and test files; ``-o train_split=valid``
trains on the validation text (and then reports only test perplexity).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from scaletrain.data.ptb import PennTreebank
from scaletrain.data.sampler import Part
from scaletrain.workloads.base import WorkloadDefaults
from scaletrain.workloads.language import PennTreebankWorkload, check_options

__all__ = ["LSTMLanguageModel", "PTBLSTMWorkload", "PTBOptions"]

INIT_SCALE = 0.1
State = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class PTBOptions:
    """Workload options (``-o key=value``)."""

    num_steps: int = 20
    hidden_size: int = 200
    layers: int = 2
    vocab_size: int = 10000
    dropout: float = 0.0
    train_split: str = "train"
    eval_batch_size: int = 10

    def __post_init__(self) -> None:
        check_options(self, ("num_steps", "hidden_size", "layers", "vocab_size", "eval_batch_size"))


class LSTMLanguageModel(nn.Module):
    """Embedding → stacked LSTM → linear over the vocabulary; returns logits and the new state."""

    def __init__(self, vocab_size: int, hidden_size: int, layers: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, hidden_size)
        self.lstm = nn.LSTM(hidden_size, hidden_size, layers, batch_first=True, dropout=dropout)
        self.dropout = nn.Dropout(dropout)
        self.decoder = nn.Linear(hidden_size, vocab_size)
        for weight in self.parameters():
            nn.init.uniform_(weight, -INIT_SCALE, INIT_SCALE)

    def initial_state(self, rows: int) -> State:
        shape = (self.lstm.num_layers, rows, self.lstm.hidden_size)
        weight = self.decoder.weight
        return weight.new_zeros(shape), weight.new_zeros(shape)

    def forward(self, words: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        hidden, state = self.lstm(self.dropout(self.embedding(words)), state)
        return self.decoder(self.dropout(hidden)), state


def _rows(stream: torch.Tensor, rows: int) -> torch.Tensor:
    """Cut a word stream into ``rows`` parallel streams (Zaremba's ptb_iterator layout)."""
    length = len(stream) // rows
    return stream[: rows * length].view(rows, length)


class PTBLSTMWorkload(PennTreebankWorkload):
    """2×200 LSTM language model on Penn Treebank; metric: test perplexity."""

    name = "ptb-lstm"
    defaults = WorkloadDefaults(epochs=4, batch_size=20, lr=1.0, momentum=0.0, clip_norm=5.0)
    options_type = PTBOptions

    def build_model(self) -> LSTMLanguageModel:
        o = self.options
        return LSTMLanguageModel(o.vocab_size, o.hidden_size, o.layers, o.dropout)

    def batches_per_epoch(self, data: PennTreebank, batch_size: int) -> int:
        return (len(data.train) // batch_size - 1) // self.options.num_steps

    def train_batches(
        self,
        data: PennTreebank,
        *,
        epoch: int,
        batch_size: int,
        seed: int,
        part: Part = Part(),
        numbers: range | None = None,
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        # Language-model batches are not shuffled: each row is a continuous stream, so the hidden
        # state stays meaningful across windows. A worker's part is a slice of the rows.
        streams = _rows(data.train, batch_size)[part.slice(batch_size)]
        steps = self.options.num_steps
        # An empty ``numbers`` is no batch at all (an async worker whose share of a short epoch is none).
        for number in range(self.batches_per_epoch(data, batch_size)) if numbers is None else numbers:
            begin = number * steps
            yield streams[:, begin : begin + steps], streams[:, begin + 1 : begin + 1 + steps]

    def initial_state(self, model: nn.Module, batch_rows: int) -> State:
        return model.initial_state(batch_rows)

    def training_loss(
        self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], state: State
    ) -> tuple[torch.Tensor, torch.Tensor, State]:
        inputs, targets = batch
        if state is None or state[0].shape[1] != inputs.shape[0]:
            state = model.initial_state(inputs.shape[0])
        logits, state = model(inputs, state)
        per_word = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        # Truncated back-propagation: the next window starts from the values, not the graph.
        next_state = (state[0].detach(), state[1].detach())
        return per_word * inputs.shape[1], per_word.detach(), next_state

    @torch.no_grad()
    def perplexity(self, model: nn.Module, stream: torch.Tensor) -> float:
        """e^(mean negative log-likelihood per word) over ``stream``, state carried across windows."""
        was_training = model.training
        model.eval()
        streams = _rows(stream, self.options.eval_batch_size).to(next(model.parameters()).device)
        state = model.initial_state(streams.shape[0])
        total, count = 0.0, 0
        steps = self.options.num_steps
        for begin in range(0, streams.shape[1] - 1, steps):
            inputs = streams[:, begin : begin + steps]
            targets = streams[:, begin + 1 : begin + 1 + steps]
            inputs = inputs[:, : targets.shape[1]]
            logits, state = model(inputs, state)
            total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum").item()
            count += targets.numel()
        model.train(was_training)
        return math.exp(total / count)
