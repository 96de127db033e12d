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


# ------------------------------------------------------------------------------- microscaling (qlinear.mx)
# Blocks are independent, so a chunk whose edges along the blocked axis fall on block edges is quantized alone.
# dask's map_blocks makes one array per task: each chunk's codes and scales (one byte each) travel together as
# one uint8 chunk, codes then scales along the axis, and two cheap slicing steps take them apart, so that
# computing both (in one dask.compute) quantizes each chunk once.
def _packed_length(n: int, block_size: int) -> int:
    """The codes' length along the axis of a packed chunk of length n = codes + ceil(codes / block_size)."""
    return n - -(-n // (block_size + 1))


def _mx_pack(chunk, g=None, *, quantize, fmt, rule, axis):
    kwargs = {"scale_rule": rule} if g is None else {"scale_rule": rule, "global_scale": np.float32(g)}
    parts = quantize(chunk, fmt, axis=axis, **kwargs)
    return np.concatenate([parts[0].view(np.uint8), parts[1].view(np.uint8)], axis=axis)


def _mx_unpack(packed, *, axis, block_size, codes: bool, dtype):
    k = _packed_length(packed.shape[axis], block_size)
    index = [slice(None)] * packed.ndim
    index[axis] = slice(0, k) if codes else slice(k, None)
    return np.ascontiguousarray(packed[tuple(index)]).view(dtype)


def _chunk_amax(chunk, *, amax, rule):
    return np.asarray(amax(chunk, rule), np.float32).reshape((1,) * chunk.ndim)


def _tensor_scale(amax, *, scale_from_amax, rule):
    return np.asarray(scale_from_amax(np.asarray(amax, np.float32).reshape(()), rule), np.float32)


def mx_quantize(quantize, x, fmt, axis: int, rule, global_scale, nvfp4_amax, nvfp4_scale_from_amax):
    """``quantize`` (qlinear.mx.quantize, passed by the caller) on each chunk of dask ``x``, lazily: (codes,
    scales) or, for NVFP4, (codes, block scales, tensor scale), each a dask array. NVFP4's tensor scale, unless
    given, is a lazy 0-d array from a reduction over x's chunks (the reference's ``nvfp4_amax`` of each chunk,
    their maximum, ``nvfp4_scale_from_amax``), which every chunk's task then takes: x is read twice, once per
    pass, as the NumPy path reads it."""
    bs = fmt.block_size
    x = x.rechunk({axis: block_aligned_chunks(x.chunks[axis], bs, "qlinear.mx.quantize")})
    g = None
    if fmt.name == "nvfp4":
        if global_scale is None:
            maxima = x.map_blocks(functools.partial(_chunk_amax, amax=nvfp4_amax, rule=rule),
                                  chunks=tuple((1,) * len(c) for c in x.chunks), dtype=np.float32)
            g = maxima.max().map_blocks(
                functools.partial(_tensor_scale, scale_from_amax=nvfp4_scale_from_amax, rule=rule), dtype=np.float32)
        else:
            g = global_scale
    packed_chunks = list(x.chunks)
    packed_chunks[axis] = tuple(c + -(-c // bs) for c in x.chunks[axis])
    work = functools.partial(_mx_pack, quantize=quantize, fmt=fmt.name, rule=rule, axis=axis)
    args = ()
    if is_dask_array(g):  # a block of its own for every task
        args = (g,)
    elif g is not None:
        work = functools.partial(work, g=g)
    packed = x.map_blocks(work, *args, chunks=tuple(packed_chunks), dtype=np.uint8,
                          meta=np.empty((0,) * x.ndim, np.uint8))
    scale_chunks = list(x.chunks)
    scale_chunks[axis] = tuple(-(-c // bs) for c in x.chunks[axis])
    out = []
    parts = ((True, x.chunks, fmt.element.dtype), (False, tuple(scale_chunks), fmt.scale_type.dtype))
    for codes, chunks, dtype in parts:
        unpack = functools.partial(_mx_unpack, axis=axis, block_size=bs, codes=codes, dtype=dtype)
        out.append(packed.map_blocks(unpack, chunks=chunks, dtype=dtype, meta=np.empty((0,) * x.ndim, dtype)))
    if fmt.name == "nvfp4":
        out.append(g if is_dask_array(g) else np.asarray(g, np.float32))
    return tuple(out)


def _mx_dequantize_chunk(codes, scales, g=None, *, dequantize, axis):
    kwargs = {} if g is None else {"global_scale": np.asarray(g, np.float32)}
    return dequantize(codes, scales, axis=axis, **kwargs)


def _mx_scales_chunk(codes, block_info=None, *, scales, axis, block_size):
    location = block_info[0]["array-location"]
    index = [slice(start, stop) for start, stop in location]
    start, stop = location[axis]
    index[axis] = slice(start // block_size, -(-stop // block_size))
    return scales[tuple(index)]


def mx_dequantize(dequantize, codes, scales, fmt, axis: int, global_scale):
    """``dequantize`` (qlinear.mx.dequantize) on dask codes (and NumPy or dask scales, tensor scale), lazily."""
    bs = fmt.block_size
    codes = codes.rechunk({axis: block_aligned_chunks(codes.chunks[axis], bs, "qlinear.mx.dequantize")})
    scale_chunks = list(codes.chunks)
    scale_chunks[axis] = tuple(-(-c // bs) for c in codes.chunks[axis])
    if is_dask_array(scales):
        scales = scales.rechunk(tuple(scale_chunks))
    else:  # the scales' part for each chunk of codes, as a dask array chunked alike
        part = functools.partial(_mx_scales_chunk, scales=np.asarray(scales), axis=axis, block_size=bs)
        scales = codes.map_blocks(part, chunks=tuple(scale_chunks), dtype=scales.dtype,
                                  meta=np.empty((0,) * codes.ndim, scales.dtype))
    work = functools.partial(_mx_dequantize_chunk, dequantize=dequantize, axis=axis)
    args = [scales]
    if is_dask_array(global_scale):
        args.append(global_scale)
    elif global_scale is not None:
        work = functools.partial(work, g=np.asarray(global_scale, np.float32))
    return codes.map_blocks(work, *args, dtype=np.float32, meta=np.empty((0,) * codes.ndim, np.float32))
