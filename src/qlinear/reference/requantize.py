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

The other runtimes' arithmetics, so that an ONNX model can be checked against the runtime it was deployed on
(`qlinear.reference.tflite_requantize` transcribes them; docs/tflite_conv.md):

``"xnnpack"``, XNNPACK's fp32 requantization (the default TFLite delegate): the ``"float32"`` arithmetic,
    which it equals operation for operation (float32 scale product and quotient, float32(acc) times it,
    clamp to the bounds less the zero point, round half to even, add the zero point).

``"tflite"``, TFLite's reference CONV_2D / DEPTHWISE_CONV_2D kernels (and FULLY_CONNECTED's before 2025):
    real = double(x_scale) * double(w_scale) / double(y_scale)        (int8 x: PopulateConvolutionQuantization-
           double(float32(x_scale * w_scale)) / double(y_scale)        Params; uint8 x: the float32 product of
                                                                       GetQuantizedConvolutionMultipler)
    (M, shift) = QuantizeMultiplier(real)                              M in [2**30, 2**31), halves away
    y = MultiplyByQuantizedMultiplier(int32(acc), M, shift) + y_zero_point  (an int32 addition: wraps), clamped
    where MultiplyByQuantizedMultiplier rounds twice (SaturatingRoundingDoublingHighMul, then
    RoundingDivideByPOT).

``"tflite-single"``: the same in a TFLITE_SINGLE_ROUNDING build: one rounding, halves toward +infinity.
"""

from __future__ import annotations

import numpy as np

from . import tflite_requantize as tfl
from .tflite_conv import real_multipliers

REQUANTIZE_MODES = ("float64", "float32", "tflite", "tflite-single", "xnnpack")
FUSED_MODES = ("float64", "float32")  # the modes the integer kernels apply in their store
_TFLITE_MODES = ("tflite", "tflite-single")


def arithmetic(mode: str) -> str:
    """The mode whose arithmetic ``mode`` is: "xnnpack" computes exactly as "float32"."""
    return "float32" if mode == "xnnpack" else mode


def requantize_multiplier(a_scale, b_scale, y_scale, mode: str, a_dtype=None) -> np.ndarray:
    """``a_scale * b_scale / y_scale`` rounded as ``mode`` prescribes (see the module docstring).

    The scales are arrays of one float type, already shaped to broadcast against the accumulator. ``a_dtype``
    (the first operand's type) matters for the TFLite modes only: uint8 takes the float32 scale product.
    """
    mode = arithmetic(mode)
    if mode in _TFLITE_MODES:
        uint8 = a_dtype is not None and np.dtype(a_dtype) == np.dtype(np.uint8)
        return np.asarray(real_multipliers(a_scale, b_scale, y_scale, float32_product=uint8))
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
    mode = arithmetic(mode)
    if mode in _TFLITE_MODES:
        single = mode == "tflite-single"
        fixed, shift = tfl.quantize_multipliers(multiplier, single)
        y = tfl.multiply_by_quantized_multiplier(tfl.wrap_int32(acc), fixed, shift, single_rounding=single)
        # TFLite adds the zero point in int32, which wraps (as the interpreter does) within |zp| of INT32_MAX
        return np.clip(tfl.wrap_int32(y + np.int64(y_zero_point)), qmin, qmax).astype(out_dtype)
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
