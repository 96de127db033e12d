"""Quantizing and dequantizing one tensor, a chunk of rows at a time.

A tensor is read in chunks along its first dimension (a memory map is only touched chunk by chunk),
calibrated in a first pass (`qlinear.calibrate`), then quantized with `qlinear.quantize_linear` in a
second pass whose chunks go to a sink (a file writer or a list). The dequantized values are computed
with `qlinear.dequantize_linear` on the way, for the error figures of the report.

Chunks are whole rows; their row count is a multiple of 8 for the packed types (so each chunk packs
to whole bytes) and of the block size when blocks run along the first axis (so each chunk holds
whole blocks). The scale and zero point of a chunk are the rows of the full ones that it covers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .. import calibrate, granularity as granularity_mod, schemas
from ..dtypes import ElementType
from ..granularity import Granularity
from ..ops.quantize_linear import dequantize_linear, quantize_linear
from ..packing import pack, packed_size, unpack
from .errors import UserError

CHUNK_BYTES = 8 << 20  # of float32 working data per chunk (the temporaries are a few times this)


@dataclass(frozen=True)
class Settings:
    qtype: ElementType
    kind: str  # "tensor", "axis" or "block"
    axis: int | None  # None: the caller's default for the tensor
    block_size: int
    symmetric: bool


def quantized_types() -> tuple[str, ...]:
    """The output types of the newest QuantizeLinear."""
    return schemas.SCHEMAS["QuantizeLinear"][-1].quantized_types


def resolve_granularity(where: str, shape: tuple[int, ...], settings: Settings, default_axis: int) -> Granularity:
    """The granularity ``settings`` asks for on a tensor of ``shape``, checked with the spec's rules
    (`qlinear.granularity.resolve`); a UserError naming ``where`` when the tensor cannot take it."""
    shape = tuple(int(d) for d in shape)
    if settings.kind == "tensor":
        return granularity_mod.Granularity("tensor", shape)
    what = "per-axis" if settings.kind == "axis" else "blocked"
    if len(shape) == 0:
        raise UserError(f"{where}: a scalar (shape ()) cannot take {what} quantization; use --granularity tensor "
                        f"or --exclude it")
    axis = default_axis if settings.axis is None else settings.axis
    try:
        axis = granularity_mod.normalize_axis(axis, len(shape), "granularity", "the tensor")
        if settings.kind == "axis":
            param_shape = (shape[axis],)
            block_size = 0
        else:
            block_size = settings.block_size
            param_shape = list(shape)
            param_shape[axis] = -(-shape[axis] // block_size)
            param_shape = tuple(param_shape)
        gran = granularity_mod.resolve("granularity", shape, param_shape, param_shape, axis, block_size)
    except (ValueError, TypeError) as error:
        message = str(error).removeprefix("granularity: ")
        raise UserError(f"{where} of shape {shape} cannot take {what} quantization: {message}") from None
    if gran.kind == "tensor":  # a length-1 axis: one scale, which the spec reads as per-tensor
        return granularity_mod.Granularity("axis", shape, axis) if settings.kind == "axis" else gran
    return gran


def min_opset(qtype: ElementType, kind: str, scale_type: str = "float") -> int:
    """The first opset whose DequantizeLinear takes this type, granularity and scale type."""
    for schema in schemas.SCHEMAS["DequantizeLinear"]:
        if (qtype.onnx_name in schema.quantized_types and kind in schema.granularities
                and scale_type in schema.scale_types):
            return schema.since
    raise UserError(f"no ONNX opset has a DequantizeLinear for {qtype.onnx_name} with {kind} granularity "
                    f"and {scale_type} scales")


@dataclass
class Stats:
    """Error figures of one tensor, accumulated over its chunks."""

    signal: float = 0.0  # sum of x**2
    noise: float = 0.0  # sum of (x - dequantized)**2
    max_abs_error: float = 0.0
    histogram: np.ndarray | None = None  # value counts over `edges` (for --plot)
    edges: np.ndarray | None = None
    group_noise: np.ndarray | None = None  # sum of squared error per scale group (for --plot)
    group_count: np.ndarray | None = None

    @property
    def sqnr_db(self) -> float:
        if self.noise == 0.0:
            return math.inf
        if self.signal == 0.0:
            return -math.inf
        return 10.0 * math.log10(self.signal / self.noise)


@dataclass
class Quantized:
    scale: np.ndarray
    zero_point: np.ndarray
    stats: Stats = field(default_factory=Stats)


def row_chunks(shape: tuple[int, ...], gran: Granularity, qtype: ElementType) -> list[tuple[int, int]]:
    """[start, stop) row ranges along axis 0 covering a tensor of rank >= 1."""
    rows = shape[0]
    row_elements = max(1, math.prod(shape[1:]))
    step = 8 if qtype.packs else 1
    if gran.kind == "block" and gran.axis == 0:
        step = math.lcm(step, gran.block_size)
    per_chunk = max(step, (CHUNK_BYTES // (4 * row_elements)) // step * step)
    return [(start, min(rows, start + per_chunk)) for start in range(0, rows, per_chunk)]


def _chunk_granularity(gran: Granularity, chunk_shape) -> Granularity:
    return Granularity(gran.kind, tuple(chunk_shape), gran.axis, gran.block_size)


def _param_rows(param: np.ndarray, gran: Granularity, start: int, stop: int) -> np.ndarray:
    """The part of a scale or zero point that covers rows [start, stop)."""
    if gran.kind == "tensor" or (gran.kind == "axis" and gran.axis != 0):
        return param
    if gran.kind == "block" and gran.axis == 0:
        return param[start // gran.block_size: -(-stop // gran.block_size)]
    return param[start:stop]


def _combine(parts: list[np.ndarray], gran: Granularity, how) -> np.ndarray:
    if gran.kind == "tensor" or (gran.kind == "axis" and gran.axis != 0):
        return how.reduce(np.stack(parts), axis=0)
    return np.concatenate(parts, axis=0)


def _as_rows(x):
    return x.reshape(1) if x.ndim == 0 else x


def quantize_tensor(where: str, x, gran: Granularity, qtype: ElementType, symmetric: bool, sink,
                    scale_dtype=np.float32, plot: bool = False, progress=None, release=None) -> Quantized:
    """Calibrate and quantize ``x`` (any array with NumPy slicing, rank >= 0, not empty) chunk by chunk.

    ``sink(q)`` receives the quantized chunks in order (ml_dtypes arrays, one element per byte).
    ``progress(nbytes)`` is told how many input bytes each chunk covered; ``release(start, stop)``, when
    given, is called after each chunk of rows is done with (see `formats.page_releaser`).
    """
    scalar = x.ndim == 0
    if scalar:
        gran = Granularity("tensor", (1,))
    x = _as_rows(x)
    chunks = row_chunks(tuple(x.shape), gran, qtype)
    row_bytes = x.dtype.itemsize * max(1, math.prod(x.shape[1:]))

    lows, highs = [], []
    for start, stop in chunks:
        chunk = x[start:stop]
        low, high = calibrate.ranges(chunk, _chunk_granularity(gran, chunk.shape))
        lows.append(low)
        highs.append(high)
        if release is not None:
            release(start, stop)
        if progress is not None:  # two passes: each reports its half of the work
            progress((stop - start) * row_bytes / 2)
    low = _combine(lows, gran, np.minimum)
    high = _combine(highs, gran, np.maximum)
    try:
        scale, zero_point = calibrate.parameters(low, high, qtype, symmetric, scale_dtype)
    except ValueError:
        raise UserError(f"{where} holds NaN or infinite values, which have no scale; --exclude it") from None
    if scalar:
        scale, zero_point = scale.reshape(()), zero_point.reshape(())

    stats = Stats()
    if plot:
        finite_low, finite_high = float(np.min(low)), float(np.max(high))
        if finite_low == finite_high:
            finite_high = finite_low + 1.0
        stats.edges = np.linspace(finite_low, finite_high, 257)
        stats.histogram = np.zeros(256, np.int64)
    use_zero_point = qtype.is_integer
    for start, stop in chunks:
        chunk = np.asarray(x[start:stop])
        cgran = _chunk_granularity(gran, chunk.shape)
        chunk_scale = _param_rows(scale, gran, start, stop) if not scalar else scale
        chunk_zero = _param_rows(zero_point, gran, start, stop) if not scalar else zero_point
        attrs = gran.attributes()
        x32 = chunk.astype(np.float32)
        if use_zero_point:
            q = quantize_linear(x32, chunk_scale.astype(np.float32), chunk_zero, **attrs)
            restored = dequantize_linear(q, chunk_scale, chunk_zero, **attrs)
        else:
            q = quantize_linear(x32, chunk_scale.astype(np.float32), output_dtype=qtype.onnx_name, **attrs)
            restored = dequantize_linear(q, chunk_scale, **attrs)
        error = chunk.astype(np.float64) - restored.astype(np.float64)
        squared = error * error
        stats.signal += float(np.sum(np.square(chunk, dtype=np.float64)))
        stats.noise += float(np.sum(squared))
        stats.max_abs_error = max(stats.max_abs_error, float(np.max(np.abs(error))))
        if plot:
            stats.histogram += np.histogram(chunk.astype(np.float64), bins=stats.edges)[0]
            noise = calibrate.reduce_groups(squared, cgran, "sum")
            count = calibrate.reduce_groups(np.ones(chunk.shape, np.float32), cgran, "sum")
            if stats.group_noise is None:
                stats.group_noise, stats.group_count = [noise], [count]
            else:
                stats.group_noise.append(noise)
                stats.group_count.append(count)
        sink(q.reshape(()) if scalar else q)
        if release is not None:
            release(start, stop)
        if progress is not None:
            progress((stop - start) * row_bytes / 2)
    if plot:
        stats.group_noise = _combine(stats.group_noise, gran, np.add)
        stats.group_count = _combine(stats.group_count, gran, np.add)
    return Quantized(scale, zero_point, stats)


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
        chunk_scale = scale if scalar else _param_rows(scale, gran, start, stop)
        chunk_zero = None
        if zero_point is not None and qtype.is_integer:
            chunk_zero = zero_point if scalar else _param_rows(zero_point, gran, start, stop)
        restored = dequantize_linear(q, chunk_scale, chunk_zero, **attrs)
        restored = restored.astype(output_dtype)
        sink(restored.reshape(()) if scalar else restored)
        if progress is not None:
            progress(count * np.dtype(output_dtype).itemsize)
