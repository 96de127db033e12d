"""How quantized values are stored in files: the 2/4/6-bit types packed in ONNX's layout, the float8/6/4
types as their bit patterns in uint8 (which file formats know), other integers as they are.
"""

from __future__ import annotations

import math

import numpy as np

from ..dtypes import ElementType
from ..packing import pack, packed_size


def stored_size(qtype: ElementType, shape) -> int:
    """Bytes of a quantized tensor as stored (packed for the 2/4/6-bit types)."""
    count = math.prod(shape)
    return packed_size(count, qtype.bits) if qtype.packs else count * qtype.dtype.itemsize


def to_storage(q: np.ndarray, qtype: ElementType) -> np.ndarray:
    """A quantized chunk as the array a file stores: packed bytes for 2/4/6-bit types, the raw bytes
    (uint8 view) for float8 types that the file formats may not know, the array itself otherwise."""
    if qtype.packs:
        return pack(q)
    if not qtype.is_integer:
        return q.view(np.uint8)
    return q


class PackingSink:
    """Packs a stream of quantized chunks into one continuous packed byte stream for ``write`` (chunks
    whose element count is not a multiple of the elements per byte carry their remainder into the next)."""

    def __init__(self, write, qtype: ElementType):
        self.write, self.qtype = write, qtype
        self.unit = 8 // math.gcd(qtype.bits, 8)  # elements per whole number of bytes
        self.rest = None

    def __call__(self, q):
        flat = q.reshape(-1)
        if self.rest is not None:
            flat = np.concatenate([self.rest, flat])
        whole = flat.size // self.unit * self.unit
        if whole:
            self.write(to_storage(flat[:whole], self.qtype))
        self.rest = flat[whole:] if whole < flat.size else None

    def close(self):
        if self.rest is not None:
            self.write(to_storage(self.rest, self.qtype))
            self.rest = None
