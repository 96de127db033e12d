"""Exact integer GEMM / convolution on float32 BLAS (NumPy only): the path for CPUs without AVX2 or without numba,
and for the rare problems whose worst-case sum could leave int32 (it accumulates in float64 and checks).

Why it is exact: the centred operands (x - x_zp) and (w - w_zp) are integers of magnitude <= 255. A float32
product of a K-chunk is exact while chunk * max|x - x_zp| * max|w - w_zp| <= 2**24 (every partial sum is an
integer below 2**24, so no rounding can happen in any summation order BLAS chooses). Chunk results are added
in float64, exact while the total stays below 2**53, which holds for any K below 1.3e9.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from qlinear.errors import AccumulatorOverflowError
from qlinear.reference.requantize import requantize as reference_requantize

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
_F32_EXACT = 2**24


def exact_matmul(a_centered: np.ndarray, w_centered: np.ndarray) -> np.ndarray:
    """Exact ``a_centered @ w_centered`` (integer values in float arrays or int arrays) as float64.

    a_centered: (..., M, K), w_centered: (..., K, N); entries are integers with |v| <= 2**15.
    """
    k = a_centered.shape[-1]
    amax = float(np.max(np.abs(a_centered))) if a_centered.size else 0.0
    wmax = float(np.max(np.abs(w_centered))) if w_centered.size else 0.0
    a32 = a_centered.astype(np.float32, copy=False)
    w32 = w_centered.astype(np.float32, copy=False)
    per_term = max(amax * wmax, 1.0)
    chunk = max(1, int(_F32_EXACT // per_term))
    if chunk >= k:
        return np.matmul(a32, w32).astype(np.float64)
    out = None
    for k0 in range(0, k, chunk):
        part = np.matmul(a32[..., k0:k0 + chunk], w32[..., k0:k0 + chunk, :]).astype(np.float64)
        out = part if out is None else out + part
    return out


def to_int32_checked(func: str, acc: np.ndarray) -> np.ndarray:
    """float64 integer values -> int32, or a ValueError when the exact sum leaves int32 (never a silent wrap)."""
    if acc.size:
        lo, hi = float(acc.min()), float(acc.max())
        if lo < INT32_MIN or hi > INT32_MAX:
            bad = int(hi) if hi > INT32_MAX else int(lo)
            raise AccumulatorOverflowError(
                f"{func}: the exact accumulator leaves int32 (range [{int(lo)}, {int(hi)}]); "
                "the sum of (x - x_zero_point) * (w - w_zero_point) plus bias must fit in int32", bad)
    return acc.astype(np.int32)


def requantize(acc: np.ndarray, multiplier: np.ndarray, y_zero_point: int, y_dtype, mode: str) -> np.ndarray:
    """int32 accumulator -> int8/uint8: `qlinear.reference.requantize.requantize` itself (this path is NumPy too),
    with the kernels' argument forms (an int zero point and the output dtype)."""
    return reference_requantize(acc, np.asarray(multiplier), np.asarray(y_zero_point, dtype=y_dtype), mode)


def gemm_exact(func: str, a: np.ndarray, a_zero_point, w: np.ndarray, w_zero_point, bias) -> np.ndarray:
    """int32 ``sum_k (a - a_zp)(w - w_zp) + bias``; a (M, K), w (K, N); a_zp scalar or (M,); w_zp scalar or (N,)."""
    a_c = a.astype(np.int16) - np.asarray(a_zero_point, dtype=np.int16).reshape(-1, 1)
    w_c = w.astype(np.int16) - np.asarray(w_zero_point, dtype=np.int16).reshape(1, -1)
    acc = exact_matmul(a_c, w_c)
    if bias is not None:
        acc = acc + np.asarray(bias, dtype=np.float64).reshape(1, -1)
    return to_int32_checked(func, acc)


def conv_exact(func: str, x: np.ndarray, x_zero_point: int, w: np.ndarray, w_zero_point, bias, group: int,
               strides, dilations, pads_begin, pads_end) -> np.ndarray:
    """int32 N-D convolution accumulator (N, M, O...) by im2col + :func:`exact_matmul`, one matmul per group."""
    n_spatial = x.ndim - 2
    batch = x.shape[0]
    out_channels, group_channels = w.shape[:2]
    kernel = w.shape[2:]
    x_c = x.astype(np.int16) - np.int16(x_zero_point)
    x_c = np.pad(x_c, [(0, 0), (0, 0)] + list(zip(pads_begin, pads_end)))
    w_c = w.astype(np.int16) - np.asarray(w_zero_point, dtype=np.int16).reshape((-1,) + (1,) * (w.ndim - 1))
    extent = tuple(d * (k - 1) + 1 for k, d in zip(kernel, dilations))
    axes = tuple(range(2, 2 + n_spatial))
    win = sliding_window_view(x_c, extent, axis=axes)
    win = win[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides)
              + tuple(slice(None, None, d) for d in dilations)]
    out_spatial = win.shape[2:2 + n_spatial]
    positions = math.prod(out_spatial)
    taps = math.prod(kernel)
    win = win.reshape((batch, group, group_channels) + out_spatial + tuple(kernel))
    cols = np.moveaxis(win, 2, 2 + n_spatial).reshape(batch, group, positions, group_channels * taps)
    wg = w_c.reshape(group, out_channels // group, group_channels * taps).transpose(0, 2, 1)
    acc = exact_matmul(cols, wg)  # (N, group, positions, M/group)
    acc = acc.transpose(0, 1, 3, 2).reshape((batch, out_channels) + out_spatial)
    if bias is not None:
        acc = acc + np.asarray(bias, dtype=np.float64).reshape((1, out_channels) + (1,) * n_spatial)
    return to_int32_checked(func, acc)
