"""TensorFlow Lite's integer requantization, transcribed from the sources: QuantizeMultiplier, the fixed-point
multiplies, and the requantization of each CPU kernel family (reference, optimized x86, XNNPACK).

Everything here works on NumPy int64 arrays that hold the values C++ holds in int32 (or int64), so that each
C++ expression is transcribed exactly, its int32 wrap-around included (:func:`wrap_int32`). Sources, read at:

- LiteRT ``google-ai-edge/LiteRT`` @ f6745779 (2026-08-21), ``tflite/kernels/...`` (the TFLite runtime once at
  ``tensorflow/lite/kernels``); the wheels measured are ai-edge-litert 2.3.0 and tensorflow-cpu 2.21.0.
- gemmlowp ``fixedpoint/fixedpoint.h`` (SaturatingRoundingDoublingHighMul, RoundingDivideByPOT).
- ruy ``google/ruy`` @ 2af8886: ``ruy/kernel_avx512.cc`` / ``kernel_avx2_fma.cc`` (the x86 kernels' output
  stage), ``ruy/apply_multiplier.cc``.
- NEON_2_SSE ``intel/ARM_NEON_2_x86_SSE`` @ 662a859 (how TFLite's NEON code runs on x86: ``USE_NEON`` is
  defined there when SSE4.1 is, ``tflite/kernels/internal/optimized/neon_check.h``).
- XNNPACK ``google/XNNPACK`` @ 75db3c09 (``src/xnnpack/requantization.h``, ``src/operators/convolution-nhwc.c``).

Functions (x, M, shift broadcast against each other; M and shift come from :func:`quantize_multiplier`):

``quantize_multiplier(real, single_rounding=False) -> (M, shift)``
    QuantizeMultiplier: ``real ~= M * 2**(shift - 31)`` with M in [2**30, 2**31).
``multiply_by_quantized_multiplier(x, M, shift, single_rounding=False)``
    MultiplyByQuantizedMultiplier(int32 x): SRDHM then RoundingDivideByPOT (double rounding, the default
    build), or one rounding half up (``TFLITE_SINGLE_ROUNDING``).
``multiply_by_quantized_multiplier_int64(x, M, shift)``
    The int64 overload (16x8 kernels with an int64 bias): a 16-bit multiplier, one rounding half up.
``multiply_by_quantized_multiplier_upward(x, M, shift)``
    SRDHM then a rounding shift with halves toward +infinity: ruy's x86 kernels, the NEON blocks of the
    optimized depthwise kernel, the custom GEMV, ``DepthwiseConvRound<kUpward>``.
``requantize_double(acc, real)``
    The reference FULLY_CONNECTED since 2025: ``(int32) round(double(acc) * real)``, halves away from zero.
``requantize_xnnpack(acc, scale, zero_point, qmin, qmax)``
    XNNPACK's "fp32" requantization: float32 product, clamp, round half to even, add the zero point.
``activation_range(activation, y_scale, y_zero_point, dtype)`` / ``activation_range_xnnpack(...)``
    The fused ReLU/ReLU6/ReLU_N1_TO_1 clamp as TFLite's Prepare computes it, and as XNNPACK does.
"""

from __future__ import annotations

import math

import numpy as np

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
ACTIVATIONS = (None, "relu", "relu6", "relu_n1_to_1")
_ACTIVATION_BOUNDS = {None: (None, None), "relu": (0.0, None), "relu6": (0.0, 6.0), "relu_n1_to_1": (-1.0, 1.0)}


def wrap_int32(v):
    """``static_cast<int32_t>`` of an int64 value (two's complement wrap-around), as int64."""
    v = np.asarray(v, dtype=np.int64)
    return ((v + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)


# --- QuantizeMultiplier (tflite/kernels/internal/quantization_util.cc:53-107) ----------------------------

def quantize_multiplier(real: float, single_rounding: bool = False) -> tuple[int, int]:
    """TFLite's ``QuantizeMultiplier(double m, int32_t* M, int* shift)``.

    ``q, shift = frexp(m)`` (q in [0.5, 1)); ``M = round_half_away(q * 2**31)``; a q that rounds up to 2**31
    becomes 2**30 with ``shift + 1``; ``shift < -31`` flushes to (0, 0); m == 0 gives (0, 0). With
    ``single_rounding`` (``TFLITE_SINGLE_ROUNDING``) a shift above 30 saturates to (2**31 - 1, 30).
    """
    real = float(real)
    if not math.isfinite(real):
        raise ValueError(f"quantize_multiplier: real must be finite, got {real!r}")
    if real == 0.0:
        return 0, 0
    q, shift = math.frexp(real)
    scaled = abs(q) * 2.0**31  # exact: a power-of-two scaling
    fixed = math.floor(scaled + 0.5)  # exact: scaled < 2**31 keeps a 2**-22 ulp; TfLiteRound is half away
    fixed = fixed if q > 0 else -fixed
    if fixed == 1 << 31:
        fixed //= 2
        shift += 1
    if shift < -31:
        shift, fixed = 0, 0
    if single_rounding and shift > 30:
        shift, fixed = 30, (1 << 31) - 1
    return int(fixed), int(shift)


def quantize_multipliers(reals, single_rounding: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """:func:`quantize_multiplier` of each element of ``reals`` (per-channel multipliers), as int64 arrays."""
    pairs = [quantize_multiplier(r, single_rounding) for r in np.asarray(reals, np.float64).reshape(-1)]
    shape = np.shape(reals)
    return (np.array([p[0] for p in pairs], np.int64).reshape(shape),
            np.array([p[1] for p in pairs], np.int64).reshape(shape))


# --- gemmlowp fixedpoint.h:340-377 and tflite/kernels/internal/common.cc:32-114 --------------------------

def saturating_rounding_doubling_high_mul(a, b):
    """gemmlowp's SaturatingRoundingDoublingHighMul (ARM's VQRDMULH): ``floor((a*b + 2**30) / 2**31)``,
    i.e. a*b/2**31 rounded half toward +infinity; INT32_MIN * INT32_MIN saturates to INT32_MAX.

    The source adds a nudge of 2**30 (or 1 - 2**30 for a negative product) and divides truncating toward
    zero; both equal the floor above."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    result = (a * b + (1 << 30)) >> 31
    return np.where((a == INT32_MIN) & (b == INT32_MIN), INT32_MAX, result)


def rounding_divide_by_pot(x, exponent):
    """gemmlowp's RoundingDivideByPOT: x / 2**exponent rounded half away from zero (exponent in [0, 31])."""
    x, exponent = np.asarray(x, np.int64), np.asarray(exponent, np.int64)
    mask = (np.int64(1) << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0)
    return (x >> exponent) + (remainder > threshold)


def _left_right(shift):
    shift = np.asarray(shift, np.int64)
    return np.maximum(shift, 0), np.maximum(-shift, 0)


def multiply_by_quantized_multiplier(x, multiplier, shift, single_rounding: bool = False):
    """MultiplyByQuantizedMultiplier(int32 x, int32 M, int shift) of common.cc.

    Double rounding (the default build): ``RoundingDivideByPOT(SRDHM(x * 2**left, M), right)``, where the
    left shift wraps in int32 as the C++ does (``TFLITE_NO_SANITIZE_INTEGER_OVERFLOW``).
    ``single_rounding``: ``(x * M + 2**(30 - shift)) >> (31 - shift)``, one rounding half toward +infinity.
    """
    x, multiplier = np.asarray(x, np.int64), np.asarray(multiplier, np.int64)
    if single_rounding:
        total = 31 - np.asarray(shift, np.int64)
        return wrap_int32((x * multiplier + (np.int64(1) << (total - 1))) >> total)
    left, right = _left_right(shift)
    return rounding_divide_by_pot(saturating_rounding_doubling_high_mul(wrap_int32(x << left), multiplier), right)


def multiply_by_quantized_multiplier_int64(x, multiplier, shift):
    """MultiplyByQuantizedMultiplier(int64 x, int32 M, int shift) of common.cc (the same in both builds).

    ``reduced = M < 0x7FFF0000 ? (M + 2**15) >> 16 : 0x7FFF``; ``(x * reduced + 2**(14 - shift)) >>
    (15 - shift)``, truncated to int32. The source assumes |x| < 2**47 and shift < 8; a shift above 14 would
    shift by a negative amount (undefined), and is refused.
    """
    x, multiplier, shift = (np.asarray(v, np.int64) for v in (x, multiplier, shift))
    if np.any(shift > 14):
        raise ValueError("the int64 MultiplyByQuantizedMultiplier of TFLite's 16x8 kernels supports a real "
                         "multiplier below 2**14 (shift <= 14); this one is larger")
    reduced = np.where(multiplier < 0x7FFF0000, (multiplier + (1 << 15)) >> 16, 0x7FFF)
    total = 15 - shift
    return wrap_int32((x * reduced + (np.int64(1) << (total - 1))) >> total)


def multiply_by_quantized_multiplier_upward(x, multiplier, shift):
    """SRDHM(x * 2**left, M), then a right shift rounding halves toward +infinity.

    This is ``DepthwiseConvRound<kUpward>`` of reference/depthwiseconv_uint8.h:98-110, and the arithmetic of
    the x86 optimized kernels: ruy's AVX2/AVX-512 output stage (``((acc << left) * M + 2**30) >> 31``, then
    ``(v + 2**(right-1)) >> right``, kernel_avx512.cc:354-419), and TFLite's NEON ``vqrdmulhq_s32`` +
    ``vrshlq_s32`` sequences run through NEON_2_SSE (NEON_2_SSE.h:4340, 7529: the serial rounding shift adds
    bit ``right-1``). ruy skips SRDHM's INT32_MIN saturation, which a positive M never reaches.
    """
    left, right = _left_right(shift)
    high = saturating_rounding_doubling_high_mul(wrap_int32(np.asarray(x, np.int64) << left), multiplier)
    nudge = np.where(right > 0, np.int64(1) << np.maximum(right - 1, 0), 0)
    return (high + nudge) >> right


def multiply_by_quantized_multiplier_neon_single(x, multiplier, shift):
    """The ``TFLITE_SINGLE_ROUNDING`` NEON blocks of ``optimized_ops::Quantize`` (optimized_ops.h:5168-5250):
    ``right = min(shift, -1)``, ``left = shift - right``; ``vqdmulhq(x << left, M)`` (floor of x*M/2**31)
    then ``vrshlq`` by ``right``. Equal to the single-rounding MultiplyByQuantizedMultiplier except where
    ``x << left`` (one more than the shift when shift >= 0) wraps in int32."""
    shift = np.asarray(shift, np.int64)
    right = -np.minimum(shift, -1)
    left = shift + right
    high = (wrap_int32(np.asarray(x, np.int64) << left) * np.asarray(multiplier, np.int64)) >> 31
    return (high + (np.int64(1) << (right - 1))) >> right


# --- The reference FULLY_CONNECTED since LiteRT 9213607 (2025-04-14) ---------------------------------------

def round_half_away(v):
    """``std::round`` of float64 values (halves away from zero), exactly."""
    v = np.asarray(v, np.float64)
    whole = np.trunc(v)
    frac = v - whole  # exact
    return whole + np.where(np.abs(frac) >= 0.5, np.sign(v), 0.0)


def double_to_int32(v):
    """``static_cast<int32_t>`` of an integral double on x86 (cvttsd2si): out of range or NaN gives INT32_MIN."""
    v = np.asarray(v, np.float64)
    ok = np.isfinite(v) & (v >= INT32_MIN) & (v <= INT32_MAX)
    return np.where(ok, np.where(ok, v, 0).astype(np.int64), INT32_MIN)


def requantize_double(acc, real):
    """``static_cast<int32_t>(round(static_cast<double>(acc) * real))`` (reference/integer_ops/
    fully_connected.h:119-123, 221-225; reference/fully_connected.h:262-266): one rounding, half away from
    zero. ``real`` is the double ``double(in_s) * double(w_s) / double(out_s)``."""
    return double_to_int32(round_half_away(np.asarray(acc, np.float64) * np.asarray(real, np.float64)))


# --- XNNPACK (src/xnnpack/requantization.h, src/operators/convolution-nhwc.c) -----------------------------

def xnnpack_scale(x_scale, w_scale, y_scale):
    """XNNPACK's requantization scale ``input_scale * kernel_scale / output_scale``, in float32
    (convolution-nhwc.c:1013, 1098; fully-connected-nc.c likewise)."""
    with np.errstate(over="ignore", under="ignore"):
        return (np.float32(x_scale) * np.asarray(w_scale, np.float32)) / np.float32(y_scale)


def requantize_xnnpack(acc, scale, zero_point, qmin, qmax):
    """``lrintf(clamp((float)acc * scale, qmin - zp, qmax - zp)) + zp`` (xnn_qs8_requantize_fp32; the x86
    GEMM/DWCONV kernels compute the same with cvtepi32_ps, mulps, minps/maxps and cvtps_epi32). The int32 ->
    float32 conversion rounds to nearest even, so an |acc| above 2**24 may be rounded first."""
    f = np.asarray(acc, np.int64).astype(np.float32) * np.asarray(scale, np.float32)
    f = np.clip(f, np.float32(qmin - zero_point), np.float32(qmax - zero_point))
    return np.rint(f).astype(np.int64) + zero_point


# --- Fused activations --------------------------------------------------------------------------------------

def activation_range(activation, y_scale, y_zero_point, dtype) -> tuple[int, int]:
    """CalculateActivationRangeQuantized (tflite/kernels/kernel_util.cc:343-395): each bound is
    ``zp + (int32) TfLiteRound(f / scale)`` (a float32 division, rounded half away from zero), intersected
    with the type's range. Raises ValueError where TFLite's Prepare fails (the bound leaves int32)."""
    info = np.iinfo(dtype)
    lo, hi = int(info.min), int(info.max)
    bound_min, bound_max = _ACTIVATION_BOUNDS[activation]
    for bound, is_min in ((bound_min, True), (bound_max, False)):
        if bound is None:
            continue
        with np.errstate(over="ignore"):
            t = float(np.float32(bound) / np.float32(y_scale))
        t = math.copysign(math.floor(abs(t) + 0.5), t)  # TfLiteRound(float); float32 t + 0.5 is exact here
        if not INT32_MIN <= t <= INT32_MAX:
            raise ValueError(f"activation={activation!r}: the bound {bound} / y_scale overflows int32 "
                             "(TFLite's Prepare fails)")
        q = int(y_zero_point) + int(t)
        lo, hi = (max(lo, q), hi) if is_min else (lo, min(hi, q))
    return lo, hi


def activation_range_xnnpack(activation, y_scale, y_zero_point, dtype) -> tuple[int, int]:
    """The XNNPACK delegate passes the float bounds (0, 6, ±1, ±inf) and XNNPACK quantizes them with
    ``xnn_qs8_quantize`` / ``xnn_qu8_quantize``: ``lrintf(clamp(fl32(fl32(f / scale) + zp), qmin, qmax))``,
    the zero point added in float32 before a round half to even (requantization.h:221-231)."""
    info = np.iinfo(dtype)
    lo, hi = float(info.min), float(info.max)
    bound_min, bound_max = _ACTIVATION_BOUNDS[activation]
    result = []
    for bound, default in ((bound_min, -np.inf), (bound_max, np.inf)):
        f = np.float32(default if bound is None else bound)
        with np.errstate(over="ignore", invalid="ignore"):
            v = f / np.float32(y_scale) + np.float32(y_zero_point)
        result.append(int(np.rint(np.clip(v, np.float32(lo), np.float32(hi)))))
    return result[0], result[1]
