"""Cutting a tensor into chunks of whole rows, so that a memory-mapped tensor is touched a chunk at a
time by calibration, quantization and dequantization alike.

Chunks are rows along the first axis; their row count is a multiple of 8 for the packed types (so each
chunk packs to whole bytes) and of the block size when blocks run along the first axis (so each chunk
holds whole blocks). The scale and zero point of a chunk are the rows of the full ones that it covers.
"""

from __future__ import annotations

import math

import numpy as np

from ..dtypes import ElementType
from ..granularity import Granularity

CHUNK_BYTES = 8 << 20  # of float32 working data per chunk (the temporaries are a few times this)


def row_chunks(shape: tuple[int, ...], gran: Granularity, qtype: ElementType) -> list[tuple[int, int]]:
    """[start, stop) row ranges along axis 0 covering a tensor of rank >= 1."""
    rows = shape[0]
    row_elements = max(1, math.prod(shape[1:]))
    step = 8 if qtype.packs else 1
    if gran.kind == "block" and gran.axis == 0:
        step = math.lcm(step, gran.block_size)
    per_chunk = max(step, (CHUNK_BYTES // (4 * row_elements)) // step * step)
    return [(start, min(rows, start + per_chunk)) for start in range(0, rows, per_chunk)]


def chunk_granularity(gran: Granularity, chunk_shape) -> Granularity:
    return Granularity(gran.kind, tuple(chunk_shape), gran.axis, gran.block_size)


def param_rows(param: np.ndarray, gran: Granularity, start: int, stop: int) -> np.ndarray:
    """The part of a scale or zero point that covers rows [start, stop)."""
    if gran.kind == "tensor" or (gran.kind == "axis" and gran.axis != 0):
        return param
    if gran.kind == "block" and gran.axis == 0:
        return param[start // gran.block_size: -(-stop // gran.block_size)]
    return param[start:stop]


def combine(parts: list[np.ndarray], gran: Granularity, how) -> np.ndarray:
    """Per-chunk reductions joined into the whole tensor's: ``how`` (np.minimum, np.add, ...) across
    chunks where every chunk covers every group, concatenation where each covers its own rows."""
    if gran.kind == "tensor" or (gran.kind == "axis" and gran.axis != 0):
        return how.reduce(np.stack(parts), axis=0)
    return np.concatenate(parts, axis=0)


def as_rows(x):
    """A scalar as one row; other arrays as they are."""
    return x.reshape(1) if x.ndim == 0 else x
