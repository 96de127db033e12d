"""Quantize: a weight chunk by chunk with `qlinear.quantize_linear`, given its scale and zero point.

Each chunk of rows is quantized and handed to a sink (a file writer, a list); on the way it is
dequantized with `qlinear.dequantize_linear` for the report's error figures (`plan.Stats`). The
inverse, `dequantize_tensor`, restores stored values chunk by chunk for `qlinear dequantize`.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from .. import calibrate
from ..dtypes import ElementType
from ..granularity import Granularity
from ..ops.quantize_linear import dequantize_linear, quantize_linear
from ..packing import packed_size, unpack
from .chunks import as_rows, chunk_granularity, combine, param_rows, row_chunks
from .plan import Stats


def quantize_tensor(x, gran: Granularity, qtype: ElementType, scale: np.ndarray, zero_point: np.ndarray, sink,
                    plot: bool = False, progress=None, release=None) -> Stats:
    """Quantize ``x`` (any array with NumPy slicing, rank >= 0, not empty) chunk by chunk.

    ``sink(q)`` receives the quantized chunks in order (ml_dtypes arrays, one element per byte).
    ``progress`` and ``release`` as in `calibration.calibrate_tensor`.
    """
    scalar = x.ndim == 0
    if scalar:
        gran = Granularity("tensor", (1,))
    x = as_rows(x)
    row_bytes = x.dtype.itemsize * max(1, math.prod(x.shape[1:]))
    stats = Stats()
    if plot:
        low, high = float(np.min(_finite(scale, zero_point, qtype, "low"))), float(np.max(_finite(scale, zero_point, qtype, "high")))
        stats.edges = np.linspace(low, high if high > low else low + 1.0, 257)
        stats.histogram = np.zeros(256, np.int64)
        noises, counts = [], []
    attrs = gran.attributes()
    for start, stop in row_chunks(tuple(x.shape), gran, qtype):
        chunk = np.asarray(x[start:stop])
        chunk_scale = scale if scalar else param_rows(scale, gran, start, stop)
        chunk_zero = zero_point if scalar else param_rows(zero_point, gran, start, stop)
        q, restored = quantize_chunk(chunk, chunk_scale, chunk_zero if qtype.is_integer else None, qtype, attrs)
        error = chunk.astype(np.float64) - restored.astype(np.float64)
        squared = error * error
        stats.signal += float(np.sum(np.square(chunk, dtype=np.float64)))
        stats.noise += float(np.sum(squared))
        stats.max_abs_error = max(stats.max_abs_error, float(np.max(np.abs(error))))
        if plot:
            cgran = chunk_granularity(gran, chunk.shape)
            stats.histogram += np.histogram(chunk.astype(np.float64), bins=stats.edges)[0]
            noises.append(calibrate.reduce_groups(squared, cgran, "sum"))
            counts.append(calibrate.reduce_groups(np.ones(chunk.shape, np.float32), cgran, "sum"))
        sink(q.reshape(()) if scalar else q)
        if release is not None:
            release(start, stop)
        if progress is not None:
            progress((stop - start) * row_bytes / 2)
    if plot:
        stats.group_noise = combine(noises, gran, np.add)
        stats.group_count = combine(counts, gran, np.add)
    return stats


_OWN_TYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def quantize_chunk(x, scale, zero_point, qtype: ElementType, attrs: dict):
    """(QuantizeLinear(x, scale, zero point), the weight those codes stand for): x in its own type where
    QuantizeLinear takes it (float64 as float32) and the scale as stored, so the division happens in the
    scale's type, as the spec and the written model have it; the dequantized values rounded to x's type,
    which is what a model's weight (or `qlinear dequantize`) becomes. NumPy or dask arrays alike."""
    xq = x if x.dtype in _OWN_TYPES else x.astype(np.float32)
    if qtype.is_integer:
        q = quantize_linear(xq, scale, zero_point, **attrs)
        restored = dequantize_linear(q, scale, zero_point, **attrs)
    else:
        q = quantize_linear(xq, scale, output_dtype=qtype.onnx_name, **attrs)
        restored = dequantize_linear(q, scale, **attrs)
    if x.dtype in _OWN_TYPES and restored.dtype != x.dtype:
        restored = restored.astype(x.dtype)
    return q, restored


def _finite(scale, zero_point, qtype: ElementType, end: str) -> np.ndarray:
    """The lowest or highest value the parameters can represent, per group (the histogram's range)."""
    s = np.asarray(scale, np.float64)
    if qtype.is_integer:
        z = np.asarray(zero_point).astype(np.float64)
        return (qtype.qmin - z) * s if end == "low" else (qtype.qmax - z) * s
    return -qtype.max_finite * s if end == "low" else qtype.max_finite * s


def dequantize_tensor(values, qtype: ElementType, shape: tuple[int, ...], scale: np.ndarray, zero_point,
                      gran: Granularity, output_dtype: np.dtype, sink, progress=None) -> None:
    """The inverse: stored values (packed bytes, a uint8 view or the array) of a tensor of ``shape``,
    dequantized chunk by chunk into ``output_dtype``; ``sink(array)`` receives the chunks."""
    scalar = len(shape) == 0
    rows_shape = (1,) if scalar else tuple(shape)
    if scalar:
        gran = Granularity("tensor", (1,))
    row_elements = max(1, math.prod(rows_shape[1:]))
    for start, stop in row_chunks(rows_shape, gran, qtype):
        count = (stop - start) * row_elements
        first = start * row_elements
        if qtype.packs:
            begin = first * qtype.bits // 8
            data = np.asarray(values[begin: begin + packed_size(count, qtype.bits)])
            q = unpack(data, qtype.dtype, (stop - start,) + rows_shape[1:])
        else:
            flat = np.asarray(values).reshape(-1) if np.ndim(values) != 1 else values
            q = np.asarray(flat[first: first + count]).view(qtype.dtype).reshape((stop - start,) + rows_shape[1:])
        attrs = gran.attributes()
        chunk_scale = scale if scalar else param_rows(scale, gran, start, stop)
        chunk_zero = None
        if zero_point is not None and qtype.is_integer:
            chunk_zero = zero_point if scalar else param_rows(zero_point, gran, start, stop)
        restored = dequantize_linear(q, chunk_scale, chunk_zero, **attrs)
        restored = restored.astype(output_dtype)
        sink(restored.reshape(()) if scalar else restored)
        if progress is not None:
            progress(count * np.dtype(output_dtype).itemsize)
