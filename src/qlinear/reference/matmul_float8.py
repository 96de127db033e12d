"""ONNX QLinearMatMul-21 with float8 operands or output, transcribed with exact Python integers.

Opset 21 allows float8e4m3fn/e4m3fnuz/e5m2/e5m2fnuz for a (T1), b (T2) and y (T3), independently, beside
int8/uint8. Neither peer computes them, so qlinear's semantics are its own (docs/semantics.md, the
QLinearMatMul rows):

1. ``acc = sum_k (a - a_zero_point)(b - b_zero_point)`` over the operands' exact real values (a float8
   zero point is 0), summed exactly and rounded once, to nearest even, to float64. An exact zero is +0.
   NaN/Inf (e4m3fn/e5m2 NaN, e5m2 Inf, and any fnuz NaN) follow IEEE: a NaN operand or Inf * 0 makes the
   sum NaN, +Inf + -Inf is NaN, otherwise an infinite product makes it +/-Inf.
2. ``v = acc * float64(multiplier) + float64(y_zero_point)`` in float64, the multiplier being
   ``a_scale * b_scale / y_scale`` in the scales' type (:func:`qlinear.reference.requantize.requantize_multiplier`,
   ``"float64"`` mode).
3. float8 y: ``v`` rounded once to nearest even with saturation (QuantizeLinear's saturate=1: beyond the largest
   finite value and +/-Inf become +/-max, NaN becomes the type's positive NaN). int8/uint8 y: saturated and
   rounded half to even as in :func:`qlinear.reference.requantize.requantize`; NaN becomes the type minimum
   (as QuantizeLinear does with NaN).

How the sum is exact: every float8 value is an integer multiple of its format's smallest subnormal
``2**-s`` (s = 9, 10, 16, 17 for e4m3fn, e4m3fnuz, e5m2, e5m2fnuz; s = 0 for the integer types), so
``value * 2**s`` is an integer and the sum is the integer matmul of those, divided by ``2**(s_a + s_b)``.
The matmul runs on Python ints (object arrays), the division ``n / d`` of two Python ints is correctly
rounded. A float64 sum would not be exact for e5m2: its products span 2**-32 .. 2**32.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ..dtypes import BY_DTYPE
from .small_float import to_small_float

FLOAT8_TYPES = tuple(
    np.dtype(t) for t in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2, ml_dtypes.float8_e5m2fnuz)
)


def fraction_bits(dtype) -> int:
    """s such that every finite value of ``dtype`` is an integer multiple of 2**-s (0 for integer types)."""
    dtype = np.dtype(dtype)
    if dtype in FLOAT8_TYPES:
        return -int(np.log2(float(ml_dtypes.finfo(dtype).smallest_subnormal)))
    return 0


def centered(x: np.ndarray, zero_point: np.ndarray) -> np.ndarray:
    """``x - zero_point`` as float64, exact: integers of magnitude <= 255, or float8 values minus a zero 0."""
    return x.astype(np.float64) - np.asarray(zero_point).astype(np.float64)


def matmul_accumulate_exact(a: np.ndarray, a_zero_point, b: np.ndarray, b_zero_point) -> np.ndarray:
    """``(a - a_zero_point) @ (b - b_zero_point)`` summed exactly and rounded once to float64 (point 1 above).

    a: (..., M, K), b: (..., K, N), at least 2-D, each int8/uint8 or float8; zero points broadcast against
    their operand (a's 0-d or (..., M, 1), b's 0-d, (N,) or (..., 1, N)); numpy.matmul's batch broadcasting.
    """
    a_values, b_values = centered(a, a_zero_point), centered(b, b_zero_point)
    a_bits, b_bits = fraction_bits(a.dtype), fraction_bits(b.dtype)

    # Finite part: integers value * 2**s as Python ints; NaN/Inf operands count as 0 here and are
    # accounted for below.
    def scaled_integers(values, bits):
        finite = np.where(np.isfinite(values), values, 0.0) * 2.0**bits  # exact: a power-of-two scaling
        return np.vectorize(int, otypes=[object])(finite)

    numerators = np.matmul(scaled_integers(a_values, a_bits), scaled_integers(b_values, b_bits))
    denominator = 2 ** (a_bits + b_bits)
    exact = np.vectorize(lambda n: n / denominator, otypes=[np.float64])(numerators)  # int / int: rounded once

    # NaN/Inf: IEEE arithmetic on the products that involve a non-finite operand (finite ones add 0).
    with np.errstate(invalid="ignore"):
        products = a_values[..., :, :, np.newaxis] * b_values[..., np.newaxis, :, :]  # (..., M, K, N)
        non_finite = ~np.isfinite(products)
        special = np.where(non_finite, products, 0.0).sum(axis=-2)
    return np.where(non_finite.any(axis=-2), special, exact)


def requantize_to_output(acc: np.ndarray, multiplier: np.ndarray, y_zero_point: np.ndarray) -> np.ndarray:
    """The float64 accumulator mapped to y's type (points 2 and 3 above); y_zero_point is 0-d."""
    out_dtype = y_zero_point.dtype
    with np.errstate(invalid="ignore"):  # Inf * 0 (an underflowed multiplier) is NaN, as IEEE says
        v = acc * np.asarray(multiplier).astype(np.float64) + y_zero_point.astype(np.float64)
    if out_dtype in FLOAT8_TYPES:
        v = np.where(np.isnan(v), np.nan, v)  # one NaN: the type's positive NaN, whatever NaN arose
        return to_small_float(v, BY_DTYPE[out_dtype], saturate=True).astype(out_dtype)
    info = np.iinfo(out_dtype)
    rounded = np.rint(np.clip(np.where(np.isnan(v), info.min, v), info.min, info.max))
    return rounded.astype(out_dtype)
