"""Calibrate and quantize through dask: tensors larger than memory (``--chunks SIZE``, zarr stores,
tensors above `AUTO_BYTES`).

1. calibration as dask reductions (min and max per group, both computed in one pass over the data);
2. `qlinear.quantize_linear` on the dask array (lazy, chunk by chunk, the same kernels as NumPy), with
   the report's error figures (sum of x², sum of squared error, max |error|) as lazy reductions of
   `qlinear.dequantize_linear` of the same chunks;
3. the writer stores the lazy values chunk by chunk: a zarr array (in parallel, the figures computed
   in the same pass), or, for .npz/.safetensors outputs whose writers take a tensor in order, band of
   rows after band of rows (`quantize_bands`).

Chunks are chosen by dask's "auto" rule under the size limit, following a zarr array's own chunks;
for blocked quantization their edges along the blocked axis are multiples of the block size (a block
is never split). Peak memory is a few chunks per worker thread (the float64 error figures are the
largest temporaries), not the tensor, plus the scales and zero points and, for blocked quantization,
the float64 per-block ranges they are computed from (1/16 of a float32 input each with blocks of 32).
"""

from __future__ import annotations

import math
import uuid

import numpy as np

from .. import calibrate
from ..granularity import Granularity
from .calibration import parameters
from .chunks import param_rows
from .quantization import quantize_chunk
from .plan import ChunkSize, Stats

AUTO_BYTES = 1 << 30  # tensors above this go through dask without --chunks
DEFAULT_CHUNK_BYTES = 64 << 20  # per chunk of input, when dask is used without --chunks


def chunk_size_for(chunks: ChunkSize | None, nbytes: int, plot: bool) -> ChunkSize | None:
    """How a tensor of ``nbytes`` is chunked: --chunks, or the default above `AUTO_BYTES` when dask is
    installed and --plot is not asked for; None for the in-memory path."""
    if chunks is not None:
        return chunks
    if nbytes > AUTO_BYTES and not plot:
        try:
            import dask.array  # noqa: F401
        except ImportError:  # the NumPy path streams memory maps as well, only serially
            return None
        return ChunkSize(nbytes=DEFAULT_CHUNK_BYTES)
    return None


def chunks_for(shape, dtype, size: ChunkSize, gran: Granularity, previous=None, rows_only: bool = False):
    """dask chunks for ``shape`` under ``size``: dask's auto rule (following ``previous``, a zarr
    array's chunks), or whole rows when ``rows_only``; blocked axes cut on block edges."""
    from dask.array.core import normalize_chunks

    dtype = np.dtype(dtype)
    limit = max(1, size.limit(dtype.itemsize))
    if rows_only:
        row_bytes = dtype.itemsize * max(1, math.prod(shape[1:]))
        rows = max(1, limit // row_bytes)
        if gran.kind == "block" and gran.axis == 0:
            rows = max(1, rows // gran.block_size) * gran.block_size
        return normalize_chunks((rows,) + tuple(shape[1:]), shape)
    chunks = normalize_chunks("auto", shape, limit=limit, dtype=dtype, previous_chunks=previous)
    if gran.kind == "block":
        step = max(1, chunks[gran.axis][0] // gran.block_size) * gran.block_size
        chunks = chunks[:gran.axis] + (normalize_chunks((step,), (shape[gran.axis],))[0],) + chunks[gran.axis + 1:]
    return chunks


def lazy_ranges(x, gran: Granularity):
    """Lazy (min, max) per group of a dask array chunked on block edges (float64 after compute)."""
    if gran.kind == "tensor":
        return x.min(), x.max()
    if gran.kind == "axis":
        others = tuple(i for i in range(x.ndim) if i != gran.axis)
        return x.min(axis=others), x.max(axis=others)
    # Blocks: each chunk holds whole blocks along the axis, so each reduces on its own.
    chunks = list(x.chunks)
    chunks[gran.axis] = tuple(-(-c // gran.block_size) for c in x.chunks[gran.axis])

    def reducer(how):
        def reduce(chunk):
            return calibrate.reduce_groups(chunk, Granularity("block", chunk.shape, gran.axis, gran.block_size), how)
        return x.map_blocks(reduce, chunks=tuple(chunks), dtype=np.float64)
    return reducer("min"), reducer("max")


def calibrate_dask(where: str, x, gran: Granularity, qtype, symmetric: bool):
    """(scale, zero point) of dask array ``x``, computed in one pass."""
    import dask

    low, high = dask.compute(*lazy_ranges(x, gran))
    return parameters(where, np.asarray(low, np.float64), np.asarray(high, np.float64), qtype, symmetric)


def quantize_graph(x, gran: Granularity, qtype, scale, zero_point):
    """Lazy quantized values of dask ``x`` and the lazy error figures (signal, noise, max |error|)."""
    q, restored = quantize_chunk(x, scale, zero_point, qtype, gran.attributes())  # lazily, chunk by chunk
    x64 = x.astype(np.float64)
    error = x64 - restored.astype(np.float64)
    return q, ((x64 * x64).sum(), (error * error).sum(), abs(error).max())


def stats_of(signal, noise, max_abs_error) -> Stats:
    return Stats(signal=float(signal), noise=float(noise), max_abs_error=float(max_abs_error))


class _ReleasingRows:
    """Rows of a memory map read as copies, after which their pages are released (``release`` from
    `formats.tensor_files.page_releaser`), so the resident memory of a pass stays near the chunks in flight."""

    def __init__(self, x, release):
        self.x, self.release = x, release
        self.shape, self.dtype, self.ndim = x.shape, x.dtype, x.ndim

    def __getitem__(self, key):
        rows = np.array(self.x[key])
        first = key[0] if isinstance(key, tuple) else key
        if isinstance(first, slice):
            start, stop, _ = first.indices(self.shape[0])
            self.release(start, stop)
        return rows


def lazy_rows(x, gran: Granularity, size: ChunkSize, release=None):
    """An array with NumPy slicing (a memory map, rank >= 1) as a dask array of whole-row chunks.
    ``release(start_row, stop_row)``, when given, drops the pages of rows once read."""
    import dask.array as da

    chunks = chunks_for(tuple(x.shape), x.dtype, size, gran, rows_only=True)
    source = _ReleasingRows(x, release) if release is not None else x
    # An explicit name: dask would otherwise tokenize the array by hashing (for the wrapper: pickling) its data.
    return da.from_array(source, chunks=chunks, asarray=True, lock=False, meta=np.empty((0,) * x.ndim, x.dtype),
                         name=f"qlinear-rows-{uuid.uuid4().hex}")


def quantize_bands(lazy, gran: Granularity, qtype, scale, zero_point, sink, progress=None) -> Stats:
    """Quantize a dask array of whole-row chunks (`lazy_rows`) one band of rows after another, so that
    ``sink`` receives the quantized values in order."""
    import dask

    stats = Stats()
    row_bytes = lazy.dtype.itemsize * max(1, math.prod(lazy.shape[1:]))
    start = 0
    for rows in lazy.chunks[0]:
        stop = start + rows
        band = Granularity(gran.kind, (rows,) + tuple(lazy.shape[1:]), gran.axis, gran.block_size)
        q, figures = quantize_graph(lazy[start:stop], band, qtype, param_rows(scale, gran, start, stop),
                                    param_rows(zero_point, gran, start, stop))
        values, signal, noise, max_error = dask.compute(q, *figures)
        stats.signal += float(signal)
        stats.noise += float(noise)
        stats.max_abs_error = max(stats.max_abs_error, float(max_error))
        sink(values)
        if progress is not None:
            progress((stop - start) * row_bytes / 2)
        start = stop
    return stats
