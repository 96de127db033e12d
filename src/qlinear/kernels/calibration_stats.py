"""The arithmetic behind streaming calibration (`qlinear.io.observers`): a sample's summary, its histogram
counts, the expected squared error of a quantizer over a histogram, and two tensors' agreement.

Each function has a NumPy reference (``*_reference``) and a numba kernel that computes the same bits (the
agreement sums excepted: float64 sums in another order, see `agreement`). Calibration calls these once per
activation per sample (30,000 times for the OCR recogniser on 100 lines): in NumPy the temporaries and the
per-call overhead cost four times the float model's own run.

Nothing here imports numba until a kernel runs.
"""

from __future__ import annotations

import math

import numpy as np

from ._arguments import read_only
from .quantize_linear import kernels_enabled

_CHUNK = 1 << 16  # the references bin this many values at once: bounds their temporaries (~1 MB)
_ZERO_CHUNK = 1 << 20  # zeros counted this many at once: a 1 MB mask
_compiled = None


def _numba():
    global _compiled
    if _compiled is None:
        from . import _calibration_stats_numba

        _compiled = _calibration_stats_numba
    return _compiled


def _kernel_input(flat: np.ndarray) -> np.ndarray | None:
    """``flat`` as the kernels take it (contiguous float32 or float64), or None to use the reference."""
    if not kernels_enabled() or flat.dtype not in (np.float32, np.float64):
        return None
    return np.ascontiguousarray(flat)


# -- a sample's summary -----------------------------------------------------------------------------------

def summary(flat: np.ndarray) -> tuple[int, int, int, int, float, float]:
    """(finite, nan, inf, zeros, min, max) of a 1-D float array: the counts of finite, NaN, infinite and
    exactly-zero values, and the min and max of the finite ones (+inf and -inf when there are none; never
    -0.0). NumPy's SIMD reductions do it at memory speed when every value is finite (the usual case); the
    reference's masks only run when one is not."""
    if flat.size and flat.dtype in (np.float32, np.float64):
        # NumPy's min and max (SIMD) propagate NaN and see infinities: two finite results mean every value is.
        low, high = flat.min(), flat.max()
        if np.isfinite(low) and np.isfinite(high):
            zeros = sum(int(np.count_nonzero(flat[i:i + _ZERO_CHUNK] == 0)) for i in range(0, flat.size, _ZERO_CHUNK))
            return flat.size, 0, 0, zeros, float(low) + 0.0, float(high) + 0.0
    return summary_reference(flat)


def summary_reference(flat: np.ndarray) -> tuple[int, int, int, int, float, float]:
    finite = nan = inf = zeros = 0
    low, high = math.inf, -math.inf
    for start in range(0, flat.size, _CHUNK):
        v = flat[start:start + _CHUNK]
        ok = np.isfinite(v)
        bad = v.size - int(np.count_nonzero(ok))
        if bad:
            n = int(np.count_nonzero(np.isnan(v)))
            nan += n
            inf += bad - n
            v = v[ok]
        if v.size:
            finite += v.size
            zeros += int(np.count_nonzero(v == 0))
            low, high = min(low, float(v.min())), max(high, float(v.max()))
    return finite, nan, inf, zeros, low + 0.0, high + 0.0  # + 0.0: no -0.0


# -- histogram counts ---------------------------------------------------------------------------------------

def add_bins(flat: np.ndarray, width: float, lo: int, counts: np.ndarray, all_finite: bool = False) -> None:
    """counts[floor(x / width) - lo] += 1 for every finite x of ``flat`` (NaN and infinities are skipped).

    ``width`` is a power of two, so x / width is exact unless it underflows; a negative x that underflows
    to -0.0 still counts in bin -1 (floor(x / width) is -1 for every x < 0 close to 0). Every finite x must
    fall inside ``counts`` (a ValueError otherwise: the caller sized the window from the data's min and max).
    ``all_finite``: the caller knows that every value is finite (from `summary`), which allows a faster kernel.
    """
    x = _kernel_input(flat)
    if x is None:
        add_bins_reference(flat, width, lo, counts)
        return
    inverse = 1.0 / width  # a power of two too, unless it overflows (width subnormal): then divide
    if all_finite and x.dtype == np.float32 and math.isfinite(inverse) and x.size < 2**31:
        outside, _ = _numba().add_bins_in_window32(read_only(x), inverse, int(lo), counts)
    else:
        outside = _numba().add_bins(read_only(x), float(width), inverse if math.isfinite(inverse) else 0.0, int(lo), counts)
    if outside:
        raise ValueError(f"add_bins: {outside} values fall outside the {len(counts)} bins from {lo}")


def observe_in_window(flat: np.ndarray, width: float, lo: int, counts: np.ndarray, low: float,
                      high: float) -> tuple[int, float, float] | None:
    """`summary` and `add_bins` at once, for an observer whose window (``width``, ``lo``, ``counts``) and finite
    ``low`` and ``high`` so far are known: (zeros, new min, new max), the counts added; or None, nothing
    changed, when a value is not finite or falls outside the window (the caller then regrids first). The kernel
    counts (zeros apart) and NumPy takes the min and max, while the chunk is in the cache; float32 only (None
    otherwise), as onnxruntime's activations are."""
    inverse = 1.0 / width
    if not kernels_enabled() or flat.dtype != np.float32 or not math.isfinite(inverse) or flat.size >= 2**31:
        return None
    x = np.ascontiguousarray(flat)
    outside, zeros = _numba().add_bins_in_window32(read_only(x), inverse, int(lo), counts)
    if outside:
        return None
    return int(zeros), min(low, float(x.min())) + 0.0, max(high, float(x.max())) + 0.0


def add_bins_reference(flat: np.ndarray, width: float, lo: int, counts: np.ndarray) -> None:
    wide = flat.dtype.itemsize >= 8
    for start in range(0, flat.size, _CHUNK):
        v = flat[start:start + _CHUNK]
        v = v[np.isfinite(v)]
        if v.dtype != np.float32:
            v = v.astype(np.float64)
        # In float32 x * (1 / width) underflows only if width >= 2 (nonzero float32 values are >= 2**-149), and
        # overflows only if width < 2**-126: float64 outside that.
        if v.dtype == np.float32 and 2.0 ** -126 <= width < 2.0:
            q = v * np.float32(1.0 / width)
        else:
            q = v.astype(np.float64) / width
        np.floor(q, out=q)
        if wide:
            q[(q == 0) & (v < 0)] = -1.0
        q -= lo  # exact: small integers
        if q.size and (q.min() < 0 or q.max() >= len(counts)):
            raise ValueError(f"add_bins: values fall outside the {len(counts)} bins from {lo}")
        counts += np.bincount(q.astype(np.intp), minlength=len(counts))


# -- expected squared error of a quantizer over a histogram --------------------------------------------------

def _cube(x):
    return x * x * x  # not x ** 3: NumPy's power calls libm's pow, numba multiplies; the product is the same in both


def _rounding_integral(y):
    """The integral from -1/2 to y of (t - round(t))**2: 1/12 per whole step, plus the partial one."""
    n = np.floor(y + 0.5)
    f = y - n
    return n / 12.0 + (_cube(f) + 0.125) / 3.0


def _mean_rounding(u, v, s: float):
    """Mean of (x - s round(x/s))**2 over [u, v] (at the midpoint for a point piece)."""
    width = v - u
    point = width <= 1e-9 * s
    with np.errstate(divide="ignore", invalid="ignore"):
        spread = _cube(s) * (_rounding_integral(v / s) - _rounding_integral(u / s)) / np.where(point, 1.0, width)
    mid = (u + v) / 2
    nearest = mid - s * np.rint(mid / s)
    return np.where(point, nearest * nearest, spread)


def squared_errors(pieces: tuple, sums: tuple, s: float, levels: int) -> np.ndarray:
    """Expected total squared error of quantizing the distribution ``pieces`` = (u, v, c) (sorted disjoint
    pieces [u, v] holding c values spread uniformly; float64) with step ``s`` to the codes (k - z) s,
    k = 0..levels-1, for every zero point z = 0..levels-1 (index z of the result).

    ``sums`` = (n0, n1, n2, p0, p1, p2): prefix sums over the pieces [0, i) and suffix sums over [i, P) of
    c, c * mean and c * E[x**2] (`squared_error_sums`). Inside the clip range [a, b] = [-z s, (levels-1-z) s]
    a piece costs the exact mean of the rounding sawtooth over it; clipped values cost (x - b)**2 (or
    (x - a)**2), from the sums; the (at most two) pieces cut by a or b are split exactly."""
    u, v, c = pieces
    if kernels_enabled():
        out = np.empty(levels)
        _numba().squared_errors(u, v, c, *sums, float(s), int(levels), out)
        return out
    return squared_errors_reference(pieces, sums, s, levels)


def squared_error_sums(u: np.ndarray, v: np.ndarray, c: np.ndarray) -> tuple:
    """The prefix and suffix sums `squared_errors` takes, for the pieces (u, v, c)."""
    m1 = c * ((u + v) / 2)
    m2 = c * (u * u + u * v + v * v) / 3.0
    prefix = lambda x: np.concatenate(([0.0], np.cumsum(x)))  # noqa: E731
    suffix = lambda x: np.concatenate((np.cumsum(x[::-1])[::-1], [0.0]))  # noqa: E731
    return prefix(c), prefix(m1), prefix(m2), suffix(c), suffix(m1), suffix(m2)


def squared_errors_reference(pieces: tuple, sums: tuple, s: float, levels: int) -> np.ndarray:
    u, v, c = pieces
    n0, n1, n2, p0, p1, p2 = sums
    z = np.arange(levels, dtype=np.float64)
    a = -z * s
    b = (levels - 1 - z) * s
    below = np.searchsorted(v, a, side="right")  # pieces [0, below) end at or under a
    above = np.searchsorted(u, b, side="left")  # pieces [above, P) start at or over b
    first_in = np.searchsorted(u, a, side="left")  # pieces [first_in, last_in) lie in [a, b]
    last_in = np.maximum(np.searchsorted(v, b, side="right"), first_in)
    inside = np.concatenate(([0.0], np.cumsum(c * _mean_rounding(u, v, s))))
    errors = (n2[below] - 2 * a * n1[below] + a * a * n0[below]
              + p2[above] - 2 * b * p1[above] + b * b * p0[above]
              + inside[last_in] - inside[first_in])

    # The piece holding a inside it, and the one holding b (counted once if it is the same piece).
    ja = np.maximum(first_in - 1, 0)
    cut_a = (first_in > 0) & (v[ja] > a) & (u[ja] < a)
    jb = np.maximum(above - 1, 0)
    cut_b = (above > 0) & (v[jb] > b) & (u[jb] < b) & ~(cut_a & (jb == ja))
    for j, cut in ((ja, cut_a), (jb, cut_b)):
        uj, vj = u[j], v[j]
        lo, hi = np.minimum(np.maximum(a, uj), vj), np.minimum(np.maximum(b, uj), vj)
        total = (_cube(lo - a) - _cube(uj - a)) / 3.0 \
            + (hi - lo) * _mean_rounding(lo, hi, s) \
            + (_cube(vj - b) - _cube(hi - b)) / 3.0
        errors = errors + np.where(cut, c[j] * total / np.where(cut, vj - uj, 1.0), 0.0)
    return errors


# -- two tensors' agreement -----------------------------------------------------------------------------------

def agreement(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """(sum x**2, sum (x - y)**2, max |x - y|) in float64 over two same-shaped float arrays (NaN in
    x makes all three NaN, in y the last two). The kernel's sums may be reordered to vectorize and its maximum
    is rounded to the inputs' type: they may differ from the reference's in their last bits (they only feed the
    report)."""
    a = _kernel_input(np.asarray(x).reshape(-1))
    b = _kernel_input(np.asarray(y).reshape(-1))
    if a is None or b is None or a.dtype != b.dtype:
        return agreement_reference(x, y)
    signal, noise = _numba().squares(read_only(a), read_only(b))
    if noise != noise:
        return float(signal), float(noise), math.nan
    # numba does not vectorize a float maximum; NumPy does, in the inputs' type a chunk at a time. Rounding is
    # monotonic, so this is the exact maximum rounded to that type.
    worst = 0.0
    for start in range(0, a.size, _CHUNK):
        d = np.subtract(a[start:start + _CHUNK], b[start:start + _CHUNK])
        worst = max(worst, float(np.abs(d, out=d).max()))
    return float(signal), float(noise), worst


def agreement_reference(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    error = x - y
    worst = float(np.max(np.abs(error))) if error.size else 0.0
    return float(np.sum(x * x)), float(np.sum(error * error)), worst
