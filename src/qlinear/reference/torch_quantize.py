"""PyTorch's quantize and fake-quantize arithmetic on an x86 CPU: a NumPy transcription.

What is transcribed (read in the sources, then measured against torch 2.12.1, 2.13.0, 2.14.0, 2.14.1 and
2.15.0 on x86_64 with AVX2 and FMA; tests/torch compares with the installed torch bit for bit):

* ``torch.quantize_per_tensor``: ``quantize_tensor_per_tensor_affine_cpu`` in pytorch
  ``aten/src/ATen/native/quantized/cpu/kernels/QuantizedOpKernels.cpp`` (the ``USE_FBGEMM`` branch, which
  every x86 wheel builds) hands the whole tensor to ``fbgemm::Quantize<T>`` with
  ``qparams.scale = float(scale)``. FBGEMM (``src/QuantUtils.cc``) runs ``QuantizeAvx2`` for 8-bit types on
  a CPU with AVX2 and FMA (``src/QuantUtilsAvx2.cc``), and the scalar ``Quantize`` of
  ``include/fbgemm/QuantUtils.h`` for qint32 (and for 8-bit types on a CPU without AVX2: not covered here).
* ``torch.quantize_per_channel``: ``quantize_tensor_per_channel_impl`` (same file) calls
  ``at::native::quantize_val`` (``aten/src/ATen/native/quantized/AffineQuantizerBase.cpp``) per element, which
  is FBGEMM's scalar ``Quantize`` with ``float(scales[c])`` and ``int32(zero_points[c])``.
* ``torch.fake_quantize_per_tensor_affine``: ``_fake_quantize_tensor_helper`` (QuantizedOpKernels.cpp), the
  float32 branch, reached through ``fake_quantize_per_tensor_affine_cachemask``
  (``aten/src/ATen/native/quantized/FakeQuantPerTensorAffine.cpp``) with ``float sc``.
* ``torch.fake_quantize_per_channel_affine``: ``_fake_quant_per_channel_cachemask_cpu_helper``
  (QuantizedOpKernels.cpp), its integer zero-point branch (``FakeQuantPerChannelAffine.cpp`` requires a
  float32 scale tensor and an int32 zero-point tensor).

No kernel divides: each computes ``inv_scale = 1.0f / float(scale)`` in float32 and multiplies
(FBGEMM's comment: "We want to multiply with src with inv_scale instead of dividing"); ``nearbyint`` and
``_mm256_cvtps_epi32`` round half to even. Each NumPy operation below is written with the kernel's operand
types (IEEE float32 and float64 operations are correctly rounded in both), so its rounding is the kernel's.

FBGEMM's ``LEGACY`` template flag (``Quantize<T, LEGACY>``, default ``true`` until FBGEMM #5624 removed it in
April 2026) adds the zero point *before* rounding. PyTorch passed ``false`` explicitly until pytorch #181067
dropped the argument; torch 2.13.0 was built with that change and an FBGEMM that still defaulted to
``LEGACY = true``, so 2.13.0 alone quantizes that way (``legacy=True`` here). 2.12 and older and 2.14 and newer
add the zero point after rounding. Fake quantization never took the flag: every version adds it after.

Callers (``qlinear.torch``) validate and normalise the arguments; these functions assume ``x`` is float32,
scales are positive finite float32 with a finite reciprocal, zero points and ranges are integers in range,
and per-channel data is viewed as ``[pre, channels, post]`` with the per-channel values as ``(channels,)``.
No Python loop runs over elements.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
F64 = np.float64
INT32_MIN = -(2**31)
# FBGEMM QuantizeAvx2's int32_float_max_val: INT32_MAX - 127 = 2147483520, the largest float32 below 2^31.
INT32_FLOAT_MAX = F32(2147483520.0)


# ---------------------------------------------------------------------------------------------
# x86 float and integer operations, vectorised
# ---------------------------------------------------------------------------------------------
def inverse_scale(scale) -> np.ndarray:
    """``float inv_scale = 1.0f / scale`` with ``scale`` already float32 (every kernel's first step)."""
    return (F32(1) / np.asarray(scale, dtype=F32)).astype(F32)


def _scaled(x: np.ndarray, inv) -> np.ndarray:
    """``src * inv_scale`` in float32."""
    return (x * inv).astype(F32)


def _cvtps_epi32(v: np.ndarray) -> np.ndarray:
    """``_mm256_cvtps_epi32``: round half to even (the default MXCSR mode) to int32; a NaN or a result
    outside [-2^31, 2^31) gives 0x80000000 ("integer indefinite"). Returned as int64."""
    r = np.rint(v.astype(F64))
    ok = (r >= -(2.0**31)) & (r < 2.0**31)  # False for NaN
    return np.where(ok, r, F64(INT32_MIN)).astype(np.int64)


def _wrap_int32(a: np.ndarray) -> np.ndarray:
    """``_mm256_add_epi32``: int32 addition, wrapping modulo 2^32. int64 in and out."""
    return (a + 2**31) % 2**32 - 2**31


def _min_ps(a: np.ndarray, b) -> np.ndarray:
    """``_mm256_min_ps(a, b)`` (vminps): ``a < b ? a : b``, so a NaN in ``a`` gives ``b``."""
    return np.where(a < b, a, b).astype(F32)


def _double_to_storage(v: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """FBGEMM ``clamp<double, T>`` then the conversion to T, for a value already clamped (or NaN).

    ``std::max<double>(src, min)`` and ``std::min<double>(src, max)`` keep a NaN ``src`` (both test
    ``a < b``), so NaN reaches the double -> T conversion, which x86 performs with cvttsd2si: 0x80000000,
    whose low bits are 0 for int8/uint8 and INT32_MIN for int32.
    """
    nan_value = INT32_MIN if dtype == np.dtype(np.int32) else 0
    return np.where(np.isnan(v), F64(nan_value), v).astype(np.int64).astype(dtype)


def _round_sum_to_f32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """float32 of the exact sum ``a + b`` of two float64 arrays, rounded once (to nearest, ties to even).

    ``a + b`` in float64 followed by a conversion to float32 rounds twice; the two differ only when the
    float64 sum lands exactly halfway between two float32 values and was itself rounded. TwoSum gives the
    float64 sum ``s`` and its exact error ``e``; on such a halfway ``s`` the sign of ``e`` picks the side.
    Non-finite sums are returned as float32 of ``s``.
    """
    a = np.asarray(a, F64)
    b = np.asarray(b, F64)
    with np.errstate(all="ignore"):
        s = a + b
        bb = s - a
        e = (a - (s - bb)) + (b - bb)
        r = s.astype(F32)
        finite = np.isfinite(s) & np.isfinite(r)
        lower = np.where(r.astype(F64) > s, np.nextafter(r, F32(-np.inf)), r)
        upper = np.where(r.astype(F64) > s, r, np.nextafter(r, F32(np.inf)))
        halfway = finite & np.isfinite(upper) & np.isfinite(lower) & (s != r.astype(F64)) & (
            (lower.astype(F64) + upper.astype(F64)) * 0.5 == s) & (e != 0)
        fixed = np.where(e > 0, upper, lower)
    return np.where(halfway, fixed, r).astype(F32)


def fma_f32(a: np.ndarray, b, c) -> np.ndarray:
    """``_mm256_fmadd_ps(a, b, c)``: float32 ``a * b + c`` rounded once.

    The product of two float32 values is exact in float64 (48 significant bits), so only the addition
    needs `_round_sum_to_f32`. NaN and infinities follow IEEE (the float64 operations give them).
    """
    p = np.asarray(a, F32).astype(F64) * np.asarray(b, F32).astype(F64)
    c64 = np.broadcast_to(np.asarray(c, F32).astype(F64), p.shape)
    return _round_sum_to_f32(p, c64)


# ---------------------------------------------------------------------------------------------
# quantize_per_tensor / quantize_per_channel
# ---------------------------------------------------------------------------------------------
def _quantize_avx2(x, inv, zp, lo, hi, legacy):
    """FBGEMM ``QuantizeAvx2<T>`` (uint8/int8, per-tensor), main loop and masked remainder alike:

    non-legacy: transformed = src * inv;                       LEGACY: transformed = fmadd(src, inv, float(zp))
                transformed = min_ps(transformed, 2147483520)           (NaN becomes 2147483520 here)
                rounded     = cvtps_epi32(transformed) + zp (epi32)     LEGACY: no addition here
                clipped     = min_epi32(max_epi32(rounded, min T), max T)
    The int32 addition wraps: with zp >= 128 (quint8), NaN, +Inf and a float32 x * inv >= 2^31 - 128 come out
    as 0; with zp < 0 (qint8), -Inf and x * inv <= -2^31 come out as 127.
    """
    if legacy:
        t = fma_f32(x, inv, F32(zp))
    else:
        t = _scaled(x, inv)
    t = _min_ps(t, INT32_FLOAT_MAX)
    r = _cvtps_epi32(t)
    if not legacy:
        r = _wrap_int32(r + zp)
    return np.clip(r, lo, hi)


def _quantize_scalar(x, inv, zp, lo, hi, legacy, dtype):
    """FBGEMM scalar ``Quantize<T>`` (``include/fbgemm/QuantUtils.h``), on broadcast arrays:

    transformed = src * inv_scale                                   (float32)
    non-legacy: transformed = zero_point + nearbyint(transformed)  (int32 + float: a float32 addition)
    LEGACY:     transformed = nearbyint(zero_point + transformed)
    return clamp<double, T>(transformed)                            (NaN: see _double_to_storage)
    """
    t = _scaled(x, inv)
    zp_f = np.asarray(zp).astype(F32)  # int32 -> float conversion, nearest even (exact below 2^24)
    if legacy:
        t = np.rint((zp_f + t).astype(F32))
    else:
        t = (zp_f + np.rint(t)).astype(F32)
    v = t.astype(F64)
    v = np.where(v < lo, F64(lo), v)  # std::max<double>(src, min): (src < min) ? min : src
    v = np.where(hi < v, F64(hi), v)  # std::min<double>(src, max): (max < src) ? max : src
    return _double_to_storage(v, dtype)


def _quantize_strict(x, inv, zp, lo, hi, legacy, fused):
    """The kernel's rounding, then the exact zero point addition (non-legacy) and a saturating clamp: no
    int32 wrap-around, no integer-indefinite conversions. ``x`` holds no NaN (the caller rejects it).
    LEGACY keeps the kernel's float32 ``x * inv + zp`` (fused where the kernel fuses it) before rounding."""
    if legacy:
        t = fma_f32(x, inv, F32(zp)) if fused else (np.asarray(zp).astype(F32) + _scaled(x, inv)).astype(F32)
        r = np.rint(t.astype(F64))
    else:
        r = np.rint(_scaled(x, inv).astype(F64)) + np.asarray(zp, F64)
    return np.clip(r, lo, hi)


def quantize_per_tensor(x: np.ndarray, scale: np.float32, zero_point: int, dtype: np.dtype, *,
                        legacy: bool = False, strict: bool = False) -> np.ndarray:
    """``torch.quantize_per_tensor(x, scale, zero_point, dtype).int_repr()`` on x86 with AVX2 and FMA.

    ``dtype`` is the storage (int8, uint8, int32); the result has ``x``'s shape.
    """
    dtype = np.dtype(dtype)
    info = np.iinfo(dtype)
    lo, hi = int(info.min), int(info.max)
    inv = inverse_scale(scale)
    with np.errstate(all="ignore"):
        if strict:
            q = _quantize_strict(x, inv, zero_point, lo, hi, legacy, fused=dtype.itemsize == 1)
            return q.astype(dtype)
        if dtype.itemsize == 1:
            return _quantize_avx2(x, inv, int(zero_point), lo, hi, legacy).astype(dtype)
        return _quantize_scalar(x, inv, int(zero_point), lo, hi, legacy, dtype)


def quantize_per_channel(x3: np.ndarray, scales: np.ndarray, zero_points: np.ndarray, dtype: np.dtype, *,
                         legacy: bool = False, strict: bool = False) -> np.ndarray:
    """``torch.quantize_per_channel(...).int_repr()`` on ``x3`` of shape [pre, channels, post].

    ``scales``: float32 (``static_cast<float>`` of torch's float64 scales), ``zero_points``: int64, both of
    shape (channels,). Every element takes FBGEMM's scalar ``Quantize`` (through ``quantize_val``).
    """
    dtype = np.dtype(dtype)
    info = np.iinfo(dtype)
    lo, hi = int(info.min), int(info.max)
    inv = inverse_scale(scales).reshape(1, -1, 1)
    zp = np.asarray(zero_points, np.int64).reshape(1, -1, 1)
    with np.errstate(all="ignore"):
        if strict:
            return _quantize_strict(x3, inv, zp, lo, hi, legacy, fused=False).astype(dtype)
        return _quantize_scalar(x3, inv, zp, lo, hi, legacy, dtype)


# ---------------------------------------------------------------------------------------------
# fake_quantize_per_tensor_affine / fake_quantize_per_channel_affine
# ---------------------------------------------------------------------------------------------
def _exact_product_f32(k: np.ndarray, scale) -> np.ndarray:
    """float32 of ``k * scale`` rounded once, for integers |k| < 2^40 and a float32 scale: k is split in
    two 20-bit halves whose products with the 24-bit scale are exact in float64."""
    k = np.asarray(k, np.int64)
    s = np.asarray(scale, F32).astype(F64)
    high = (k >> 20) << 20
    return _round_sum_to_f32(high.astype(F64) * s, (k - high).astype(F64) * s)


def fake_quantize_per_tensor(x: np.ndarray, scale: np.float32, zero_point: int, quant_min: int, quant_max: int, *,
                             strict: bool = False) -> np.ndarray:
    """``torch.fake_quantize_per_tensor_affine`` for float32 ``x`` (``_fake_quantize_tensor_helper``):

    inv_scale = 1.0f / sc
    qval_f = z_point + std::nearbyint(x * inv_scale)           int64 + float: a float32 addition
    qval   = int64(std::fmin(std::fmax(qval_f, quant_min), quant_max))    in double; fmax(NaN, m) = m
    out    = (qval - z_point) * sc                             int64 -> float, then a float32 product
    So NaN gives quant_min, +Inf quant_max, -Inf quant_min.
    """
    inv = inverse_scale(scale)
    sc = F32(scale)
    with np.errstate(all="ignore"):
        r = np.rint(_scaled(x, inv))
        if strict:
            q = np.clip(r.astype(F64) + zero_point, quant_min, quant_max).astype(np.int64)
            return _exact_product_f32(q - zero_point, sc).reshape(x.shape)
        qval_f = (F32(zero_point) + r).astype(F32)
        q = np.fmin(np.fmax(qval_f.astype(F64), F64(quant_min)), F64(quant_max)).astype(np.int64)
        return ((q - zero_point).astype(F32) * sc).astype(F32)


def fake_quantize_per_channel(x3: np.ndarray, scales: np.ndarray, zero_points: np.ndarray, quant_min: int,
                              quant_max: int, *, strict: bool = False) -> np.ndarray:
    """``torch.fake_quantize_per_channel_affine`` with int32 zero points (the integer branch of
    ``_fake_quant_per_channel_cachemask_cpu_helper``), on ``x3`` of shape [pre, channels, post]:

    inv_scale = 1.0f / scale
    q   = static_cast<int64_t>(zero_point + std::nearbyint(self * inv_scale))   float32 sum, then cvttss2si
    out = (std::fmin(std::fmax(q, quant_min), quant_max) - zero_point) * scale  in double, then to float
    The int64 conversion turns NaN, +-Inf and |value| >= 2^63 into INT64_MIN, which the clamp makes
    quant_min: unlike the per-tensor operator, +Inf and +1e38 give quant_min here.
    """
    s = np.asarray(scales, F32).reshape(1, -1, 1)
    zp = np.asarray(zero_points, np.int64).reshape(1, -1, 1)
    inv = inverse_scale(s)
    with np.errstate(all="ignore"):
        r = np.rint(_scaled(x3, inv))
        if strict:
            q = np.clip(r.astype(F64) + zp, quant_min, quant_max).astype(np.int64)
            return _exact_product_f32(q - zp, np.broadcast_to(s, q.shape))
        t = (zp.astype(F32) + r).astype(F32).astype(F64)
        in_range = np.isfinite(t) & (t >= -(2.0**63)) & (t < 2.0**63)
        q64 = np.where(in_range, t, F64(-(2.0**63)))  # int64 values, exact in double (t is a float32)
        q = np.fmin(np.fmax(q64, F64(quant_min)), F64(quant_max))
        return ((q - zp.astype(F64)) * s.astype(F64)).astype(F32)
