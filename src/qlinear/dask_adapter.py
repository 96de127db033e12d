"""dask arrays through the element-wise operators: lazily, chunk by chunk, with the same kernels.

The public functions validate their arguments exactly as for NumPy input (so the errors are the
same) and hand a dask ``x`` here. Each chunk is quantized by the public NumPy path with the slice of
the scale and zero point that covers it:
- per-tensor: the whole (scalar) scale;
- per-axis: the scale elements of the chunk's range along ``axis``;
- blocked: the chunk's range on every other dimension and its blocks along ``axis``. Chunk edges
  along ``axis`` are first moved onto block edges (a multiple of ``block_size``), so that no block is
  split between two chunks.
Scales and zero points are small NumPy arrays embedded in the graph. dask itself is never imported:
the array's own methods (rechunk, map_blocks) build the graph.
"""

from __future__ import annotations

import functools

import numpy as np

from .dtypes import ElementType
from .granularity import Granularity


def is_dask_array(value) -> bool:
    """A dask array, recognised without importing dask (qlinear does not need it to be installed)."""
    return type(value).__module__.startswith("dask.") and hasattr(value, "chunks")


def block_aligned_chunks(chunks: tuple[int, ...], block_size: int, function: str) -> tuple[int, ...]:
    """Chunk sizes along the blocked axis whose edges fall on multiples of ``block_size``.

    Each inner edge moves to the nearest multiple of the block size; chunks that vanish are dropped.
    """
    if any(np.isnan(c) for c in chunks):
        raise ValueError(
            f"{function}: x has unknown chunk sizes along the blocked axis, so chunk edges cannot be aligned "
            f"with blocks; call x.compute_chunk_sizes() first"
        )
    total = int(sum(chunks))
    edges = np.cumsum(chunks)[:-1]
    moved = np.round(edges / block_size).astype(np.int64) * block_size
    bounds = np.unique(np.concatenate([[0], moved[(moved > 0) & (moved < total)], [total]]))
    return tuple(int(b) for b in np.diff(bounds)) or (total,)


def _parameter_slice(param: np.ndarray | None, gran: Granularity, location) -> np.ndarray | None:
    """The part of a scale or zero point that covers one chunk (``location``: (start, stop) per dim)."""
    if param is None or gran.kind == "tensor":
        return param
    if gran.kind == "axis":
        start, stop = location[gran.axis]
        return param[start:stop]
    index = []
    for dim, (start, stop) in enumerate(location):
        if dim == gran.axis:
            index.append(slice(start // gran.block_size, -(-stop // gran.block_size)))
        else:
            index.append(slice(start, stop))
    return param[tuple(index)]


def _quantize_chunk(chunk, block_info=None, *, function, scale, zero_point, gran, output, saturate, precision):
    location = block_info[0]["array-location"]
    return function(
        chunk, _parameter_slice(scale, gran, location), _parameter_slice(zero_point, gran, location),
        **gran.attributes(), output_dtype=output.dtype, saturate=int(saturate), precision=precision,
    )


def _dequantize_chunk(chunk, block_info=None, *, function, scale, zero_point, gran, output):
    location = block_info[0]["array-location"]
    return function(
        chunk, _parameter_slice(scale, gran, location), _parameter_slice(zero_point, gran, location),
        **gran.attributes(), output_dtype=output.dtype,
    )


def _aligned(x, gran: Granularity, function: str):
    if gran.kind != "block":
        return x
    aligned = block_aligned_chunks(x.chunks[gran.axis], gran.block_size, function)
    if aligned == x.chunks[gran.axis]:
        return x
    return x.rechunk({gran.axis: aligned})


def quantize_linear(function, x, y_scale, y_zero_point, gran: Granularity, output: ElementType, saturate: bool,
                    division: np.dtype):
    """``function`` (qlinear.quantize_linear: the caller passes it, so that this module imports no operator) on
    each chunk of ``x``, lazily."""
    x = _aligned(x, gran, "quantize_linear")
    work = functools.partial(
        _quantize_chunk, function=function, scale=np.asarray(y_scale), zero_point=None if y_zero_point is None else np.asarray(y_zero_point),
        gran=gran, output=output, saturate=saturate, precision=np.dtype(division).name,
    )
    return x.map_blocks(work, dtype=output.dtype, meta=np.empty((0,) * x.ndim, output.dtype))


def dequantize_linear(function, x, x_type: ElementType, x_scale, x_zero_point, gran: Granularity, output: ElementType):
    """``function`` (qlinear.dequantize_linear) on each chunk of ``x``, lazily."""
    x = _aligned(x, gran, "dequantize_linear")
    work = functools.partial(
        _dequantize_chunk, function=function, scale=np.asarray(x_scale),
        zero_point=None if x_zero_point is None else np.asarray(x_zero_point), gran=gran, output=output,
    )
    return x.map_blocks(work, dtype=output.dtype, meta=np.empty((0,) * x.ndim, output.dtype))


# ------------------------------------------------------------------------------- TensorFlow operators
def _tf_proxy(x, axis):
    """A tiny stand-in for x that the NumPy function validates exactly as x: same rank, same length along
    the quantization axis (the only data-independent facts the checks read)."""
    shape = [1] * x.ndim
    if isinstance(axis, (int, np.integer)) and 0 <= axis < x.ndim:
        shape[axis] = x.shape[axis]
    return np.zeros(shape, x.dtype)


def _tf_whole_axis(x, axis):
    """TensorFlow runs its per-tensor path for a slice count of 1, so a per-axis call keeps the whole axis in
    every chunk (a chunk holding one slice would otherwise take the other path)."""
    if isinstance(axis, (int, np.integer)) and 0 <= axis < x.ndim and len(x.chunks[axis]) > 1:
        return x.rechunk({int(axis): -1})
    return x


def _tf_quantize_chunk(chunk, *, function, min_range, max_range, T, kwargs):
    return function(chunk, min_range, max_range, T, **kwargs)[0]


def _tf_dequantize_chunk(chunk, *, function, min_range, max_range, kwargs):
    return function(chunk, min_range, max_range, **kwargs)


def tf_quantize_v2(quantize_v2, x, min_range, max_range, T, **kwargs):
    """``quantize_v2`` (qlinear.tf.quantize_v2, passed by the caller) on a dask array: the output lazily, chunk by
    chunk; output_min and output_max (which depend on the ranges only) as NumPy values, computed now."""
    min_range, max_range = np.asarray(min_range), np.asarray(max_range)
    proxy, out_min, out_max = quantize_v2(_tf_proxy(x, kwargs.get("axis", -1)), min_range, max_range, T, **kwargs)
    x = _tf_whole_axis(x, kwargs.get("axis", -1))
    work = functools.partial(_tf_quantize_chunk, function=quantize_v2, min_range=min_range, max_range=max_range, T=T, kwargs=kwargs)
    return x.map_blocks(work, dtype=proxy.dtype, meta=np.empty((0,) * x.ndim, proxy.dtype)), out_min, out_max


def tf_dequantize(dequantize, x, min_range, max_range, **kwargs):
    """``dequantize`` (qlinear.tf.dequantize) on a dask array, lazily, chunk by chunk."""
    min_range, max_range = np.asarray(min_range), np.asarray(max_range)
    proxy = dequantize(_tf_proxy(x, kwargs.get("axis", -1)), min_range, max_range, **kwargs)
    x = _tf_whole_axis(x, kwargs.get("axis", -1))
    work = functools.partial(_tf_dequantize_chunk, function=dequantize, min_range=min_range, max_range=max_range, kwargs=kwargs)
    return x.map_blocks(work, dtype=proxy.dtype, meta=np.empty((0,) * x.ndim, proxy.dtype))
