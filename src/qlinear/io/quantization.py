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
from ..kernels import bfloat16
from ..kernels.calibration_stats import agreement
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
        _add_error(stats, chunk, restored)
        if plot:
            error = chunk.astype(np.float64) - restored.astype(np.float64)
            squared = error * error
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


def _add_error(stats: Stats, x: np.ndarray, restored: np.ndarray) -> None:
    """Add a chunk's sum x^2, sum (x - restored)^2 and max |x - restored| (float64) to ``stats``, through
    `kernels.calibration_stats.agreement` (one pass, no float64 temporaries; float16 and bfloat16 go in as
    float32, which holds them exactly). In NumPy these figures took half of `qlinear quantize`'s time on a
    bfloat16 checkpoint (NVFP4, 721M weights: 12.9 s in all; 6.2 s with the kernel and x converted once).
    Its sums run in another order than NumPy's: the report's last digits may differ."""
    if x.size == 0:
        return
    if x.dtype != restored.dtype or x.dtype not in (np.float32, np.float64):
        wide = np.float64 if np.float64 in (x.dtype, restored.dtype) else np.float32
        x, restored = np.asarray(x, wide), np.asarray(restored, wide)  # (no copy of the one already wide)
    signal, noise, worst = agreement(x, restored)
    stats.signal += signal
    stats.noise += noise
    stats.max_abs_error = max(stats.max_abs_error, worst)


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
        restored = bfloat16.cast(restored, x.dtype)
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
        restored = bfloat16.cast(restored, output_dtype)
        sink(restored.reshape(()) if scalar else restored)
        if progress is not None:
            progress(count * np.dtype(output_dtype).itemsize)


# ----------------------------------------------------------------------------------------------------
# Microscaling formats


class MXQuantized:
    """A weight in an MX format (or NVFP4) as the ONNX model stores it: ``codes`` (ml_dtypes, x's shape),
    ``scales`` (float8e8m0 per block; NVFP4: float8e4m3fn per block) and NVFP4's float32 ``global_scale``
    (None for MX); ``stats`` compare x with what those tensors dequantize to."""

    def __init__(self, codes, scales, global_scale, stats: Stats):
        self.codes, self.scales, self.global_scale, self.stats = codes, scales, global_scale, stats


def quantize_mx(x, gran: Granularity, fmt, scale_rule: str | None, output_dtype: np.dtype,
                global_scale=None) -> MXQuantized:
    """``x`` (whole, in memory) in the MX format ``fmt`` along ``gran.axis`` with `qlinear.mx`, as ONNX
    stores it: MXINT8's implicit 2^-6 folded into its e8m0 scales (`qlinear.mx.onnx_scales`).

    The error figures are measured against what the written DequantizeLinear nodes compute
    (`dequantize_mx`, in ``output_dtype``, the weight's type), not against a second formula. ``global_scale``:
    NVFP4's tensor scale, when x is one band of a larger tensor (the whole tensor's)."""
    from .. import mx

    xa = np.asarray(x)
    xf = xa if xa.dtype == np.float32 else xa.astype(np.float32)  # float16/bfloat16 exactly; float64 rounded
    if fmt.name == "nvfp4":
        codes, scales, global_scale = mx.quantize(xf, fmt.name, axis=gran.axis, scale_rule=scale_rule,
                                                  global_scale=global_scale)
        global_scale = np.asarray(global_scale, np.float32).reshape(())
    else:
        codes, scales = mx.quantize(xf, fmt.name, axis=gran.axis, scale_rule=scale_rule)
        codes, scales = onnx_scales(xf, codes, scales, fmt, gran.axis)
    restored = dequantize_mx(codes, scales, global_scale, gran, output_dtype)
    stats = Stats()
    _add_error(stats, xa if xa.dtype == np.float64 else xf, restored)  # xf: x's values, converted once
    return MXQuantized(codes, scales, global_scale, stats)


MXINT8_LOWEST_EXPONENT = -121  # e8m0's 2^-127 once MXINT8's implicit 2^-6 is folded into the scale


def onnx_scales(x, codes, scales, fmt, axis: int):
    """(codes, e8m0 scales) as ONNX's DequantizeLinear reads them: `qlinear.mx.onnx_scales`, which folds
    MXINT8's implicit 2^-6 into the scale. The blocks whose scale is below 2^-121 cannot take the fold
    (e8m0 ends at 2^-127): all-zero blocks (scale 2^-127 by the rule) and blocks of tiny weights. They
    are quantized again at scale 2^-121 with the same element rule, which is exact for zeros and finer
    for the others, instead of refusing the model."""
    from .. import mx
    from ..reference import mx as mx_reference

    if fmt.is_int:
        e, nan = mx_reference.exponents_from_e8m0(scales)
        low = (e < MXINT8_LOWEST_EXPONENT) & ~nan
        if low.any():
            e = np.where(low, MXINT8_LOWEST_EXPONENT, e)
            last = np.moveaxis(np.asarray(x, np.float32), axis, -1)
            k = last.shape[-1]
            e_last, nan_last = np.moveaxis(e, axis, -1), np.moveaxis(nan, axis, -1)
            grouped = mx_reference.blocks(last, fmt.block_size)
            again = mx_reference.unblocks(mx_reference.mx_elements(grouped, e_last, nan_last, fmt), k)
            mask = np.repeat(np.moveaxis(low, axis, -1), fmt.block_size, axis=-1)[..., :k]
            codes = np.moveaxis(np.where(mask, again, np.moveaxis(np.asarray(codes), axis, -1)), -1, axis)
            scales = mx_reference.e8m0_from_exponents(e, nan)
    return mx.onnx_scales(codes, scales, fmt)


def dequantize_mx(codes, scales, global_scale, gran: Granularity, output_dtype: np.dtype) -> np.ndarray:
    """What the written nodes compute, with qlinear's DequantizeLinear: one node for MX (e8m0 scales,
    opset 24), two for NVFP4 (the e4m3 block scales times the float32 tensor scale, then the codes)."""
    attrs = gran.attributes()
    if global_scale is None:
        return dequantize_linear(codes, scales, output_dtype=output_dtype, opset=28, **attrs)
    block_scales = dequantize_linear(scales, np.asarray(global_scale, np.float32), opset=23)
    return bfloat16.cast(dequantize_linear(codes, block_scales, opset=23, **attrs), output_dtype)
