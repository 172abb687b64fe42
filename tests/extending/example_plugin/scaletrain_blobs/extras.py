"""The package's plug-in module (entry-point group ``scaletrain.plugins``): scaletrain imports it in every
process of a run, and its lines add a wire codec and a technique to the registries."""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.efficient import TECHNIQUES
from scaletrain.efficient.rebatch import Rebatch
from scaletrain.tensors.codec import CODECS, Float16Codec


class BlobsHalf(Float16Codec):
    """float16 on the wire, under the package's own name."""

    name = "blobs-half"


@dataclass
class BlobsRebatch(Rebatch):
    """The batch change of ``rebatch``, under the package's own name."""

    name = "blobs-rebatch"


CODECS["blobs-half"] = BlobsHalf
TECHNIQUES["blobs-rebatch"] = BlobsRebatch
