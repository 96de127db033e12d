"""QuantizeLinear and DequantizeLinear, transcribed from the spec (QuantizeLinear-28 /
DequantizeLinear-28) in plain NumPy.

The arguments arrive validated and normalised by `qlinear.ops.quantize_linear`: arrays of the right
types, a `Granularity`, the output type as an `ElementType`, and the division/multiplication precision
as a NumPy dtype. These functions are the readable oracle the fast kernels must equal bit for bit.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import ElementType
from ..granularity import Granularity
from .small_float import to_float, to_small_float


# IEEE overflow, 0/0 and NaN are expected inputs of the formulas (the rules for them are applied
# explicitly), so NumPy's warnings about them are silenced.
@np.errstate(all="ignore")
def quantize_linear(
    x: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray | None,
    granularity: Granularity,
    output: ElementType,
    saturate: bool,
    precision: np.dtype,
) -> np.ndarray:
    """y = saturate(round(x / y_scale) + y_zero_point)."""
    scale = granularity.expand(y_scale)

    # "The type of y_scale determines the precision of the division operation between x and
    # y_scale, unless the precision attribute is specified": both operands are converted to that
    # type and the quotient is rounded to it.
    quotient = to_float(x, precision) / to_float(scale, precision)

    if output.is_integer:
        # "For (x / y_scale), it rounds to the nearest even."  rint is exact in every float type;
        # float64 then holds the rounded quotient plus the zero point exactly wherever the result
        # can land inside the output range, and clipping saturates everything else, however large.
        rounded = np.rint(quotient).astype(np.float64)
        if y_zero_point is not None:
            rounded = rounded + granularity.expand(y_zero_point).astype(np.float64)
        y = np.clip(rounded, output.qmin, output.qmax)
        # NaN has no integer value; both onnx peers return the type's minimum (see docs/semantics.md).
        y = np.where(np.isnan(y), output.qmin, y)
        return y.astype(output.dtype)

    # float8/float6/float4: the rounding is the conversion itself; the zero point (usually 0) is
    # added in the division precision, as the formula says (so -0 + 0 gives +0, as the official
    # case test_quantizelinear_float4e2m1 expects).
    # NaN plus NaN (a NaN zero point): the quotient's NaN, whatever the broadcasting (docs/semantics.md, K3).
    if y_zero_point is not None:
        zero_point = granularity.expand(y_zero_point).astype(precision)
        quotient = np.where(np.isnan(quotient), quotient, quotient + zero_point)
    return to_small_float(quotient, output, saturate)


@np.errstate(all="ignore")
def dequantize_linear(
    x: np.ndarray,
    x_type: ElementType,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray | None,
    granularity: Granularity,
    output: ElementType,
) -> np.ndarray:
    """y = (x - x_zero_point) * x_scale."""
    scale = granularity.expand(x_scale).astype(np.float32)
    if x_type.is_integer:
        # The difference of two integers is exact in int64; float32 then rounds it once (only int32
        # inputs beyond 2**24 can round).
        dx = x.astype(np.int64)
        if x_zero_point is not None:
            dx = dx - granularity.expand(x_zero_point).astype(np.int64)
        dx = dx.astype(np.float32)
    else:
        dx = x.astype(np.float32)
        if x_zero_point is not None:  # NaN minus NaN: x's NaN, as below
            dx = np.where(np.isnan(dx), dx, dx - granularity.expand(x_zero_point).astype(np.float32))
    # The product is taken in float32 and rounded once more to a float16/bfloat16 output, as both
    # onnx peers do (docs/semantics.md, row 15).
    product = dx * scale
    # NaN times NaN: (x - zero point)'s NaN, whatever the broadcasting. NumPy's own answer depends on its
    # SIMD loop (an array times a scalar returned the scalar's NaN, times an array the array's), so the
    # rule is written out (docs/semantics.md, row K3).
    product = np.where(np.isnan(dx), dx, product)
    return product.astype(output.dtype)
