"""ONNX MatMulInteger / QLinearMatMul accumulator, transcribed in int64 NumPy.

``numpy.matmul(a - a_zero_point, b - b_zero_point)`` with both operands widened to int64, which is exact:
each product is at most 255 * 255 in magnitude. ``numpy.matmul`` gives the broadcasting and the 1-D rules
that the specs refer to ("behaves like numpy.matmul").

The caller (``qlinear.ops.qlinear_matmul``) has validated shapes and reshaped the zero points so that they
broadcast against their operand: a's zero point is 0-d or (..., M, 1) (per row), b's is 0-d or (..., 1, N)
(per column).
"""

from __future__ import annotations

import numpy as np


def matmul_accumulate(a: np.ndarray, a_zero_point: np.ndarray, b: np.ndarray, b_zero_point: np.ndarray) -> np.ndarray:
    """Exact int64 accumulator ``(a - a_zero_point) @ (b - b_zero_point)``."""
    a_centered = a.astype(np.int64) - np.asarray(a_zero_point, dtype=np.int64)
    b_centered = b.astype(np.int64) - np.asarray(b_zero_point, dtype=np.int64)
    return np.matmul(a_centered, b_centered)
