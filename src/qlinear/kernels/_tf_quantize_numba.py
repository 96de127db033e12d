"""The numba half of `qlinear.kernels.tf_quantize`: TensorFlow's QuantizeV2/Dequantize element loops.

Each element function is the per-element part of the matching NumPy reference function in
`qlinear.reference.tf_quantize` (named in its docstring), with the same float32 operations in the same
order; the per-slice constants arrive precomputed. ``_ftz`` reproduces the FTZ/DAZ flags TensorFlow's
threads run with. Imported on the first kernel call; compiled lazily, cached on disk. Threads:
`qlinear.kernels.threads.run_chunked` over independent items (elements or rows).
"""

from __future__ import annotations

import numpy as np
from qlinear.kernels import ensure_fresh_numba_cache

ensure_fresh_numba_cache()  # before any cached kernel loads
from numba import njit  # noqa: E402

from ._prefetch import BLOCK, prefetch_ahead
from ._vector_width import use_512_bit_vectors

_JIT = dict(cache=True, nogil=True, error_model="numpy")

_FLT_MIN = np.float32(np.finfo(np.float32).tiny)
_ZERO = np.float32(0.0)
_HALF = np.float32(0.5)
_ONE = np.float32(1.0)
_INT32_MIN_F = np.float32(-(2.0**31))
_TWO_31 = np.float32(2.0**31)

# modes, as `qlinear.kernels.tf_quantize` numbers them
Q_SCALED_EVEN, Q_SCALED_AWAY, Q_COMBINED_SIGNED, Q_COMBINED_UNSIGNED, Q_FIRST = 0, 1, 2, 3, 4
# The same modes without the flushes that cannot change the integer result for the slice constants at hand
# (`qlinear.kernels.tf_quantize._no_flush` decides): mode + Q_NO_FLUSH.
Q_NO_FLUSH = 5
# MIN_COMBINED when every |min| >= 2^-102: not even the flush of clamped - min (it is never subnormal then).
Q_COMBINED_SIGNED_EXACT, Q_COMBINED_UNSIGNED_EXACT = 10, 11
DQ_COMBINED, DQ_FIRST, DQ_SCALED, DQ_SCALED_WRAP = 0, 1, 2, 3


@njit(**_JIT)
def _ftz(v):
    """A subnormal float32 becomes a zero of its sign (v * 0 keeps the sign); NaN and the rest pass."""
    return v * _ZERO if abs(v) < _FLT_MIN else v


@njit(**_JIT)
def _round_half_away(v):
    whole = np.trunc(v)
    frac = np.float32(v - whole)
    step = _ONE if frac >= _HALF else (-_ONE if frac <= -_HALF else _ZERO)
    return np.float32(whole + step)


_PRED_HALF = np.nextafter(np.float32(0.5), np.float32(0))  # 0.49999997


@njit(inline="always", **_JIT)
def _round_half_away_to_int(v):
    """_round_half_away for a value that is next converted to an integer: trunc(v + copysign(0.49999997, v)),
    two vector operations fewer. Equal to _round_half_away on every finite float32 (checked exhaustively:
    adding the float below 0.5 can round up only past a half) except that a zero may have the other sign,
    which the integer conversion erases; NaN and +-inf pass."""
    return np.trunc(np.float32(v + np.copysign(_PRED_HALF, v)))


@njit(**_JIT)
def _np_minimum(a, b):  # NumPy's minimum: NaN in, NaN out
    return b if a > b else a


@njit(**_JIT)
def _np_maximum(a, b):
    return b if a < b else a


@njit(**_JIT)
def _to_int_bits(r, nan_value):
    """_float_to_int_bits: non-finite -> nan_value, else the integer (int32, narrowed by the store).
    Written as selects (no early return) so that the loop vectorises."""
    finite = abs(r) <= np.float32(3e38)
    # The only value at or beyond 2**31 the kernel can round to is 2**31 itself (qint32), which the
    # reference's int64 -> int32 narrowing wraps to INT32_MIN; everything else converts in 32 bits.
    big = r >= _TWO_31
    safe = r if (finite and not big) else _ZERO
    as_int = np.int32(-(2**31)) if big else np.int32(safe)
    return as_int if finite else np.int32(nan_value)


@njit(inline="always", **_JIT)  # inlined in numba's IR, so each loop sees a constant mode
def _quantize_one(x, mode, a, b, c, half_range, lower, upper, nan_value):
    """One element. SCALED: a=scale, b=out_min, c=out_max. MIN_COMBINED: a=scale, b=min, c=max.
    MIN_FIRST: a=range_scale, b=offset. ``mode >= Q_NO_FLUSH``: only the flushes listed in
    `qlinear.kernels.tf_quantize._no_flush` as needed run."""
    flush = mode < Q_NO_FLUSH
    exact_difference = mode >= Q_COMBINED_SIGNED_EXACT
    base = mode if flush else (mode - Q_NO_FLUSH if not exact_difference else mode - Q_COMBINED_SIGNED_EXACT + 2)
    if flush:
        x = _ftz(x)  # DAZ
    if base == Q_SCALED_EVEN or base == Q_SCALED_AWAY:
        clamped = _np_maximum(_np_minimum(x, c), b)
        v = np.float32(clamped * a)
        if flush:
            v = _ftz(v)
        r = np.rint(v) if base == Q_SCALED_EVEN else _round_half_away_to_int(v)
        return _to_int_bits(r, nan_value)
    if base == Q_COMBINED_SIGNED or base == Q_COMBINED_UNSIGNED:
        clamped = _np_maximum(_np_minimum(x, c), b)
        difference = np.float32(clamped - b)
        scaled = np.float32((difference if exact_difference else _ftz(difference)) * a)
        if flush:
            scaled = _ftz(scaled)
        if base == Q_COMBINED_SIGNED:
            shifted = np.float32(scaled - half_range)
            r = _round_half_away_to_int(_ftz(shifted) if flush else shifted)
        else:
            shifted = np.float32(scaled + _HALF)
            r = np.trunc(_ftz(shifted) if flush else shifted)
        return _to_int_bits(r, nan_value)
    # MIN_FIRST
    if flush:
        v = _ftz(np.float32(_round_half_away_to_int(_ftz(np.float32(x * a))) - b))
    else:
        v = np.float32(_round_half_away_to_int(np.float32(x * a)) - b)
    v = _np_minimum(_np_maximum(v, lower), upper)
    nan = v != v
    as_int = np.int32(_ZERO if nan else v)  # v lies in [-2**31, 2147483520] here: exact in 32 bits
    return np.int32(-(2**31)) if nan else as_int  # NaN: cvttps2dq's "integer indefinite"


@njit(inline="always", **_JIT)
def _dequantize_one(q, mode, a, b, half):
    """One element. MIN_COMBINED: a=scale, b=min. MIN_FIRST: a=range_scale, b=offset. SCALED: a=scale."""
    qf = np.float32(q)
    if mode == DQ_COMBINED:
        return _ftz(np.float32(_ftz(np.float32(_ftz(np.float32(qf + half)) * a)) + b))
    if mode == DQ_FIRST:
        return _ftz(np.float32(b + _ftz(np.float32(qf * a))))
    if mode == DQ_SCALED_WRAP and qf >= _TWO_31:
        qf = _INT32_MIN_F  # (int)(float)q wraps for per-tensor qint32
    return _ftz(np.float32(qf * a))


@njit(inline="always", **_JIT)
def _quantize_rows(x, out, a, b, c, post, mode, half_range, lower, upper, nan_value, row_start, row_stop, slices):
    """Rows [row_start, row_stop) of x and out, [rows, post] flattened; row r belongs to slice r % slices. In
    blocks with the input prefetched ahead (`qlinear.kernels._prefetch`); unsigned offsets into slices starting
    at 0, so LLVM sees non-negative indices."""
    for r in range(row_start, row_stop):
        s = r % slices
        av, bv, cv = a[s], b[s], c[s]
        i = r * post
        xs = x[i:i + post]
        os = out[i:i + post]
        for first in range(0, post, BLOCK):
            m = min(BLOCK, post - first)
            prefetch_ahead(x, i + first, m)
            u = np.uint64(first)
            for k in range(m):
                os[u + np.uint64(k)] = _quantize_one(xs[u + np.uint64(k)], mode, av, bv, cv, half_range, lower,
                                                     upper, nan_value)


@njit(inline="always", **_JIT)
def _quantize_last_axis(x, out, a, b, c, slices, mode, half_range, lower, upper, nan_value, row_start, row_stop):
    """post == 1: each row is the whole slice axis, parameters per element."""
    for r in range(row_start, row_stop):
        i = r * slices
        xs = x[i:i + slices]
        os = out[i:i + slices]
        for first in range(0, slices, BLOCK):
            m = min(BLOCK, slices - first)
            prefetch_ahead(x, i + first, m)
            u = np.uint64(first)
            for k in range(m):
                e = u + np.uint64(k)
                os[e] = _quantize_one(xs[e], mode, a[e], b[e], c[e], half_range, lower, upper, nan_value)


def _make_quantize_serial(mode: int):
    """``quantize_serial`` for one mode: a kernel of its own per mode, compiled when first called, in which
    ``mode`` is a constant (a closure variable), so that _quantize_one folds to that mode's operations and each
    loop is a straight vectorisable one (a runtime mode leaves every branch in the loop body: 3-13x slower).
    One kernel holding every mode took numba's front end ~30 s to compile per output type. (It reads no other
    closure: numba's disk cache keys a closure by its variables' pickles, and a kernel's differs per process.)"""

    @njit(**_JIT)
    def quantize_serial(x, out, a, b, c, post, slices, half_range, lower, upper, nan_value, start, stop):
        """Items [start, stop): elements (per-tensor), rows of the slice axis (axis last), else rows."""
        use_512_bit_vectors()
        if slices == 1:
            _quantize_rows(x[start:stop], out[start:stop], a, b, c, stop - start, mode, half_range, lower, upper,
                           nan_value, 0, 1, 1)
        elif post == 1:
            _quantize_last_axis(x, out, a, b, c, slices, mode, half_range, lower, upper, nan_value, start, stop)
        else:
            _quantize_rows(x, out, a, b, c, post, mode, half_range, lower, upper, nan_value, start, stop, slices)

    return quantize_serial


@njit(inline="always", **_JIT)
def _dequantize_rows(q, out, a, b, post, mode, half, row_start, row_stop, slices):
    """As `_quantize_rows`; the output's lines are requested too, for writing."""
    for r in range(row_start, row_stop):
        s = r % slices
        av, bv = a[s], b[s]
        i = r * post
        qs = q[i:i + post]
        os = out[i:i + post]
        for first in range(0, post, BLOCK):
            m = min(BLOCK, post - first)
            prefetch_ahead(q, i + first, m)
            prefetch_ahead(out, i + first, m, True)
            u = np.uint64(first)
            for k in range(m):
                os[u + np.uint64(k)] = _dequantize_one(qs[u + np.uint64(k)], mode, av, bv, half)


@njit(inline="always", **_JIT)
def _dequantize_last_axis(q, out, a, b, slices, mode, half, row_start, row_stop):
    for r in range(row_start, row_stop):
        i = r * slices
        qs = q[i:i + slices]
        os = out[i:i + slices]
        for first in range(0, slices, BLOCK):
            m = min(BLOCK, slices - first)
            prefetch_ahead(q, i + first, m)
            prefetch_ahead(out, i + first, m, True)
            u = np.uint64(first)
            for k in range(m):
                e = u + np.uint64(k)
                os[e] = _dequantize_one(qs[e], mode, a[e], b[e], half)


def _make_dequantize_serial(mode: int):
    """``dequantize_serial`` for one mode (see `_make_quantize_serial`)."""

    @njit(**_JIT)
    def dequantize_serial(q, out, a, b, post, slices, half, start, stop):
        use_512_bit_vectors()
        if slices == 1:
            _dequantize_rows(q[start:stop], out[start:stop], a, b, stop - start, mode, half, 0, 1, 1)
        elif post == 1:
            _dequantize_last_axis(q, out, a, b, slices, mode, half, start, stop)
        else:
            _dequantize_rows(q, out, a, b, post, mode, half, start, stop, slices)

    return dequantize_serial


# the kernels by mode code (`qlinear.kernels.tf_quantize` picks one per call)
QUANTIZE_SERIAL = tuple(_make_quantize_serial(mode) for mode in range(Q_COMBINED_UNSIGNED_EXACT + 1))
DEQUANTIZE_SERIAL = tuple(_make_dequantize_serial(mode) for mode in range(DQ_SCALED_WRAP + 1))
