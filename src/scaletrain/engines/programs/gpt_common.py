"""What both engines' ``gpt`` programs share (``tensorflow_gpt.py``, ``mxnet_gpt.py``): torch's names and shapes
of the model's weights, ``init.npz`` read and checked, the samples of a step, the test windows and the rate of an
update. Like the programs it needs only the standard library and NumPy.

The model is :class:`scaletrain.workloads.gpt.GPT`: a token embedding ``(V, W)`` tied to the output layer (one
weight, stored by torch under both ``embedding.weight`` and ``output.weight``), learned positions ``(C, W)``, per
block ``norm1``, ``attention`` (q, k, v in one ``(3W, W)`` linear layer without a bias), ``projection``,
``norm2`` and the MLP ``mlp.0`` ``(4W, W)``, GELU, ``mlp.2`` ``(W, 4W)``, then the final ``norm``.
"""

from __future__ import annotations

import math

import numpy as np

#: a block's weights as torch names them, after ``blocks.<k>.``
BLOCK = (
    "norm1.weight", "norm1.bias", "attention.weight", "projection.weight", "projection.bias",
    "norm2.weight", "norm2.bias", "mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias",
)  # fmt: skip
TIED = "output.weight"  # the output layer's weight: torch's name of the embedding it is tied to
EVAL_WINDOWS = 64  # test windows a forward pass, as scaletrain scores them


def weight_names(layers: int) -> list[str]:
    """torch's state_dict names of the model's weights, the tied output left out, in the programs' order.

    >>> names = weight_names(2)
    >>> len(names), names[:3]
    (26, ['embedding.weight', 'positions', 'blocks.0.norm1.weight'])
    >>> names[-3:]
    ['blocks.1.mlp.2.bias', 'norm.weight', 'norm.bias']
    """
    blocks = [f"blocks.{k}.{name}" for k in range(layers) for name in BLOCK]
    return ["embedding.weight", "positions", *blocks, "norm.weight", "norm.bias"]


def weight_shapes(model: dict) -> list[tuple[int, ...]]:
    """Their shapes for the spec's ``model``.

    >>> model = {"vocab_size": 10000, "width": 128, "context": 16, "layers": 1}
    >>> sum(math.prod(shape) for shape in weight_shapes(model))  # scaletrain's gpt at its defaults
    1480192
    """
    v, w, c = model["vocab_size"], model["width"], model["context"]
    block = [(w,), (w,), (3 * w, w), (w, w), (w,), (w,), (w,), (4 * w, w), (4 * w,), (w, 4 * w), (w,)]
    return [(v, w), (c, w), *block * model["layers"], (w,), (w,)]


def load_init(spec: dict) -> list[np.ndarray]:
    """``init.npz``'s arrays in the order of :func:`weight_names`: their shapes, the tied output and the count of
    weights (the spec's ``parameters``, scaletrain's count of its own model) checked."""
    model = spec["model"]
    names = weight_names(model["layers"])
    with np.load(spec["init"]) as saved:
        missing = sorted(set(names) - set(saved.files))
        if missing:
            raise ValueError(f"{spec['init']} lacks {', '.join(missing)}: not the gpt model of the spec")
        values = [saved[name].astype(np.float32) for name in names]
        if TIED in saved.files and not np.array_equal(saved[TIED], saved["embedding.weight"]):
            raise ValueError(f"{spec['init']}: {TIED} differs from embedding.weight; the spec's model ties them")
    for name, value, shape in zip(names, values, weight_shapes(model), strict=True):
        if value.shape != shape:
            raise ValueError(f"{spec['init']}: {name} has shape {value.shape}, the spec's model {shape}")
    count = sum(value.size for value in values)
    if count != spec["parameters"]:
        raise ValueError(f"this gpt has {count} weights, scaletrain's {spec['parameters']}")
    return values


def final_weights(names: list[str], values: list[np.ndarray]) -> dict[str, np.ndarray]:
    """``final.npz``'s arrays: torch's names, the tied output under its own name too (as torch's state_dict has it)."""
    weights = dict(zip(names, values, strict=True))
    return {**weights, TIED: weights["embedding.weight"]}


def windows(train: np.ndarray, numbers: np.ndarray, context: int) -> tuple[np.ndarray, np.ndarray]:
    """The inputs and targets ``(rows, context)`` of the windows ``numbers``: window ``n`` is the words
    ``n·context … n·context + context`` and, one word later, their targets.

    >>> inputs, targets = windows(np.arange(20), np.array([2, 0]), 4)
    >>> inputs.tolist(), targets.tolist()
    ([[8, 9, 10, 11], [0, 1, 2, 3]], [[9, 10, 11, 12], [1, 2, 3, 4]])
    """
    words = train[numbers[:, None] * context + np.arange(context + 1)]
    return words[:, :-1], words[:, 1:]


def evaluation_chunks(test: np.ndarray, context: int):
    """The test text's windows of ``context`` words, :data:`EVAL_WINDOWS` at a time: ``(inputs, targets)``."""
    count = (len(test) - 1) // context
    for begin in range(0, count, EVAL_WINDOWS):
        yield windows(test, np.arange(begin, min(begin + EVAL_WINDOWS, count)), context)


def learning_rate(spec: dict, step: int) -> float:
    """The rate of update ``step`` (0-based) as scaletrain's ``cosine`` schedule gives it: a linear warm-up over
    ``warmup`` updates multiplying a cosine from ``lr`` to 0 over the updates after the warm-up.

    >>> spec = {"lr": 1.0, "schedule": {"kind": "cosine", "warmup": 2, "updates": 6}}
    >>> [round(learning_rate(spec, step), 4) for step in range(6)]
    [0.5, 1.0, 1.0, 0.8536, 0.5, 0.1464]
    """
    schedule = spec["schedule"]
    if schedule["kind"] != "cosine":
        raise ValueError(f"schedule {schedule['kind']!r}: the gpt programs follow scaletrain's cosine schedule only")
    warmup, updates = schedule["warmup"], max(schedule["updates"], 1)
    begun = warmup / updates
    done = min(max((step / updates - begun) / max(1.0 - begun, 1e-12), 0.0), 1.0)
    ramp = min(1.0, (step + 1) / warmup) if warmup else 1.0
    return spec["lr"] * 0.5 * (1 + math.cos(math.pi * done)) * ramp
