"""Conversion to float8, float6 and float4, as the ONNX Cast tables define it.

- float8, saturate=1: +/-Inf and values beyond the largest finite value become +/-max; NaN stays NaN;
  everything else rounds to nearest even.
- float8, saturate=0: overflow and +/-Inf become NaN for E4M3FN and both FNUZ types, +/-Inf for E5M2
  (ml_dtypes' plain cast implements exactly these tables, rounding first: E4M3FN 464 -> 448, 465 -> NaN).
- FNUZ types have no negative zero: -0 becomes +0 (ml_dtypes' cast does this).
- float4e2m1 (onnx docs/technical/float4.md): x > 6 -> 6, x < -6 -> -6, +Inf -> 6, -Inf -> -6, NaN -> 6.
  `saturate` has no effect (QuantizeLinear-28 says so).
- float6e2m3/float6e3m2 have no Inf or NaN either; qlinear treats them like float4: saturate to +/-max,
  NaN -> +max (the ONNX docs give no float6 table; this is the float4 rule carried over).
"""

from __future__ import annotations

import numpy as np

from ..dtypes import ElementType


def float32_round_to_odd(values: np.ndarray) -> np.ndarray:
    """float64 (or int32) values rounded to float32 *to odd*: truncated, with the last bit set when
    inexact. Rounding that to any type of at most 22 significant bits (float16, bfloat16, float8/6/4)
    gives the correctly rounded result; rounding to float32 first to nearest would round twice
    (1.1875 - 2**-40 would become the float32 tie 1.1875, then E4M3FN 1.25 instead of 1.125)."""
    values = np.asarray(values, np.float64)
    rounded = values.astype(np.float32)
    back = rounded.astype(np.float64)
    inexact = (back != values) & ~np.isnan(values)
    truncated = np.where(inexact & (np.abs(back) > np.abs(values)), np.nextafter(rounded, np.float32(0)), rounded)
    return (truncated.view(np.uint32) | inexact.astype(np.uint32)).view(np.float32)


def to_float(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Values converted to a float type with one correct rounding (NumPy/ml_dtypes go through float32
    when narrowing float64 or int32 to bfloat16 or a small float, which rounds twice)."""
    values = np.asarray(values)
    dtype = np.dtype(dtype)
    if dtype.itemsize < 4 and values.dtype in (np.dtype(np.float64), np.dtype(np.int32)):
        values = float32_round_to_odd(values)
    return values.astype(dtype)


def to_small_float(values: np.ndarray, target: ElementType, saturate: bool) -> np.ndarray:
    """Round float values (float16/32/64 or bfloat16) to a float8/float6/float4 type."""
    values = np.asarray(values)
    top = target.max_finite
    if target.kind == "float8":
        if saturate:
            # Clipping before the cast is exact: anything clipped would round to +/-max anyway.
            values = np.clip(values, -top, top)  # NaN passes through unchanged
        return to_float(values, target.dtype)
    # float4 / float6: no Inf or NaN encodings.
    values = np.where(np.isnan(values), top, np.clip(values, -top, top))
    return to_float(values, target.dtype)
