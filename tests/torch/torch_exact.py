"""Exact oracles for tests/torch: the formulas of torch's kernels evaluated element by element in rational
arithmetic (fractions.Fraction), each float32 rounding written out. They use nothing from qlinear.

Each is a transcription of one formula, named in its docstring; the tests compare them with qlinear where torch
cannot answer (an installed torch other than 2.13.0 cannot show the LEGACY arithmetic, nor can any torch show
``strict=True``), and show with them what dividing by the scale would give instead.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

F32 = np.float32
_F32_MAX = Fraction(float(np.finfo(np.float32).max))


def frac(v) -> Fraction:
    return Fraction(float(v))


def round_to_f32(v: Fraction) -> Fraction:
    """The float32 nearest to ``v``, ties to the even significand (IEEE round to nearest); beyond the largest
    float32 by half an ulp or more: an infinity (as a Python float)."""
    if v == 0:
        return Fraction(0)
    sign = -1 if v < 0 else 1
    a = abs(v)
    e = math.floor(math.log2(a.numerator) - math.log2(a.denominator))
    while Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    e = max(e, -126)  # subnormals share the smallest normal binade's step
    step = Fraction(2) ** (e - 23)
    n = a / step
    k = math.floor(n)
    if n - k > Fraction(1, 2) or (n - k == Fraction(1, 2) and k % 2 == 1):
        k += 1
    r = k * step
    if r > _F32_MAX:
        return sign * math.inf
    return sign * r


def rne(v: Fraction) -> int:
    """nearbyint / cvtps: nearest integer, ties to even."""
    f = math.floor(v)
    d = v - f
    return f + (1 if d > Fraction(1, 2) or (d == Fraction(1, 2) and f % 2 == 1) else 0)


def inv_scale(scale) -> Fraction:
    """``1.0f / float(scale)``, rounded to float32."""
    return round_to_f32(Fraction(1) / frac(F32(scale)))


def quantize_multiply(x, scale, zero_point, lo, hi) -> int:
    """torch (2.12 and older, 2.14 and newer) on a finite value: clamp(rne(fl32(x * fl32(1/s))) + zp)."""
    p = round_to_f32(frac(x) * inv_scale(scale))
    return min(max(rne(p) + zero_point, lo), hi)


def quantize_divide(x, scale, zero_point, lo, hi) -> int:
    """What dividing would give (ONNX QuantizeLinear's formula, x / y_scale in float32):
    clamp(rne(fl32(x / s)) + zp)."""
    return min(max(rne(round_to_f32(frac(x) / frac(F32(scale)))) + zero_point, lo), hi)


def quantize_legacy(x, scale, zero_point, lo, hi, fused: bool) -> int:
    """torch 2.13.0 (FBGEMM LEGACY) on a finite value: clamp(rne(fl32(x * inv + zp))), the multiply-add
    rounded once when ``fused`` (the AVX2 ``_mm256_fmadd_ps`` of the 8-bit per-tensor path), else the product
    rounded to float32 first (the scalar path: qint32, and every per-channel element)."""
    p = frac(x) * inv_scale(scale)
    if not fused:
        p = round_to_f32(p)
    return min(max(rne(round_to_f32(p + zero_point)), lo), hi)


def quantize_strict(x, scale, zero_point, lo, hi) -> int:
    """``strict=True``: the kernel's float32 product, ties to even, the zero point added exactly, saturated;
    ±Inf (also an infinite product) go to the end of its sign."""
    if math.isinf(float(x)):
        return hi if x > 0 else lo
    p = round_to_f32(frac(x) * inv_scale(scale))
    if p in (math.inf, -math.inf):
        return hi if p > 0 else lo
    return min(max(rne(p) + zero_point, lo), hi)


def fake_quantize_strict(x, scale, zero_point, qmin, qmax) -> float:
    """``strict=True`` fake quantization: q as `quantize_strict` within [qmin, qmax], then (q - zp) * s
    rounded once to float32."""
    q = quantize_strict(x, scale, zero_point, qmin, qmax)
    return float(round_to_f32((q - zero_point) * frac(F32(scale))))
