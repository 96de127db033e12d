"""ONNX DynamicQuantizeLinear-11: arguments and dispatch."""

from __future__ import annotations

import numpy as np

from qlinear.ops import _quant_args as qa
from qlinear.reference.dynamic_quantize_linear import dynamic_quantize_linear as _reference_dynamic_quantize_linear

__all__ = ["dynamic_quantize_linear"]


def dynamic_quantize_linear(x) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ONNX DynamicQuantizeLinear-11: quantize float32 ``x`` to uint8 with a scale and zero point from its range.

    Returns ``(y, y_scale, y_zero_point)``: uint8 of x's shape, a 0-d float32 and a 0-d uint8. The range is
    widened to include 0. An all-zero (or empty) x, where the spec's formula divides 0 by 0, gives scale
    1/255 as the onnx reference does (onnxruntime gives 1.0); y and the zero point are 0 either way. A non-zero
    range below 128 * 2**-149, whose scale underflows to 0, gives what both peers give: scale 0, zero point 255,
    y 255 where x > 0, else 0.
    NaN and infinite values are rejected, and so is a range ``max(x, 0) - min(x, 0)`` that overflows float32
    (beyond 3.4e38): the spec's scale would be infinite and every output 0.
    """
    func = "dynamic_quantize_linear"
    x = qa.quantized_tensor(func, "x", x, allowed=(np.dtype(np.float32),))
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{func}: x must be finite (no NaN or infinity): the scale would be undefined")
    if x.size:
        with np.errstate(over="ignore"):
            data_range = np.maximum(np.float32(0), x.max()) - np.minimum(np.float32(0), x.min())
        if not np.isfinite(data_range):
            raise ValueError(f"{func}: the range max(x, 0) - min(x, 0) overflows float32; the scale would be infinite")
    return _reference_dynamic_quantize_linear(x)
