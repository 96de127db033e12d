"""Fast TensorFlow QuantizeV2 and Dequantize (TensorFlow's CPU-kernel arithmetic, not ``strict``).

Internal API, called at the dispatch point of `qlinear.tf.quantize` with the arguments its reference
functions take (``x`` viewed as ``[pre, slices, post]``, per-slice float32 ranges):

``quantize_v2(x3, min_range, max_range, dtype, mode, round_mode, narrow_range, ensure_minimum_range, strict, out=None)``
``dequantize(q3, min_range, max_range, mode, narrow_range, strict, out=None)``
    The reference's result, bit for bit, or None when no kernel covers the case (``strict=True``, numba
    missing, kernels switched off with `qlinear.kernels.quantize_linear.use_kernels(False)`).
    ``out``: None (the result is allocated here), or the array of x3's shape the result is written into and
    returned: a plain C-contiguous, aligned, writeable ndarray of the result's dtype sharing no memory with
    the inputs (the caller checks it, `qlinear._out.check`). Nothing is written into it when the answer is None.

The per-slice constants (adjusted ranges, scale factors, offsets) are computed here with the
reference's own NumPy helpers on arrays of ``slices`` elements; only the per-element part, the same
float32 operations in the same order with FTZ/DAZ, runs in numba (`_tf_quantize_numba`).
"""

from __future__ import annotations


import numpy as np

from ..reference import tf_quantize as ref
from . import output_pool, threads
from .quantize_linear import kernels_enabled

F32, F64 = np.float32, np.float64
_compiled = None


def _numba():
    global _compiled
    if _compiled is None:
        from . import _tf_quantize_numba

        _compiled = _tf_quantize_numba
    return _compiled


_empty = output_pool.empty_result


def _launch(name: str, shape: tuple[int, int, int], code: int, *args):
    """Run mode ``code``'s ``<name>_serial`` kernel over its items: elements (per-tensor), rows of the slice
    axis (per-axis, axis last) or rows of ``post`` elements (per-axis), in chunks on several threads."""
    pre, slices, post = shape
    if slices == 1:
        items, size = pre * slices * post, 1
    elif post == 1:
        items, size = pre, slices
    else:
        items, size = pre * slices, post
    threads.run_chunked(getattr(_numba(), name.upper() + "_SERIAL")[code], items, *args, item_size=size)


# Bounds of `_no_flush`: a subnormal times less than 2^124 is below 1/4 in magnitude, and subtracting
# it from a float of magnitude >= 2^-102 rounds back to that float.
_NO_FLUSH_SCALE = F32(2.0**124)
_NO_FLUSH_MIN = F32(2.0**-102)


def _no_flush(mode, a, b) -> bool:
    """Whether the element loop may skip the flushes the integer result cannot see, for these constants.

    Invisible whatever the constants: flushing a value that is next only rounded to an integer (a subnormal
    rounds to 0 either way, and the sign of a zero does not survive the conversion), and flushing a difference
    of two integral values or a value shifted by half_range / 0.5 (never subnormal). The input's DAZ is
    visible only through the next operation: SCALED and MIN_FIRST multiply x by the scale (harmless when
    every scale < 2^124: the product rounds to 0), MIN_COMBINED subtracts min (harmless when min == 0, since
    the difference is still flushed, or |min| >= 2^-102, where x - min rounds to -min). The remaining flush
    (MIN_COMBINED's difference) always runs.
    """
    if mode == ref.SCALED or mode == ref.MIN_FIRST:
        return bool(np.all(np.abs(a) < _NO_FLUSH_SCALE))
    return bool(np.all((b == 0) | (np.abs(b) >= _NO_FLUSH_MIN)))


# The per-slice constants are a pure function of the ranges, the type and the attributes, and computing
# them (a few dozen NumPy calls on tiny arrays) costs more than quantizing thousands of elements. A model
# quantizes with the same ranges call after call, so they are kept, keyed by the ranges' exact float32
# bits: a hit returns what the computation would. Only calls with at most _CACHED_SLICES slices are
# kept (bounded memory); the table is emptied when it reaches _CACHE_ENTRIES entries.
_CACHED_SLICES = 256
_CACHE_ENTRIES = 256
_quantize_constants_cache: dict[tuple, tuple] = {}
_dequantize_constants_cache: dict[tuple, tuple] = {}
_LIMITS: dict[np.dtype, tuple[int, int]] = {}


def _limits(dtype: np.dtype) -> tuple[int, int]:
    """(min, max) of an integer dtype (np.iinfo is slow to build)."""
    limits = _LIMITS.get(dtype)
    if limits is None:
        info = np.iinfo(dtype)
        limits = _LIMITS[dtype] = int(info.min), int(info.max)
    return limits


def _remember(cache: dict, key, value) -> None:
    if len(cache) >= _CACHE_ENTRIES:
        cache.clear()
    cache[key] = value


def _range_key(*attributes, min_range, max_range, slices):
    """The cache key of one call's per-slice constants: its attributes and the ranges' exact float32 bits
    (shapes included); None (not cached) above _CACHED_SLICES slices. The callers' ranges are float32 arrays
    (`qlinear.tf.quantize._range_values`); converting them is a no-op that makes the key's bytes their float32
    bits whatever the caller passes."""
    if slices > _CACHED_SLICES:
        return None
    mins, maxs = np.asarray(min_range, F32), np.asarray(max_range, F32)
    return attributes + (slices, mins.shape, mins.tobytes(), maxs.shape, maxs.tobytes())


def _cached(cache: dict, key, compute):
    """``cache[key]``, else ``compute()`` remembered under ``key`` (a None key or result is not cached; a
    None result means no kernel covers the call)."""
    if key is not None:
        hit = cache.get(key)
        if hit is not None:
            return hit
    value = compute()
    if value is not None and key is not None:
        _remember(cache, key, value)
    return value


def _quantize_constants(min_range, max_range, dtype, mode, round_mode, narrow_range, ensure_minimum_range,
                        slices):
    """(a, b, c, code, half_range, lower, upper, nan_value, out_min, out_max) for `_tf_quantize_numba.quantize`,
    computed as the reference computes them; None for a mode without a kernel."""
    nb = _numba()
    lo, hi = _limits(dtype)
    with np.errstate(all="ignore"):
        min_r, max_r = ref.adjust_range(min_range, max_range, F32(ensure_minimum_range))
        min_r, max_r = np.broadcast_to(min_r, (slices,)).astype(F32), np.broadcast_to(max_r, (slices,)).astype(F32)
        half_range, lower, upper = F32(0), F32(0), F32(0)
        if mode == ref.SCALED:  # _scaled
            min_out_f, max_out_f = F32(lo + (1 if narrow_range else 0)), F32(hi)
            from_min = np.where(ref._ftz(min_out_f * min_r) > 0, ref._ftz(min_out_f / min_r), ref.FLT_MAX)
            from_max = np.where(ref._ftz(max_out_f * max_r) > 0, ref._ftz(max_out_f / max_r), ref.FLT_MAX)
            scale = ref._cpp_min(from_min, from_max).astype(F32)
            out_min, out_max = ref._ftz(min_out_f / scale), ref._ftz(max_out_f / scale)
            a, b, c = scale, out_min, out_max
            code = nb.Q_SCALED_EVEN if round_mode == ref.HALF_TO_EVEN else nb.Q_SCALED_AWAY
        elif mode == ref.MIN_COMBINED:  # _min_combined
            a = ref._ftz(F64(hi - lo) / ref._ftz(max_r - min_r).astype(F64))
            b, c = min_r, max_r
            code, half_range = _min_combined_code(nb, lo, hi)
            out_min, out_max = min_r, max_r
        elif mode == ref.MIN_FIRST:  # _min_first
            bits = dtype.itemsize * 8
            width = ref._ftz(max_r - min_r)
            range_scale = np.where(max_r == min_r, F32(0),
                                   ref._ftz(F64(2.0**bits - 1.0) / width.astype(F64))).astype(F32)
            range_min_scaled = ref._round_half_away(ref._ftz(min_r * range_scale))
            a, b, c = range_scale, ref._ftz(range_min_scaled - F32(lo)), np.zeros(slices, F32)
            lower, upper = max(F32(lo), F32(-2.147483648e09)), min(F32(hi), F32(2.147483520e09))
            code = nb.Q_FIRST
            out_min, out_max = min_r, max_r
        else:
            return None
    a, b, c = (np.ascontiguousarray(v, F32).reshape(-1) for v in (a, b, c))
    if _no_flush(mode, a, b):
        code += nb.Q_NO_FLUSH
        if mode == ref.MIN_COMBINED and bool(np.all(np.abs(b) >= _NO_FLUSH_MIN)):
            # no min is 0 either: clamped - min is never subnormal (see _no_flush)
            code = nb.Q_COMBINED_SIGNED_EXACT if lo < 0 else nb.Q_COMBINED_UNSIGNED_EXACT
    nan_value = np.int64(lo if dtype in (np.dtype(np.int8), np.dtype(np.int16)) else 0)
    return (a, b, c, np.int64(code), F32(half_range), F32(lower), F32(upper), nan_value,
            np.asarray(out_min, F32).reshape(-1), np.asarray(out_max, F32).reshape(-1))


# One slice (per-tensor), SCALED and MIN_COMBINED: the constants on float32 scalars. A model whose ranges change
# on every call (computed from the data) misses the table above, and the array version's few dozen NumPy
# calls on 1-element arrays cost ~90 us; these are the same float32 (and float64) operations in the same order
# as the reference's (`ref.adjust_range`, `ref._scaled`, `ref._min_combined`, `ref.dequantize`), and IEEE
# arithmetic gives a scalar the value it gives an array element. tests/kernels/test_tf_quantize_constants_cache.py
# compares them with the array version on special ranges.
def _ftz1(v) -> np.float32:
    """`ref._ftz` of one value: float32, a subnormal flushed to the zero of its sign."""
    v = F32(v)
    return F32(np.copysign(F32(0), v)) if abs(v) < ref.FLT_MIN else v


def _min1(a, b):
    """`ref._cpp_min` of two scalars: std::min(a, b) = (b < a) ? b : a."""
    return b if b < a else a


def _max1(a, b):
    """`ref._cpp_max` of two scalars: std::max(a, b) = (a < b) ? b : a."""
    return b if a < b else a


def _min_combined_code(nb, lo, hi):
    """MIN_COMBINED's kernel code and half range: signed outputs are shifted by half the range, unsigned ones
    not (half range 0)."""
    if lo < 0:
        return nb.Q_COMBINED_SIGNED, F32((F64(hi) - F64(lo) + 1) / 2.0)
    return nb.Q_COMBINED_UNSIGNED, F32(0)


def _quantize_constants_one_slice(min_range, max_range, dtype, mode, round_mode, narrow_range,
                                  ensure_minimum_range):
    """`_quantize_constants` for one slice in SCALED or MIN_COMBINED mode; None for other modes."""
    if mode != ref.SCALED and mode != ref.MIN_COMBINED:
        return None
    nb = _numba()
    lo, hi = _limits(dtype)
    zero, one = F32(0), F32(1)
    with np.errstate(all="ignore"):
        # ref.adjust_range
        input_min, input_max = _ftz1(min_range[0]), _ftz1(max_range[0])
        min_r = _min1(zero, input_min)
        epsilon = _ftz1(_max1(one, _max1(abs(input_min), abs(input_max))) * _ftz1(ensure_minimum_range))
        max_r = _max1(zero, _max1(input_max, _ftz1(min_r + epsilon)))
        half_range = F32(0)
        if mode == ref.SCALED:  # _scaled
            min_out_f, max_out_f = F32(lo + (1 if narrow_range else 0)), F32(hi)
            from_min = _ftz1(min_out_f / min_r) if _ftz1(min_out_f * min_r) > 0 else ref.FLT_MAX
            from_max = _ftz1(max_out_f / max_r) if _ftz1(max_out_f * max_r) > 0 else ref.FLT_MAX
            scale = _min1(from_min, from_max)
            out_min, out_max = _ftz1(min_out_f / scale), _ftz1(max_out_f / scale)
            a, b, c = scale, out_min, out_max
            code = nb.Q_SCALED_EVEN if round_mode == ref.HALF_TO_EVEN else nb.Q_SCALED_AWAY
        else:  # _min_combined
            a = _ftz1(F64(hi - lo) / F64(_ftz1(max_r - min_r)))
            b, c = min_r, max_r
            code, half_range = _min_combined_code(nb, lo, hi)
            out_min, out_max = min_r, max_r
    a, b, c = (np.array([v], F32) for v in (a, b, c))
    if _no_flush(mode, a, b):
        code += nb.Q_NO_FLUSH
        if mode == ref.MIN_COMBINED and bool(np.all(np.abs(b) >= _NO_FLUSH_MIN)):
            code = nb.Q_COMBINED_SIGNED_EXACT if lo < 0 else nb.Q_COMBINED_UNSIGNED_EXACT
    nan_value = np.int64(lo if dtype in (np.dtype(np.int8), np.dtype(np.int16)) else 0)
    return (a, b, c, np.int64(code), F32(half_range), F32(0), F32(0), nan_value,
            np.array([out_min], F32), np.array([out_max], F32))


def quantize_v2(x3, min_range, max_range, dtype, mode, round_mode, narrow_range, ensure_minimum_range, strict,
                out=None):
    if strict or not kernels_enabled():
        return None
    dtype = np.dtype(dtype)
    pre, slices, post = x3.shape
    min_range, max_range = np.asarray(min_range, F32).reshape(-1), np.asarray(max_range, F32).reshape(-1)
    ensure = F32(ensure_minimum_range)

    def compute():
        if slices == 1 and min_range.size == 1 and max_range.size == 1:
            one = _quantize_constants_one_slice(min_range, max_range, dtype, mode, round_mode, narrow_range, ensure)
            if one is not None:
                return one
        return _quantize_constants(min_range, max_range, dtype, mode, round_mode, narrow_range, ensure, slices)

    key = _range_key(dtype, mode, round_mode, bool(narrow_range), ensure.tobytes(),
                     min_range=min_range, max_range=max_range, slices=slices)
    constants = _cached(_quantize_constants_cache, key, compute)
    if constants is None:
        return None
    a, b, c, code, half_range, lower, upper, nan_value, out_min, out_max = constants
    x = np.ascontiguousarray(x3, F32).reshape(-1)
    if out is None:
        out = _empty(x3.shape, dtype)
    if x.size:
        _launch("quantize", x3.shape, code, x, out.reshape(-1), a, b, c, post, slices, half_range, lower, upper,
                nan_value)
    # copies: the caller hands them to the user, and the cached ones must not change
    return out, out_min.copy(), out_max.copy()


def _dequantize_constants(min_range, max_range, qtype, mode, narrow_range, slices):
    """(a, b, code, half) for `_tf_quantize_numba.dequantize`, computed as the reference computes them; None
    for a mode without a kernel."""
    nb = _numba()
    lo, hi = _limits(qtype)
    with np.errstate(all="ignore"):
        mn = np.broadcast_to(ref._ftz(min_range), (slices,)).astype(F32)
        mx = np.broadcast_to(ref._ftz(max_range), (slices,)).astype(F32)
        half = F32(0)
        if mode == ref.MIN_COMBINED:
            denom = F32(F32(hi) - F32(lo))
            a, b = ref._ftz(ref._ftz(mx - mn) / denom), mn
            if lo < 0:
                half = F32(F32(denom + F32(1)) / F32(2))
            code = nb.DQ_COMBINED
        elif mode == ref.MIN_FIRST:
            bits = qtype.itemsize * 8
            width = ref._ftz(mx - mn)
            rs = ref._ftz(width.astype(F64) / (2.0**bits - 1.0))
            rounded_min = np.where(mx == mn, mn, ref._ftz(ref._round_half_away(ref._ftz(mn / rs)) * rs)).astype(F32)
            a, b = rs, ref._ftz(rounded_min - ref._ftz(F32(lo) * rs))
            code = nb.DQ_FIRST
        elif mode == ref.SCALED:
            scale = ref._ftz(mx / F32(hi))
            if lo < 0:
                scale = ref._cpp_max(ref._ftz(mn / F32(lo + (1 if narrow_range else 0))), scale).astype(F32)
            a, b = scale, np.zeros(slices, F32)
            code = nb.DQ_SCALED_WRAP if (qtype == np.int32 and slices == 1) else nb.DQ_SCALED
        else:
            return None
    a, b = (np.ascontiguousarray(v, F32).reshape(-1) for v in (a, b))
    return a, b, np.int64(code), F32(half)


def _dequantize_constants_one_slice(min_range, max_range, qtype, mode, narrow_range):
    """`_dequantize_constants` for one slice in MIN_COMBINED or SCALED mode, on float32 scalars (see
    `_quantize_constants_one_slice`); None for other modes."""
    if mode != ref.MIN_COMBINED and mode != ref.SCALED:
        return None
    nb = _numba()
    lo, hi = _limits(qtype)
    with np.errstate(all="ignore"):
        mn, mx = _ftz1(min_range[0]), _ftz1(max_range[0])
        half = F32(0)
        if mode == ref.MIN_COMBINED:
            denom = F32(F32(hi) - F32(lo))
            a, b = _ftz1(_ftz1(mx - mn) / denom), mn
            if lo < 0:
                half = F32(F32(denom + F32(1)) / F32(2))
            code = nb.DQ_COMBINED
        else:
            scale = _ftz1(mx / F32(hi))
            if lo < 0:
                scale = _max1(_ftz1(mn / F32(lo + (1 if narrow_range else 0))), scale)
            a, b = scale, F32(0)
            code = nb.DQ_SCALED_WRAP if qtype == np.int32 else nb.DQ_SCALED
    return np.array([a], F32), np.array([b], F32), np.int64(code), F32(half)


def dequantize(q3, min_range, max_range, mode, narrow_range, strict, out=None):
    if strict or not kernels_enabled():
        return None
    pre, slices, post = q3.shape

    def compute():
        if slices == 1:
            mins, maxs = np.asarray(min_range, F32).reshape(-1), np.asarray(max_range, F32).reshape(-1)
            if mins.size == 1 and maxs.size == 1:
                one = _dequantize_constants_one_slice(mins, maxs, q3.dtype, mode, narrow_range)
                if one is not None:
                    return one
        return _dequantize_constants(min_range, max_range, q3.dtype, mode, narrow_range, slices)

    key = _range_key(q3.dtype, mode, bool(narrow_range), min_range=min_range, max_range=max_range, slices=slices)
    constants = _cached(_dequantize_constants_cache, key, compute)
    if constants is None:
        return None
    a, b, code, half = constants
    q = np.ascontiguousarray(q3).reshape(-1)
    if out is None:
        out = _empty(q3.shape, np.dtype(F32))
    if q.size:
        _launch("dequantize", q3.shape, code, q, out.reshape(-1), a, b, post, slices, half)
    return out
