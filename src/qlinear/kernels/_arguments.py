"""How arrays are handed to numba kernels."""

from __future__ import annotations

import numpy as np


def read_only(a: np.ndarray) -> np.ndarray:
    """``a`` as a read-only view (itself when it is one already).

    numba compiles a kernel once per tuple of argument types, and an array's read-only flag is part of its type:
    an input the caller happened to pass read-only (a ``np.broadcast_to`` view, a memory map, a buffer) compiled
    the whole kernel again. Every array a kernel only reads is therefore passed read-only, always. In a cold test
    run the GEMM driver had 8 specializations, 7 of them read-only variants of one, and the QuantizeLinear and
    DequantizeLinear kernels 100 of 580."""
    if a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


CACHE_LINE = 64


def aligned_empty(count: int, dtype) -> np.ndarray:
    """``np.empty(count, dtype)`` starting on a cache line. NumPy aligns its data to 16 bytes only, and the
    kernels read their scratch in 64-byte vectors: the direct convolution's interleaved input took 8% longer on
    one thread and 9% on two at 16, 32 or 48 bytes past a line than on one (3x3 128/2 @56, Emerald Rapids; which
    one a call got changed from allocation to allocation)."""
    dtype = np.dtype(dtype)
    raw = np.empty(count * dtype.itemsize + CACHE_LINE, np.uint8)
    start = -raw.ctypes.data % CACHE_LINE
    return raw[start:start + count * dtype.itemsize].view(dtype)
