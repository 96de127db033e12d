"""TensorFlow QuantizeV2 and Dequantize: a NumPy transcription of the CPU kernel.

The target is ``tensorflow/core/kernels/quantize_op.cc`` and ``dequantize_op.cc`` of TensorFlow 2.21
(x86 CPU, eager), with the helpers they call in ``quantization_utils.h`` (MIN_FIRST) and Eigen's
fixed-point types. Every step below names the kernel expression it reproduces. The kernel works in
float32 and sometimes in double; each NumPy operation is written with the same operand types, so its
rounding is the kernel's rounding (IEEE-754 float32 and float64 ops are correctly rounded in both).

``strict=True`` evaluates the *documented* formulas instead (docs of tf.raw_ops.QuantizeV2 and
Dequantize), in float64, rounds once and saturates; see docs/semantics.md for the list of differences.

Callers (``qlinear.tf``) validate and normalise the arguments; these functions assume:
  * ``x`` is float32 (quantize) or the integer storage dtype (dequantize), viewed as
    ``[pre, slices, post]`` with ``slices`` the length of the quantization axis (1 per-tensor);
  * ``min_range``/``max_range`` are float32 arrays of shape ``(slices,)``;
  * ``max_range >= min_range`` per slice for quantize, ranges finite.
No Python loop runs over elements; the per-slice ranges broadcast as ``[1, slices, 1]``.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
F64 = np.float64
FLT_MAX = F32(np.finfo(np.float32).max)
FLT_MIN = F32(np.finfo(np.float32).tiny)  # smallest normal float32

# Modes and round modes, by the attribute strings TensorFlow uses.
MIN_COMBINED, MIN_FIRST, SCALED = "MIN_COMBINED", "MIN_FIRST", "SCALED"
HALF_AWAY_FROM_ZERO, HALF_TO_EVEN = "HALF_AWAY_FROM_ZERO", "HALF_TO_EVEN"


# ---------------------------------------------------------------------------------------------
# Float32 arithmetic as TensorFlow's threads run it, and scalar C++ helpers, vectorised
# ---------------------------------------------------------------------------------------------
def _ftz(a) -> np.ndarray:
    """float32 with subnormals flushed to (signed) zero.

    TensorFlow runs kernels with the x86 FTZ and DAZ flags set (denormals are zero on input and
    flushed on output, port::ScopedFlushDenormal), so every float32 value the kernel computes or
    reads is normal or zero. Applying this to the inputs (DAZ) and to the result of every float32
    operation (FTZ) reproduces that; a double result is flushed when it is converted to float.
    """
    a = np.asarray(a, dtype=F32)
    return np.where(np.abs(a) < FLT_MIN, np.copysign(F32(0), a), a).astype(F32)


def _cpp_min(a, b):
    """std::min(a, b) = (b < a) ? b : a, NaN handling included."""
    return np.where(b < a, b, a)


def _cpp_max(a, b):
    """std::max(a, b) = (a < b) ? b : a, NaN handling included."""
    return np.where(a < b, b, a)


def _round_half_away(v: np.ndarray) -> np.ndarray:
    """std::round / Eigen's round(): nearest integer, ties away from zero, same dtype.

    Written as trunc plus an exact fraction test: v - trunc(v) is exact in binary floating point,
    so there is no double rounding (``trunc(v + 0.5)`` would send 0.49999997f to 1).
    """
    whole = np.trunc(v)
    frac = v - whole
    step = np.where(frac >= 0.5, 1, np.where(frac <= -0.5, -1, 0)).astype(v.dtype)
    return whole + step


def _as_slices(a: np.ndarray) -> np.ndarray:
    """Per-slice ranges of shape (slices,) -> broadcastable [1, slices, 1]."""
    return a.reshape(1, -1, 1)


def _float_to_int_bits(r: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Store already-rounded float values into T the way x86 does.

    For 8/16-bit T the kernel converts float -> int8_t/uint8_t (truncation of an integral value;
    Eigen's AVX path converts with cvtps and packs, identical for in-range integers). For qint32 it
    is ``static_cast<int32_t>(lrint(v))`` (or _mm256_cvtps_epi32); the only out-of-range value the
    kernel can produce is exactly 2**31 (float(INT32_MAX) rounds up to it), which both give as
    INT32_MIN -- the wrap-around quirk. int64 then a modular narrowing reproduces that.

    NaN and +-inf (a NaN input, or MIN_COMBINED's scale overflowing to inf for a range narrower
    than (max T - min T) / FLT_MAX, which gives 0 * inf and inf) depend on the code path in
    TensorFlow: qint8/qint16 elements converted by Eigen's vector loop (cvtps2dq gives 0x80000000,
    then a saturating pack) become min T, the scalar tail (the last n % 16 elements) becomes 0;
    unsigned types (cvttss2si, low bits of 0x80000000) and qint32 (lrint -> LONG_MIN, low 32 bits)
    are 0 on every path. qlinear gives min T for qint8/qint16 (the vector body) and 0 otherwise.
    """
    nan_value = np.iinfo(dtype).min if dtype in (np.dtype(np.int8), np.dtype(np.int16)) else 0
    r = np.where(np.isfinite(r), r, nan_value)
    return r.astype(np.int64).astype(dtype)


# ---------------------------------------------------------------------------------------------
# QuantizeV2
# ---------------------------------------------------------------------------------------------
def adjust_range(input_min, input_max, ensure_minimum_range):
    """The range nudging that QuantizeV2 applies to every slice, in float32 (quantize_op.cc).

    min_range = std::min(0.0f, input_min_range);
    epsilon   = std::max(1.0f, std::max(fabsf(input_min_range), fabsf(input_max_range)))
                * ensure_minimum_range;
    max_range = std::max(0.0f, std::max(input_max_range, min_range + epsilon));
    """
    zero, one = F32(0), F32(1)
    input_min, input_max = _ftz(input_min), _ftz(input_max)
    min_range = _cpp_min(zero, input_min)
    epsilon = _ftz(_cpp_max(one, _cpp_max(np.abs(input_min), np.abs(input_max))) * _ftz(ensure_minimum_range))
    max_range = _cpp_max(zero, _cpp_max(input_max, _ftz(min_range + epsilon)))
    return min_range.astype(F32), max_range.astype(F32)


def quantize_v2(
    x: np.ndarray,
    min_range: np.ndarray,
    max_range: np.ndarray,
    dtype: np.dtype,
    mode: str,
    round_mode: str,
    narrow_range: bool,
    ensure_minimum_range: np.float32,
    strict: bool = False,
):
    """QuantizeV2 on ``x`` of shape [pre, slices, post]; returns (q, out_min, out_max).

    ``out_min``/``out_max`` have shape (slices,); the caller gives them TensorFlow's shape.
    """
    dtype = np.dtype(dtype)
    info = np.iinfo(dtype)
    lo, hi = int(info.min), int(info.max)
    with np.errstate(all="ignore"):
        min_r, max_r = adjust_range(min_range, max_range, F32(ensure_minimum_range))
        if not strict:
            x = _ftz(x)  # DAZ: the kernel never sees a subnormal input
        if mode == MIN_COMBINED:
            q = (_min_combined_strict if strict else _min_combined)(x, min_r, max_r, dtype, lo, hi)
            out_min, out_max = min_r, max_r
        elif mode == MIN_FIRST:
            q = (_min_first_strict if strict else _min_first)(x, min_r, max_r, dtype, lo, hi)
            out_min, out_max = min_r, max_r
        elif mode == SCALED:
            q, out_min, out_max = _scaled(x, min_r, max_r, dtype, lo, hi, narrow_range, round_mode, strict)
        else:  # validated by the caller
            raise AssertionError(mode)
    return q, out_min, out_max


def _min_combined(x, min_r, max_r, dtype, lo, hi):
    """MIN_COMBINED, quantize_op.cc QuantizeSlice.

    scale_factor = (double(max T) - double(min T)) / (max_range - min_range)   -> stored as float
    signed:   ((clamp(x) - min_range) * scale_factor - half_range_).round().cast<T>()
    unsigned: ((clamp(x) - min_range) * scale_factor + 0.5f).cast<T>()         (truncation)
    clamp(x) = x.cwiseMin(max_range).cwiseMax(min_range).
    """
    scale = _ftz(F64(hi - lo) / _ftz(_as_slices(max_r - min_r)).astype(F64))
    lo_s, hi_s = _as_slices(min_r), _as_slices(max_r)
    clamped = np.maximum(np.minimum(x, hi_s), lo_s)  # NaN propagates, as in Eigen
    scaled = _ftz(_ftz(clamped - lo_s) * scale)
    if lo < 0:
        # half_range_ = (double(max T) - double(min T) + 1) / 2.0f, stored as float.
        half_range = F32((F64(hi) - F64(lo) + 1) / 2.0)
        rounded = _round_half_away(_ftz(scaled - half_range))
    else:
        # No round(): +0.5f in float32, then the float -> unsigned conversion truncates.
        rounded = np.trunc(_ftz(scaled + F32(0.5)))
    return _float_to_int_bits(rounded, dtype)


def _min_combined_strict(x, min_r, max_r, dtype, lo, hi):
    """Documented MIN_COMBINED, exactly rounded: one grid for signed and unsigned T.

    out = (in - min_range) * range(T) / (max_range - min_range), shifted by min T for signed T,
    rounded half away from zero in the unsigned domain (so qint8 == quint8 - 128), saturated.
    A zero-width range (only min = max = 0 with ensure_minimum_range <= 0) maps to min T.
    """
    lo_s, hi_s = _as_slices(min_r).astype(F64), _as_slices(max_r).astype(F64)
    width = hi_s - lo_s
    clamped = np.clip(x.astype(F64), lo_s, hi_s)
    v = np.where(width > 0, (clamped - lo_s) * F64(hi - lo) / np.where(width > 0, width, 1), 0)
    q = np.floor(v + 0.5) + lo  # v >= 0: half up == half away from zero
    return np.clip(q, lo, hi).astype(dtype)


def _min_first(x, min_r, max_r, dtype, lo, hi):
    """MIN_FIRST on x86: FloatTensorToQuantizedInPlaceUsingEigen (quantization_utils.h).

    (The meta::Quantize path exists only in TENSORFLOW_USE_META builds, not in x86 wheels.)
    range_scale      = max == min ? 0 : (2^bits - 1.0) / (max - min)            -> float
    range_min_scaled = round(min * range_scale)                                 (float)
    q = ((x * range_scale).round() - (range_min_scaled - lowest))
          .cwiseMax(lower_bound_float).cwiseMin(upper_bound_float).cast<int32>().cast<T>()
    lower/upper_bound_float clamp qint32 to [-2147483648, 2147483520] (largest float < 2^31).
    """
    bits = np.dtype(dtype).itemsize * 8
    width = _ftz(max_r - min_r)
    range_scale = np.where(max_r == min_r, F32(0), _ftz(F64(2.0**bits - 1.0) / width.astype(F64))).astype(F32)
    range_min_scaled = _round_half_away(_ftz(min_r * range_scale))
    lowest = F32(lo)
    offset = _as_slices(_ftz(range_min_scaled - lowest))
    rs = _as_slices(range_scale)
    v = _ftz(_round_half_away(_ftz(x * rs)) - offset)
    lower_bound = max(F32(lo), F32(-2.147483648e09))
    upper_bound = min(F32(hi), F32(2.147483520e09))
    v = np.minimum(np.maximum(v, lower_bound), upper_bound)
    # cast<int32>: truncation; x86 gives INT32_MIN for NaN (cvttps2dq's "integer indefinite").
    as_int32 = np.where(np.isnan(v), F64(-(2**31)), v).astype(np.int64)
    # cast<T> from int32: a narrowing integer conversion (values are in range except NaN's).
    return as_int32.astype(np.int32).astype(dtype)


def _min_first_strict(x, min_r, max_r, dtype, lo, hi):
    """Documented MIN_FIRST (tf.raw_ops.QuantizeV2), float64, saturating to the full range of T.

    range_scale = 2^bits / ((max - min) * 2^bits / (2^bits - 1)) = (2^bits - 1) / (max - min)
    quantized   = round(in * range_scale) - round(min * range_scale) + min T, clamped to T.
    A zero-width range maps everything to min T (as FloatToQuantizedUnclamped does).
    """
    bits = np.dtype(dtype).itemsize * 8
    lo_s, hi_s = _as_slices(min_r).astype(F64), _as_slices(max_r).astype(F64)
    width = hi_s - lo_s
    rs = np.where(width > 0, (2.0**bits - 1.0) / np.where(width > 0, width, 1), 0)
    q = _round_half_away(np.where(rs > 0, x.astype(F64) * rs, 0)) - _round_half_away(lo_s * rs) + lo
    return np.clip(q, lo, hi).astype(dtype)


def _scaled(x, min_r, max_r, dtype, lo, hi, narrow_range, round_mode, strict):
    """SCALED, quantize_op.cc QuantizeSlice.

    min_output_value = min T + (narrow_range ? 1 : 0);  max_output_value = max T   (ints)
    from_min = (min_output_value * min_range > 0) ? min_output_value / min_range : FLT_MAX
    from_max = (max_output_value * max_range > 0) ? max_output_value / max_range : FLT_MAX
    scale_factor = std::min(from_min, from_max)
    min_range = min_output_value / scale_factor;  max_range = max_output_value / scale_factor
    q = round_mode(clamp(x, min_range, max_range) * scale_factor).cast<T>()
    Every int operand is converted to float first (so qint32's 2147483647 becomes 2^31).
    """
    min_out = lo + (1 if narrow_range else 0)
    min_out_f, max_out_f = F32(min_out), F32(hi)
    from_min = np.where(_ftz(min_out_f * min_r) > 0, _ftz(min_out_f / min_r), FLT_MAX)
    from_max = np.where(_ftz(max_out_f * max_r) > 0, _ftz(max_out_f / max_r), FLT_MAX)
    scale = _cpp_min(from_min, from_max).astype(F32)
    out_min = _ftz(min_out_f / scale)
    out_max = _ftz(max_out_f / scale)
    if strict:
        # Clamping x to [out_min, out_max] and then scaling is, in exact arithmetic, clipping
        # the scaled value to [min_output_value, max T]; do that in float64 and round once.
        v = x.astype(F64) * _as_slices(scale).astype(F64)
        r = np.rint(v) if round_mode == HALF_TO_EVEN else _round_half_away(v)
        q = np.clip(r, min_out, hi).astype(dtype)
        return q, out_min, out_max
    clamped = np.maximum(np.minimum(x, _as_slices(out_max)), _as_slices(out_min))
    v = _ftz(clamped * _as_slices(scale))
    # HALF_TO_EVEN: Eigen scalar_round_half_to_even_op = rint (exact banker's rounding).
    r = np.rint(v) if round_mode == HALF_TO_EVEN else _round_half_away(v)
    return _float_to_int_bits(r, dtype), out_min, out_max


# ---------------------------------------------------------------------------------------------
# Dequantize
# ---------------------------------------------------------------------------------------------
def dequantize(
    q: np.ndarray,
    min_range: np.ndarray,
    max_range: np.ndarray,
    mode: str,
    narrow_range: bool,
    strict: bool = False,
) -> np.ndarray:
    """Dequantize ``q`` of shape [pre, slices, post] to float32 (dequantize_op.cc).

    The bfloat16 output of the kernel is this float32 result rounded to nearest even, which the
    caller applies.
    """
    info = np.iinfo(q.dtype)
    lo, hi = int(info.min), int(info.max)
    with np.errstate(all="ignore"):
        if strict:
            return _dequantize_strict(q, min_range, max_range, mode, narrow_range, lo, hi)
        qf = q.astype(F32)  # cast<float>: int -> float rounds to nearest (qint32 loses bits)
        # DAZ on the ranges (see _ftz).
        mn, mx = _as_slices(_ftz(min_range)), _as_slices(_ftz(max_range))
        if mode == MIN_COMBINED:
            # scale_factor = (max - min) / (float(max T) - min T); for qint32 that is 2^32.
            denom = F32(F32(hi) - F32(lo))
            scale = _ftz(_ftz(mx - mn) / denom)
            # half_range = (float(max T) - min T + 1) / 2.0f for signed T, else 0.
            half = F32(F32(denom + F32(1)) / F32(2)) if lo < 0 else F32(0)
            return _ftz(_ftz(_ftz(qf + half) * scale) + mn)
        if mode == MIN_FIRST:
            # QuantizedTensorToFloatInPlaceUsingEigen + QuantizedToFloatStruct:
            # range_scale       = (max - min) / (2^bits - 1.0)              -> float
            # range_min_rounded = max == min ? min : round(min / range_scale) * range_scale
            # out = (range_min_rounded - lowest * range_scale) + float(q) * range_scale
            bits = q.dtype.itemsize * 8
            width = _ftz(mx - mn)
            rs = _ftz(width.astype(F64) / (2.0**bits - 1.0))
            rounded_min = np.where(mx == mn, mn, _ftz(_round_half_away(_ftz(mn / rs)) * rs)).astype(F32)
            offset = _ftz(rounded_min - _ftz(F32(lo) * rs))
            return _ftz(offset + _ftz(qf * rs))
        if mode == SCALED:
            # min_output_value = min T + narrow; unsigned: scale = max / max T;
            # signed: scale = std::max(min / min_output_value, max / max T); out = q * scale.
            scale = _ftz(mx / F32(hi))
            if lo < 0:
                from_min = _ftz(mn / F32(lo + (1 if narrow_range else 0)))
                scale = _cpp_max(from_min, scale).astype(F32)
            if q.dtype == np.int32 and q.shape[1] == 1:
                # The per-tensor path (DequantizeTensor) converts with cast<int>().cast<float>().
                # QInt32 has no conversion to int, only operator float(), so the int is
                # (int)(float)q: every q that rounds to 2^31 in float (q >= 2147483584) becomes
                # INT32_MIN, i.e. dequantizes to the most negative value. (DequantizeSlice, the
                # per-axis path, uses cast<float>() and does not wrap.)
                qf = np.where(qf >= F32(2.0**31), F32(-(2.0**31)), qf)
            return _ftz(qf * scale)
    raise AssertionError(mode)


def _dequantize_strict(q, min_range, max_range, mode, narrow_range, lo, hi):
    """The documented Dequantize formulas in float64, rounded once to float32.

    MIN_COMBINED and MIN_FIRST: out = min + (q - min T) * (max - min) / (2^bits - 1)
      (MIN_COMBINED's "+ (range(T) + 1) / 2" for signed T is the same shift; MIN_FIRST's
      range_adjust / number_of_steps reduce to the same step).
    SCALED: out = q * scale, scale = max / max T for unsigned T, else
      max(min / (min T + narrow_range), max / max T).
    """
    qd = q.astype(F64)
    mn, mx = _as_slices(min_range).astype(F64), _as_slices(max_range).astype(F64)
    if mode in (MIN_COMBINED, MIN_FIRST):
        out = mn + (qd - lo) * ((mx - mn) / F64(hi - lo))
    else:
        scale = mx / hi
        if lo < 0:
            scale = np.maximum(mn / (lo + (1 if narrow_range else 0)), scale)
        out = qd * scale
    return out.astype(F32)
