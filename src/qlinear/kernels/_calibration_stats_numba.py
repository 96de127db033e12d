"""The numba half of `qlinear.kernels.calibration_stats` (see there for what each function computes).

The operations are those of the references, in the same order, so that the results are the same bits:
numba compiles without fast-math, so LLVM neither contracts a * b + c into a fused multiply-add nor
reorders sums.
"""

from __future__ import annotations

import math

import numpy as np
from qlinear.kernels import ensure_fresh_numba_cache

ensure_fresh_numba_cache()  # before any cached kernel loads
from numba import njit  # noqa: E402

_JIT = dict(cache=True, nogil=True, error_model="numpy")


_CHUNK = 4096  # slots computed at once (vectorized), then counted


@njit(**_JIT)
def add_bins_in_window32(x, inverse, lo, counts):
    """`add_bins` for float32 values expected finite and inside the window: x * inverse is exact in float64
    (float32 values have 24 bits, inverse is a power of two: no rounding, no underflow), so floor needs no -0.0
    fix. The slots of a chunk are computed first (16 lanes at a time), then counted into 4 interleaved
    histograms, so that values landing in the same bin (a ReLU's) do not wait for each other's increment; exact
    zeros get a slot of their own (then added to the bin of 0), and two guard slots catch values outside the
    window, NaN and infinities. If any landed there, nothing is counted. Returns (outside, zeros). (The min and
    max are NumPy's business: its SIMD reductions cost less than comparing here, where a ReLU6's many values at
    its max would make every comparison a branch to mispredict.)"""
    size = counts.size
    stride = size + 3  # slot 0: below the window; 1..size: the bins; size + 1: above; size + 2: exact zeros
    top = np.float64(size + 1)
    shift = np.float64(lo - 1)
    zero_slot = np.float64(size + 2)
    sub = np.zeros(4 * stride, np.int32)  # half the cache of int64; the caller passes < 2**31 values
    index = np.empty(_CHUNK, np.int32)
    n = x.size
    for start in range(0, n, _CHUNK):
        m = min(_CHUNK, n - start)
        for i in range(m):
            v = x[start + i]
            q = math.floor(np.float64(v) * inverse) - shift
            q = q if q > 0.0 else 0.0  # NaN too
            q = q if q < top else top
            index[i] = zero_slot if v == 0 else q
        m4 = m - m % 4
        for i in range(0, m4, 4):
            for j in range(4):
                sub[j * stride + index[i + j]] += 1
        for i in range(m4, m):
            sub[index[i]] += 1
    outside = np.int64(0)
    zeros = np.int64(0)
    for j in range(4):
        outside += sub[j * stride] + sub[j * stride + size + 1]
        zeros += sub[j * stride + size + 2]
    if outside:
        return outside, zeros
    for k in range(size):
        counts[k] += sub[k + 1] + sub[stride + k + 1] + sub[2 * stride + k + 1] + sub[3 * stride + k + 1]
    counts[-lo] += zeros
    return outside, zeros


@njit(**_JIT)
def add_bins(x, width, inverse, lo, counts):
    """Any finite or not float32/float64 values. Returns how many finite values fell outside ``counts``."""
    size = counts.size
    outside = np.int64(0)
    for i in range(x.size):
        v = np.float64(x[i])
        if v - v != 0:
            continue
        q = v * inverse if inverse != 0.0 else v / width
        k = np.int64(math.floor(q))
        if k == 0 and v < 0:  # underflowed to -0.0 (floor(-0.0) is -0.0)
            k = -1
        k -= lo
        if 0 <= k < size:
            counts[k] += 1
        else:
            outside += 1
    return outside


@njit(**_JIT)
def _rounding_integral(y):
    n = math.floor(y + 0.5)
    f = y - n
    return n / 12.0 + (f * f * f + 0.125) / 3.0


@njit(**_JIT)
def _mean_rounding(u, v, s):
    width = v - u
    if width <= 1e-9 * s:
        mid = (u + v) / 2
        nearest = mid - s * np.rint(mid / s)
        return nearest * nearest
    return s * s * s * (_rounding_integral(v / s) - _rounding_integral(u / s)) / width


@njit(**_JIT)
def _cut(u, v, c, j, a, b, s):
    """The error of piece j, which a or b cuts: clipped below a, rounded inside, clipped above b."""
    uj = u[j]
    vj = v[j]
    lo = min(max(a, uj), vj)
    hi = min(max(b, uj), vj)
    da, ua, vb, hb = lo - a, uj - a, vj - b, hi - b
    total = (da * da * da - ua * ua * ua) / 3.0 + (hi - lo) * _mean_rounding(lo, hi, s) \
        + (vb * vb * vb - hb * hb * hb) / 3.0
    return c[j] * total / (vj - uj)


@njit(**_JIT)
def squared_errors(u, v, c, n0, n1, n2, p0, p1, p2, s, levels, out):
    pieces = u.size
    inside = np.empty(pieces + 1)
    inside[0] = 0.0
    for i in range(pieces):
        inside[i + 1] = inside[i] + c[i] * _mean_rounding(u[i], v[i], s)
    for zi in range(levels):
        z = np.float64(zi)
        a = -z * s
        b = (levels - 1 - z) * s
        below = np.searchsorted(v, a, side="right")
        above = np.searchsorted(u, b, side="left")
        first_in = np.searchsorted(u, a, side="left")
        last_in = max(np.searchsorted(v, b, side="right"), first_in)
        error = (n2[below] - 2 * a * n1[below] + a * a * n0[below]
                 + p2[above] - 2 * b * p1[above] + b * b * p0[above]
                 + inside[last_in] - inside[first_in])
        ja = max(first_in - 1, 0)
        cut_a = first_in > 0 and v[ja] > a and u[ja] < a
        jb = max(above - 1, 0)
        cut_b = above > 0 and v[jb] > b and u[jb] < b and not (cut_a and jb == ja)
        error = error + (_cut(u, v, c, ja, a, b, s) if cut_a else 0.0)
        error = error + (_cut(u, v, c, jb, a, b, s) if cut_b else 0.0)
        out[zi] = error


# The sums may be reordered (so that they vectorize): the report's SQNR does not need their last bits.
_SUMS = dict(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc", "nsz", "contract"})


@njit(**_SUMS)
def squares(x, y):
    """(sum x**2, sum (x - y)**2) in float64."""
    signal = 0.0
    noise = 0.0
    for i in range(x.size):
        a = np.float64(x[i])
        e = a - np.float64(y[i])
        signal += a * a
        noise += e * e
    return signal, noise
