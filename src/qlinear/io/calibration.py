"""Calibrate: the scale and zero point of a weight, from its min and max per group.

The tensor is reduced chunk by chunk (`qlinear.calibrate.ranges` on each chunk of rows, joined), so a
memory-mapped tensor is never read whole; `qlinear.calibrate.parameters` turns the ranges into the
parameters.
"""

from __future__ import annotations

import math

import numpy as np

from .. import calibrate
from ..dtypes import ElementType
from ..granularity import Granularity
from .chunks import as_rows, chunk_granularity, combine, row_chunks
from .errors import UserError


def calibrate_tensor(where: str, x, gran: Granularity, qtype: ElementType, symmetric: bool, scale_dtype=np.float32,
                     progress=None, release=None):
    """(scale, zero point) of ``x`` (any array with NumPy slicing, not empty). ``progress(nbytes)`` is
    told half of each chunk's bytes (quantizing is the other half); ``release(start, stop)``, when
    given, is called after each chunk of rows is read (see `formats.tensor_files.page_releaser`)."""
    scalar = x.ndim == 0
    if scalar:
        gran = Granularity("tensor", (1,))
    x = as_rows(x)
    row_bytes = x.dtype.itemsize * max(1, math.prod(x.shape[1:]))
    lows, highs = [], []
    for start, stop in row_chunks(tuple(x.shape), gran, qtype):
        chunk = x[start:stop]
        low, high = calibrate.ranges(chunk, chunk_granularity(gran, chunk.shape))
        lows.append(low)
        highs.append(high)
        if release is not None:
            release(start, stop)
        if progress is not None:
            progress((stop - start) * row_bytes / 2)
    low = combine(lows, gran, np.minimum)
    high = combine(highs, gran, np.maximum)
    scale, zero_point = parameters(where, low, high, qtype, symmetric, scale_dtype)
    if scalar:
        scale, zero_point = scale.reshape(()), zero_point.reshape(())
    return scale, zero_point


def parameters(where: str, low, high, qtype: ElementType, symmetric: bool, scale_dtype=np.float32):
    """`qlinear.calibrate.parameters`, with NaN or infinite ranges as a UserError naming ``where``."""
    try:
        return calibrate.parameters(low, high, qtype, symmetric, scale_dtype)
    except ValueError:
        raise UserError(f"{where} holds NaN or infinite values, which have no scale; --exclude it") from None
