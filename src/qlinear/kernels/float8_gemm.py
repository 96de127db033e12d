"""Exact float8 (and float8 x int8/uint8) GEMM for QLinearMatMul-21: the sum of products rounded once to float64.

Internal API (the op validates arguments; :mod:`qlinear.reference.matmul_float8` is the spec this equals bit
for bit):

``max_depth(a_dtype, b_dtype) -> int``
    the largest K for which the scheme below is exact (about 2.7 million for e5m2fnuz x e5m2fnuz, far more
    for the e4m3 types).
``single_accumulator_depth(a_dtype, b_dtype) -> int``
    the largest K for which ``split=False`` is exact (about 1.75e8 for e4m3fn x e4m3fn; 0 when one product
    times 2**L can exceed int64, as for e5m2 x e5m2).
``exact_matmul(a_values, b_values, frac_bits, split=True) -> float64 ndarray``
    a_values (..., M, K), b_values (..., K, N): the centred operands ``a - a_zero_point``, ``b - b_zero_point``
    as float64 (exact), every finite value a multiple of 2**-s for its type; ``frac_bits`` = s_a + s_b.
    numpy.matmul's batch broadcasting; returns (..., M, N).

How it stays exact. Every product p = a * b is exact in float64 (at most 4 + 4, or 8 + 4, significant bits)
and a multiple of 2**-L (L = frac_bits <= 34) with |p| < 2**33. It is split into two integers,
``floor(p)`` and ``(p - floor(p)) * 2**L`` (both exact: p - floor(p) needs at most L bits), which are
accumulated in two int64 columns ``hi`` and ``lo``. At the end the carry ``lo >> L`` moves into ``hi``, so the
exact sum is ``hi + lo / 2**L`` with 0 <= lo < 2**L. When |hi| < 2**53 (guaranteed by `max_depth`),
``float64(hi) + float64(lo) * 2**-L`` has two exact operands, and its one IEEE addition is the correctly
rounded (nearest even) sum. Products with a NaN or Inf operand go to a third, float64 column, whose IEEE sum
(NaN, +/-Inf, or 0 if there were none) replaces the result where it is not 0.

With ``split=False`` (the e4m3 types and their mixes with int8/uint8, whose products times 2**L stay below
2**36) the products times 2**L go into one int64 accumulator, converted once to float64 (int64 -> float64 is
one correctly rounded conversion) and scaled by 2**-L (exact): about twice as fast.

Loop order i, k, j: the j loop runs over a row of b and the accumulator columns, which LLVM vectorises.
One thread; compilation is lazy and cached (cache=True).
"""

from __future__ import annotations

import numpy as np

from qlinear.reference.matmul_float8 import FLOAT8_TYPES, fraction_bits

try:  # numba is a dependency; without it the op falls back to the reference
    from qlinear.kernels import ensure_fresh_numba_cache

    ensure_fresh_numba_cache()  # before any cached kernel loads
    from numba import njit

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised only on installs without numba
    njit = None
    HAVE_NUMBA = False

_FLOAT64_EXACT = 2**53
_INT64_MAX = 2**63 - 1


def _max_magnitude(dtype) -> int:
    """The largest |x - x_zero_point| of a type: 255 for int8/uint8, the largest finite value for float8."""
    dtype = np.dtype(dtype)
    if dtype in FLOAT8_TYPES:
        import ml_dtypes

        return int(float(ml_dtypes.finfo(dtype).max))
    info = np.iinfo(dtype)
    return int(info.max) - int(info.min)


def max_depth(a_dtype, b_dtype) -> int:
    """The largest K for which `exact_matmul` is exact: ``lo`` < K * 2**L stays in int64, and
    |hi| <= K * (max|p| + 1) plus the carry (< K) stays below 2**53."""
    frac_bits = fraction_bits(a_dtype) + fraction_bits(b_dtype)
    largest_product = _max_magnitude(a_dtype) * _max_magnitude(b_dtype)
    return min(_INT64_MAX >> frac_bits, (_FLOAT64_EXACT - 1) // (largest_product + 2))


if HAVE_NUMBA:

    @njit(cache=True, nogil=True)
    def _exact_gemm(a, b, frac_bits, split, out):  # pragma: no cover - compiled
        m, k = a.shape
        n = b.shape[1]
        scale = np.float64(2.0) ** frac_bits
        inv_scale = np.float64(1.0) / scale
        mask = (np.int64(1) << np.int64(frac_bits)) - np.int64(1)
        hi = np.empty(n, np.int64)
        lo = np.empty(n, np.int64)
        special = np.empty(n, np.float64)
        for i in range(m):
            hi[:] = 0
            lo[:] = 0
            special[:] = 0.0
            for kk in range(k):
                x = a[i, kk]
                if split:
                    for j in range(n):
                        p = x * b[kk, j]
                        finite = p - p == 0.0  # False for NaN and +/-Inf
                        p_finite = p if finite else 0.0
                        special[j] += 0.0 if finite else p
                        whole = np.floor(p_finite)
                        hi[j] += np.int64(whole)
                        lo[j] += np.int64((p_finite - whole) * scale)
                else:
                    for j in range(n):
                        p = x * b[kk, j]
                        finite = p - p == 0.0
                        special[j] += 0.0 if finite else p
                        lo[j] += np.int64((p if finite else 0.0) * scale)
            for j in range(n):
                if special[j] != 0.0:  # NaN or +/-Inf: the IEEE sum of the non-finite products
                    out[i, j] = special[j]
                elif split:
                    whole_part = hi[j] + (lo[j] >> np.int64(frac_bits))
                    fraction = lo[j] & mask
                    out[i, j] = np.float64(whole_part) + np.float64(fraction) * inv_scale
                else:
                    # int64 -> float64 rounds once, to nearest even (LLVM's sitofp; cvtsi2sd/vcvtqq2pd
                    # under the default MXCSR); the power-of-two scaling is exact
                    out[i, j] = np.float64(lo[j]) * inv_scale


def single_accumulator_depth(a_dtype, b_dtype) -> int:
    """The largest K for which one int64 accumulator of the products times 2**L cannot overflow."""
    frac_bits = fraction_bits(a_dtype) + fraction_bits(b_dtype)
    return _INT64_MAX // ((_max_magnitude(a_dtype) * _max_magnitude(b_dtype)) << frac_bits)


def exact_matmul(a_values: np.ndarray, b_values: np.ndarray, frac_bits: int, split: bool = True) -> np.ndarray:
    """See the module docstring. The caller checks K <= max_depth(...), and with ``split=False`` (one
    accumulator) K <= single_accumulator_depth(...)."""
    (m, k), n = a_values.shape[-2:], b_values.shape[-1]
    batch = np.broadcast_shapes(a_values.shape[:-2], b_values.shape[:-2])
    a_b = np.broadcast_to(a_values, batch + (m, k))
    b_b = np.broadcast_to(b_values, batch + (k, n))
    out = np.empty(batch + (m, n), np.float64)
    for index in np.ndindex(*batch):
        _exact_gemm(np.ascontiguousarray(a_b[index]), np.ascontiguousarray(b_b[index]), np.int64(frac_bits),
                    bool(split), out[index])
    return out
