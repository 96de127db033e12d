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


def _quantize_chunk(chunk, block_info=None, *, scale, zero_point, gran, output, saturate, precision):
    from .ops.quantize_linear import quantize_linear

    location = block_info[0]["array-location"]
    return quantize_linear(
        chunk, _parameter_slice(scale, gran, location), _parameter_slice(zero_point, gran, location),
        axis=gran.axis if gran.axis is not None else 1, block_size=gran.block_size,
        output_dtype=output.dtype, saturate=int(saturate), precision=precision,
    )


def _dequantize_chunk(chunk, block_info=None, *, scale, zero_point, gran, output):
    from .ops.quantize_linear import dequantize_linear

    location = block_info[0]["array-location"]
    return dequantize_linear(
        chunk, _parameter_slice(scale, gran, location), _parameter_slice(zero_point, gran, location),
        axis=gran.axis if gran.axis is not None else 1, block_size=gran.block_size, output_dtype=output.dtype,
    )


def _aligned(x, gran: Granularity, function: str):
    if gran.kind != "block":
        return x
    aligned = block_aligned_chunks(x.chunks[gran.axis], gran.block_size, function)
    if aligned == x.chunks[gran.axis]:
        return x
    return x.rechunk({gran.axis: aligned})


def quantize_linear(x, y_scale, y_zero_point, gran: Granularity, output: ElementType, saturate: bool,
                    division: np.dtype):
    x = _aligned(x, gran, "quantize_linear")
    work = functools.partial(
        _quantize_chunk, scale=np.asarray(y_scale), zero_point=None if y_zero_point is None else np.asarray(y_zero_point),
        gran=gran, output=output, saturate=saturate, precision=np.dtype(division).name,
    )
    return x.map_blocks(work, dtype=output.dtype, meta=np.empty((0,) * x.ndim, output.dtype))


def dequantize_linear(x, x_type: ElementType, x_scale, x_zero_point, gran: Granularity, output: ElementType):
    x = _aligned(x, gran, "dequantize_linear")
    work = functools.partial(
        _dequantize_chunk, scale=np.asarray(x_scale),
        zero_point=None if x_zero_point is None else np.asarray(x_zero_point), gran=gran, output=output,
    )
    return x.map_blocks(work, dtype=output.dtype, meta=np.empty((0,) * x.ndim, output.dtype))
