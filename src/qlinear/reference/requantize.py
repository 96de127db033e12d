"""Requantization of an exact integer accumulator to int8/uint8: the last step of QLinearConv and QLinearMatMul.

The ONNX specs state no rounding rule for QLinearConv, and neither spec says in which precision the
multiplier ``x_scale * w_scale / y_scale`` is applied. Two arithmetics are provided, each matching a peer
bit for bit:

``"float64"`` (default), the onnx reference evaluator's arithmetic:
    multiplier = x_scale * w_scale / y_scale      in the scales' own type (float32, or float16/bfloat16)
    y = float64(acc) * float64(multiplier)         one rounding, to float64
    y = y + y_zero_point                           in float64
    y = round_half_to_even(saturate(y))

``"float32"``, onnxruntime's CPU arithmetic (MlasRequantizeOutput and its GEMM output processors):
    multiplier = float32(x_scale) * float32(w_scale) / float32(y_scale)   in float32
    y = float32(acc) * multiplier                  acc rounded to float32, product rounded to float32
    y = round_half_to_even(saturate(y, qmin - y_zero_point, qmax - y_zero_point)) + y_zero_point

Saturating before or after rounding gives the same result because the bounds are integers.
"""

from __future__ import annotations

import numpy as np

REQUANTIZE_MODES = ("float64", "float32")


def requantize_multiplier(a_scale, b_scale, y_scale, mode: str) -> np.ndarray:
    """``a_scale * b_scale / y_scale`` rounded as ``mode`` prescribes (see the module docstring).

    The scales are arrays of one float type, already shaped to broadcast against the accumulator.
    """
    if mode == "float32":
        a_scale, b_scale, y_scale = (np.asarray(s, dtype=np.float32) for s in (a_scale, b_scale, y_scale))
    # NumPy keeps float32 * float32 in float32 (and float16 in float16, ml_dtypes bfloat16 in bfloat16):
    # each of the two operations rounds once to the scales' type, as in the onnx reference.
    return np.asarray(a_scale * b_scale / y_scale)


def requantize(acc: np.ndarray, multiplier: np.ndarray, y_zero_point: np.ndarray, mode: str) -> np.ndarray:
    """Map the exact accumulator ``acc`` (int32 or int64 values) to the type of ``y_zero_point``.

    ``multiplier`` comes from :func:`requantize_multiplier` and broadcasts against ``acc``;
    ``y_zero_point`` is a 0-d int8 or uint8 array.
    """
    out_dtype = y_zero_point.dtype
    qmin, qmax = np.iinfo(out_dtype).min, np.iinfo(out_dtype).max
    if mode == "float64":
        # int32 * float32 promotes to float64 in NumPy; int32 values and float32/16 multipliers are exact
        # in float64, so the product is the exact product rounded once.
        y = acc.astype(np.float64) * multiplier.astype(np.float64)
        y = y + np.float64(y_zero_point)
        y = np.clip(y, qmin, qmax)
        return np.rint(y).astype(out_dtype)
    if mode == "float32":
        zero_point = np.float32(y_zero_point)
        y = acc.astype(np.float32) * multiplier.astype(np.float32)
        y = np.clip(y, np.float32(qmin) - zero_point, np.float32(qmax) - zero_point)
        # Integers below 2**24 are exact in float32, so adding the zero point after rounding is exact.
        return (np.rint(y) + zero_point).astype(out_dtype)
    raise ValueError(f"requantize: mode must be one of {REQUANTIZE_MODES}, got {mode!r}")
