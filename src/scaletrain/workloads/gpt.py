"""``gpt``: a decoder-only transformer language model on the Penn Treebank words (the LSTM's data and metric).

Pre-norm blocks (Radford et al. 2019's GPT-2 layout): LayerNorm, causal multi-head self-attention through
:func:`torch.nn.functional.scaled_dot_product_attention`, a residual; LayerNorm, a GELU MLP four times as wide,
a residual; dropout on the embeddings, the attention weights and each residual branch; learned positions; the
output layer tied to the input embedding (one parameter, which every strategy exchanges once). Trained on
windows of ``context`` words cut from the text without overlap and shuffled every epoch (so ``split`` over N
workers computes what one process does), each predicting every next word; metric: test perplexity over the test
text in windows of ``context``. Defaults (chosen on ``ptb.valid.txt`` against the LSTM's 2 epochs, docs/workloads.md):
one block of width 128, 4 heads, context 16, no dropout (in 2 or 3 epochs of the 73,760 words of
``ptb.valid.txt`` it only slowed learning); AdamW at lr 2e-3 after a linear warm-up of 50 updates, cosine decay to 0,
clipping 1, batch 8, 2 epochs.

Offline copies of PTB often hold only the validation and test files; ``-o train_split=valid`` trains on the
validation text (and then reports only test perplexity).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from scaletrain.data.ptb import PennTreebank
from scaletrain.data.sampler import EpochBatches, Part
from scaletrain.workloads.base import WorkloadDefaults
from scaletrain.workloads.language import PennTreebankWorkload, check_options

__all__ = ["GPT", "GPTOptions", "GPTWorkload"]


@dataclass(frozen=True)
class GPTOptions:
    """Workload options (``-o key=value``)."""

    layers: int = 1
    heads: int = 4
    width: int = 128
    context: int = 16
    dropout: float = 0.0
    vocab_size: int = 10000
    train_split: str = "train"

    def __post_init__(self) -> None:
        check_options(self, ("layers", "heads", "width", "context", "vocab_size"))
        if self.width % self.heads:
            raise ValueError(f"workload option width ({self.width}) must be a multiple of heads ({self.heads})")


class Block(nn.Module):
    """One pre-norm transformer block: causal self-attention, then the MLP, each around a residual."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        # q, k and v in one layer, without a bias: a key's bias adds one amount to a whole row of scores, which
        # softmax ignores, so its gradient is zero in exact arithmetic and AdamW's m/√v makes steps of rounding noise
        # (different in every summation order, so split workers would drift from one process); the query's and the
        # value's biases go with it, as in PaLM and LLaMA (the projection's bias covers the value's)
        self.attention = nn.Linear(width, 3 * width, bias=False)
        self.projection = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows, length, width = x.shape
        q, k, v = self.attention(self.norm1(x)).split(width, dim=2)
        q, k, v = (t.view(rows, length, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        dropout = self.dropout if self.training else 0.0
        attended = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        x = x + self.drop(self.projection(attended.transpose(1, 2).reshape(rows, length, width)))
        return x + self.drop(self.mlp(self.norm2(x)))


class GPT(nn.Module):
    """Token and position embeddings → blocks → LayerNorm → logits through the tied embedding."""

    def __init__(self, vocab_size: int, context: int, width: int, layers: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, width)
        self.positions = nn.Parameter(torch.zeros(context, width))
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*(Block(width, heads, dropout) for _ in range(layers)))
        self.norm = nn.LayerNorm(width)
        self.output = nn.Linear(width, vocab_size, bias=False)
        self.output.weight = self.embedding.weight  # tied: one parameter
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        nn.init.normal_(self.positions, std=0.02)

    def forward(self, words: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.embedding(words) + self.positions[: words.shape[1]])
        return self.output(self.norm(self.blocks(x)))


class GPTWorkload(PennTreebankWorkload):
    """A small GPT on Penn Treebank; metric: test perplexity."""

    name = "gpt"
    defaults = WorkloadDefaults(
        epochs=2, batch_size=8, lr=2e-3, clip_norm=1.0, optimizer="adamw", lr_schedule="cosine", lr_warmup=50
    )
    options_type = GPTOptions

    def build_model(self) -> GPT:
        o = self.options
        return GPT(o.vocab_size, o.context, o.width, o.layers, o.heads, o.dropout)

    def _windows(self, stream: torch.Tensor) -> int:
        return (len(stream) - 1) // self.options.context

    def batches_per_epoch(self, data: PennTreebank, batch_size: int) -> int:
        return self._windows(data.train) // batch_size

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
        context = self.options.context
        batches = EpochBatches(
            self._windows(data.train), batch_size=batch_size, seed=seed, epoch=epoch, part=part, numbers=numbers
        )
        offsets = torch.arange(context + 1)
        for number in batches.numbers:
            words = data.train[batches.indices(number)[:, None] * context + offsets]
            yield words[:, :-1], words[:, 1:]

    def example_inputs(self, data: PennTreebank) -> torch.Tensor:
        return data.test[: 2 * self.options.context].view(2, -1)

    def training_loss(
        self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], state: None
    ) -> tuple[torch.Tensor, torch.Tensor, None]:
        inputs, targets = batch
        logits = model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return loss, loss.detach(), None

    @torch.no_grad()
    def perplexity(self, model: nn.Module, stream: torch.Tensor) -> float:
        """e^(mean negative log-likelihood per word) over ``stream`` in windows of ``context`` words."""
        was_training = model.training
        model.eval()
        context, device = self.options.context, next(model.parameters()).device
        windows = self._windows(stream)
        words = stream[: windows * context + 1].to(device)
        total, count = 0.0, 0
        for begin in range(0, windows, 64):  # 64 windows a forward pass
            rows = torch.arange(begin, min(begin + 64, windows), device=device)[:, None] * context
            chunk = words[rows + torch.arange(context + 1, device=device)]
            logits = model(chunk[:, :-1])
            total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1), reduction="sum")
            count += chunk[:, 1:].numel()
        model.train(was_training)
        return math.exp(float(total) / count)
