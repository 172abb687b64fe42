"""Tensors on the wire and on devices: the leaf every layer above may use.

``codec`` turns gradients into what crosses the network and back, ``device`` picks and checks the
device a process computes on, ``flat`` packs tensors into one flat buffer and checks them for inf/nan.
"""

from scaletrain.tensors import powersgd, topk  # noqa: F401  (their registry lines: CODECS["powersgd"], CODECS["topk"])
