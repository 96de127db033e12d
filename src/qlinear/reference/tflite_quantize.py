"""TFLite QUANTIZE (float32 -> int8/uint8/int16) and DEQUANTIZE: a NumPy transcription of LiteRT's kernels.

Three kernel families, as the LiteRT interpreter (ai-edge-litert 2.3.0, x86-64 wheel; TensorFlow 2.21's
``tf.lite`` gives the same numbers) runs them:

* reference -- ``reference_ops::AffineQuantize`` / ``PerChannelQuantize`` (``kernels/internal/reference/
  quantize.h``) and ``reference_ops::Dequantize`` / ``reference_integer_ops::Dequantize`` /
  ``PerChannelDequantize``: what ``OpResolverType.BUILTIN_REF`` runs.
* optimized -- ``optimized_ops::AffineQuantize`` and ``optimized_ops::Dequantize``
  (``kernels/internal/optimized/optimized_ops.h``), compiled with ``USE_NEON`` on x86 (NEON_2_SSE over
  SSE4.1): blocks of 8 elements in vector code, the last ``n % 8`` elements in scalar code. What
  ``BUILTIN_WITHOUT_DEFAULT_DELEGATES`` runs. Per-channel tensors always take the reference per-channel
  functions (``quantize.cc`` / ``dequantize.h`` call them from both kernels).
* xnnpack -- XNNPACK's ``f32-qs8-vcvt`` / ``f32-qu8-vcvt`` and ``qs8-f32-vcvt`` / ``qu8-f32-vcvt``
  micro-kernels (the delegate's ``xnn_unary_convert``), what the default ``AUTO`` resolver runs for the
  nodes the delegate takes; the caller (``qlinear.tflite.quantize``) decides which nodes those are.

Every step names the C++ expression it reproduces, with the operand types of the kernel, so NumPy's
IEEE-754 float32/float64 operations round exactly as the kernel does. The x86 behaviour of the C++
conversions that the standard leaves undefined is reproduced too: ``static_cast<int32_t>`` of a float
that is NaN or outside int32 (cvttss2si / cvttsd2si) and ``_mm_cvtps_epi32`` of one (cvtps2dq) both give
INT32_MIN, and the int32 ``+ zero_point`` after it wraps modulo 2^32 (``_add_int32``).

``strict=True`` (quantize only) keeps each kernel's arithmetic for every finite value whose rounded
quotient fits in int32, and replaces the undefined parts by the documented formula
``clamp(round(x / scale) + zero_point, qmin, qmax)``: +-inf and out-of-range values saturate, NaN is
rejected by the caller.

Callers (``qlinear.tflite``) validate; these functions assume ``x`` float32 (quantize) or the integer
dtype (dequantize), ``scale`` float32 > 0 (an array broadcastable to ``x`` for per-channel),
``zero_point`` int64 in the type's range, ``dtype`` one of int8/uint8/int16. No Python loop runs over
elements.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
F64 = np.float64
INT32_MIN = -(2**31)
FLT_MIN = F32(np.finfo(np.float32).tiny)  # 2^-126, the smallest normal float32
_TWO_31 = 2.0**31

# The number of elements the vector loop of optimized_ops::AffineQuantize / Dequantize takes per
# iteration: ``for (; i <= flat_size - 8; i += 8)``. The rest (flat_size % 8) runs the scalar loop.
OPTIMIZED_BLOCK = 8


# ---------------------------------------------------------------------------------------------
# C++ scalar semantics, vectorised
# ---------------------------------------------------------------------------------------------
def round_half_away(v: np.ndarray) -> np.ndarray:
    """``std::round`` (``TfLiteRound``): nearest integer, ties away from zero, in v's own dtype.

    trunc plus an exact fraction test: ``v - trunc(v)`` is exact, so 0.49999997f does not round to 1 as
    ``trunc(v + 0.5f)`` would. NaN and infinities pass through.
    """
    whole = np.trunc(v)
    frac = v - whole
    step = np.where(frac >= 0.5, 1, np.where(frac <= -0.5, -1, 0)).astype(v.dtype)
    return whole + step


def _to_int32(r: np.ndarray) -> np.ndarray:
    """A float holding an integer (or NaN/inf) converted to int32 the x86 way, returned as int64.

    ``static_cast<int32_t>(float or double)`` (cvttss2si / cvttsd2si) and ``_mm_cvtps_epi32`` (cvtps2dq)
    return the "integer indefinite" INT32_MIN for NaN, infinities and values outside [-2^31, 2^31).
    """
    inside = (r >= -_TWO_31) & (r < _TWO_31)  # False for NaN
    return np.where(inside, np.where(inside, r, 0).astype(np.int64), INT32_MIN)


def _add_int32(a: np.ndarray, b) -> np.ndarray:
    """``int32_t + int32_t`` as x86 computes it (add / paddd): the exact sum wrapped modulo 2^32."""
    s = a + np.asarray(b, dtype=np.int64)
    return ((s + 2**31) & 0xFFFFFFFF) - 2**31


def _rounded_to_int(r: np.ndarray, strict: bool) -> np.ndarray:
    """The rounded quotient as an integer: the x86 conversion, or (strict) the exact value with +-inf and
    out-of-range values kept beyond int32 so that the clamp saturates them (NaN excluded by the caller)."""
    if not strict:
        return _to_int32(r)
    return np.where(np.isfinite(r), np.clip(r, -2.0**40, 2.0**40), np.copysign(2.0**40, r)).astype(np.int64)


def _add_zero_point(v: np.ndarray, zero_point, strict: bool) -> np.ndarray:
    return v + np.asarray(zero_point, dtype=np.int64) if strict else _add_int32(v, zero_point)


def _denormals_are_zero(a):
    """The x86 DAZ flag: a subnormal float32 operand reads as zero (of its sign)."""
    a = np.asarray(a, dtype=F32)
    return np.where(np.abs(a) < FLT_MIN, np.copysign(F32(0), a), a).astype(F32)


def _clamp_to(v: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``std::min(std::max(v, min_val), max_val)`` in int32, then the store into the output type."""
    info = np.iinfo(dtype)
    return np.clip(v, int(info.min), int(info.max)).astype(dtype)


# ---------------------------------------------------------------------------------------------
# QUANTIZE, reference kernel
# ---------------------------------------------------------------------------------------------
def affine_quantize(x: np.ndarray, scale, zero_point, dtype, strict: bool = False) -> np.ndarray:
    """``reference_ops::AffineQuantize`` (per-tensor), and with a broadcast ``scale``/``zero_point`` the
    arithmetic of ``reference_ops::PerChannelQuantize`` (which is the same per element)::

        const float val = input_data[i];
        int32_t unclamped = static_cast<int32_t>(TfLiteRound(val / static_cast<float>(scale))) + zero_point;
        int32_t clamped = std::min(std::max(unclamped, min_val), max_val);

    ``val / static_cast<float>(scale)`` is a float32 division; ``TfLiteRound`` is ``std::round`` on float
    (half away from zero); the cast and the ``+ zero_point`` are the x86 int32 ones. (Some TensorFlow trees
    add the zero point and clamp in double instead, which never wraps; the LiteRT 2.3.0 and TensorFlow 2.21
    wheels wrap, per-tensor and per-channel alike, as the tests measure.)
    """
    with np.errstate(all="ignore"):
        quotient = np.divide(x, np.asarray(scale, dtype=F32), dtype=F32)  # float32 / float32
        rounded = round_half_away(quotient)  # std::round(float) -> float
    unclamped = _add_zero_point(_rounded_to_int(rounded, strict), zero_point, strict)
    return _clamp_to(unclamped, dtype)


def per_channel_quantize(x: np.ndarray, scales: np.ndarray, zero_points: np.ndarray, axis: int, dtype,
                         strict: bool = False) -> np.ndarray:
    """``reference_ops::PerChannelQuantize``: each element with ``scale[c]``/``zero_point[c]`` of its index
    ``c`` along the quantized dimension, the arithmetic of `affine_quantize`. Both kernels (reference and
    optimized) and the AUTO resolver (XNNPACK does not take per-channel QUANTIZE) run it."""
    shape = [1] * x.ndim
    shape[axis] = -1
    return affine_quantize(x, scales.reshape(shape), zero_points.reshape(shape), dtype, strict)


# ---------------------------------------------------------------------------------------------
# QUANTIZE, optimized kernel (x86 wheels: USE_NEON through NEON_2_SSE)
# ---------------------------------------------------------------------------------------------
def optimized_affine_quantize(x: np.ndarray, scale, zero_point, dtype, strict: bool = False) -> np.ndarray:
    """``optimized_ops::AffineQuantize`` for int8, uint8 and int16 (per-tensor), over x in flat (C) order.

    ``const double scale = op_params.scale;`` (the tensor's float32 scale, widened). The first
    ``8 * (n // 8)`` elements run the NEON loop::

        reverse_scale_dup = vdupq_n_f32(1.0f / scale);      // 1/scale in double, stored as float
        v = vmulq_f32(x, reverse_scale_dup);                 // float32 product
        RoundToNearest(v)                                    // vcvtnq_s32_f32 = _mm_cvtps_epi32: ties to even
        vaddq_s32(.., zero_point_dup); vmaxq_s32; vminq_s32; narrow

    (``1.0f / scale`` divides in double and rounds to float once more; double rounding cannot change a
    quotient of two float32 values, so this is float32's own 1/s.) The remaining ``n % 8`` elements run
    the scalar loop, in double::

        static_cast<int32_t>(TfLiteRound(val / scale)) + zero_point     // val widened: double division
    """
    flat = x.reshape(-1)
    n = flat.size
    split = n - n % OPTIMIZED_BLOCK
    out = np.empty(n, dtype=dtype)
    scale64 = F64(F32(scale))
    with np.errstate(all="ignore"):
        # vector blocks
        inverse = F32(F64(1.0) / scale64)
        product = np.multiply(flat[:split], inverse, dtype=F32)
        rounded = np.rint(product)  # cvtps2dq under the default MXCSR: ties to even
        out[:split] = _clamp_to(_add_zero_point(_rounded_to_int(rounded, strict), zero_point, strict), dtype)
        # scalar tail
        quotient = flat[split:].astype(F64) / scale64
        tail = round_half_away(quotient)
        out[split:] = _clamp_to(_add_zero_point(_rounded_to_int(tail, strict), zero_point, strict), dtype)
    return out.reshape(x.shape)


# ---------------------------------------------------------------------------------------------
# QUANTIZE, XNNPACK (f32-qs8-vcvt / f32-qu8-vcvt)
# ---------------------------------------------------------------------------------------------
def xnnpack_quantize(x: np.ndarray, scale, zero_point, dtype, strict: bool = False) -> np.ndarray:
    """XNNPACK's float32 -> qs8/qu8 convert (``src/f32-qs8-vcvt/*.c.in``; the x86 variants agree)::

        params.scale = 1.0f / output_scale;                               // float32
        vx = _mm*_mul_ps(vx, vscale);                                     // float32 product
        vx = _mm*_min_ps(vx, (float) (output_max - output_zero_point));   // NaN -> the bound
        vacc = _mm*_cvtps_epi32(vx);                                      // ties to even; < -2^31 -> INT32_MIN
        _mm*_packs_epi32 (saturate to int16); _mm*_adds_epi16(zero_point) (saturating);
        _mm*_packs_epi16 / _packus_epi16 (saturate to int8 / uint8); _mm*_max_epi8/epu8(output_min)

    The saturating packs make it ``clamp(rint(fl32(x * fl32(1/s))) + zp)`` with NaN -> qmax and no wrap.
    XNNPACK runs its operators with denormals disabled (pthreadpool's ``PTHREADPOOL_FLAG_DISABLE_DENORMALS``:
    the x86 DAZ and FTZ flags), so a subnormal input counts as zero, and so does ``1.0f / output_scale``
    when it is subnormal (computed at setup, without the flags: scales above 2^126). A subnormal product
    would be flushed too, but it rounds to 0 either way. ``strict`` changes nothing here but NaN (rejected
    by the caller).
    """
    info = np.iinfo(dtype)
    qmin, qmax = int(info.min), int(info.max)
    zp = int(zero_point)
    with np.errstate(all="ignore"):
        inverse = _denormals_are_zero(F32(1.0) / F32(scale))
        product = np.multiply(_denormals_are_zero(x), inverse, dtype=F32)
        bound = F32(qmax - zp)
        limited = np.where(product < bound, product, bound)  # minps(a, b) = a < b ? a : b
        acc = _to_int32(np.rint(limited))
    acc = np.clip(acc, -32768, 32767)  # packs_epi32
    acc = np.clip(acc + zp, -32768, 32767)  # adds_epi16
    return np.clip(acc, qmin, qmax).astype(dtype)  # packs_epi16 / packus_epi16, then max(output_min)


# ---------------------------------------------------------------------------------------------
# DEQUANTIZE
# ---------------------------------------------------------------------------------------------
def dequantize(q: np.ndarray, scale, zero_point) -> np.ndarray:
    """``reference_ops::Dequantize`` (uint8) and ``reference_integer_ops::Dequantize`` (int8, int16)::

        const int32_t val = input_data[i];
        const float result = static_cast<float>(scale * (val - zero_point));    // scale: double

    The product of a float32 scale and an integer below 2^17 is exact in double, so this is the
    correctly rounded float32 of s * (q - zp).
    """
    diff = q.astype(np.int64) - np.asarray(zero_point, dtype=np.int64)
    with np.errstate(over="ignore"):  # a huge scale overflows to inf, as the C++ cast does
        return (F64(F32(scale)) * diff.astype(F64)).astype(F32)


def per_channel_dequantize(q: np.ndarray, scales: np.ndarray, zero_points: np.ndarray, axis: int) -> np.ndarray:
    """``reference_ops::PerChannelDequantize`` (uint8, int8; every kernel family runs it)::

        const float result = static_cast<float>(scale[channel] * (val - zero_point[channel]));

    ``scale[channel]`` is float: a float32 product of the scale and the (exactly converted) difference.
    """
    shape = [1] * q.ndim
    shape[axis] = -1
    diff = q.astype(np.int64) - zero_points.astype(np.int64).reshape(shape)
    with np.errstate(over="ignore"):
        return np.multiply(scales.astype(F32).reshape(shape), diff.astype(F32), dtype=F32)


def optimized_dequantize(q: np.ndarray, scale, zero_point) -> np.ndarray:
    """``optimized_ops::Dequantize`` (uint8, int8, int16; per-tensor), x86 (no ``__ARM_FEATURE_FMA``).

    The first ``8 * (n // 8)`` elements, in flat order, run the NEON loop::

        scale_dup            = vdupq_n_f32(static_cast<float>(scale));
        zero_times_scale_dup = vdupq_n_f32(static_cast<float>(-zero_point * scale));   // double, then float
        vaddq_f32(vmulq_f32(vcvtq_f32_s32(q), scale_dup), zero_times_scale_dup)        // two roundings

    the last ``n % 8`` the scalar reference formula (`dequantize`).
    """
    flat = q.reshape(-1)
    n = flat.size
    split = n - n % OPTIMIZED_BLOCK
    scale64 = F64(F32(scale))
    out = np.empty(n, dtype=F32)
    with np.errstate(over="ignore", invalid="ignore"):  # inf + -inf is NaN, as in the kernel
        zero_times_scale = F32(-F64(int(zero_point)) * scale64)
        out[:split] = np.multiply(flat[:split].astype(F32), F32(scale), dtype=F32) + zero_times_scale
    out[split:] = dequantize(flat[split:], scale, zero_point)
    return out.reshape(q.shape)


def xnnpack_dequantize(q: np.ndarray, scale, zero_point) -> np.ndarray:
    """XNNPACK's qs8/qu8 -> float32 convert (``src/qs8-f32-vcvt/*.c.in``)::

        vx = _mm*_add_epi32(cvtepi8_epi32(q), minus_zero_point);  vy = _mm*_mul_ps(_mm*_cvtepi32_ps(vx), vscale);

    A float32 product of the exact difference: equal to `dequantize` for every input.
    """
    diff = q.astype(np.int64) - int(zero_point)
    with np.errstate(over="ignore"):
        return np.multiply(diff.astype(F32), F32(scale), dtype=F32)
