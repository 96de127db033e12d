"""ONNX DynamicQuantizeLinear-11, transcribed in NumPy float32 (uint8 output, the only type the schema allows).

    y_scale = (maximum(0, max(x)) - minimum(0, min(x))) / (qmax - qmin)
    intermediate_zero_point = qmin - min(x) / y_scale
    y_zero_point = cast(round(saturate(intermediate_zero_point)))
    y = saturate(round(x / y_scale) + y_zero_point)

Every operation is float32 and rounds half to even, as in the spec and the onnx reference. The data
range is widened to include 0, so ``min(x)`` in the zero-point formula is ``minimum(0, min(x))``.

All-zero (or empty) input: the formula divides 0 by 0. qlinear follows the onnx reference and uses a range
of 1, giving ``y_scale = 1/255`` (float32), zero point 0 and y all 0; onnxruntime returns scale 1.0.
A non-zero range so small (subnormal) that ``y_scale`` underflows to 0: both peers' answer, written out.
The caller has rejected NaN and infinite values, for which the spec gives no meaningful result.
"""

from __future__ import annotations

import numpy as np

QMIN, QMAX = 0, 255


def dynamic_quantize_linear(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return ``(y, y_scale, y_zero_point)``: uint8 of x's shape, 0-d float32, 0-d uint8."""
    x = np.asarray(x, dtype=np.float32)
    x_max = np.maximum(np.float32(0), x.max(initial=np.float32(0)))
    x_min = np.minimum(np.float32(0), x.min(initial=np.float32(0)))

    data_range = x_max - x_min
    if data_range == 0:
        data_range = np.float32(1)  # all zeros: 0/0 in the spec; the onnx reference's choice
    y_scale = np.float32(data_range / np.float32(QMAX - QMIN))
    if y_scale == 0:
        # A range of at most 127 * 2**-149 (subnormal): the scale underflows to 0, the zero point is
        # qmin - min / 0 (+Inf, or 0/0 when min is 0) and x / 0 is +-Inf (0/0 at 0). Both peers return
        # zero point 255 and y = 255 where x > 0, else 0 (docs/semantics.md, DynamicQuantizeLinear row 28).
        y = np.where(x > 0, QMAX, QMIN)
        return y.astype(np.uint8), np.asarray(y_scale, dtype=np.float32), np.asarray(QMAX, dtype=np.uint8)

    intermediate_zero_point = np.float32(QMIN) - x_min / y_scale
    y_zero_point = np.rint(np.clip(intermediate_zero_point, QMIN, QMAX))

    y = np.clip(np.rint(x / y_scale) + y_zero_point, QMIN, QMAX)
    return y.astype(np.uint8), np.asarray(y_scale, dtype=np.float32), np.asarray(y_zero_point).astype(np.uint8)
