"""How arrays are handed to numba kernels."""

from __future__ import annotations

import numpy as np


def read_only(a: np.ndarray) -> np.ndarray:
    """``a`` as a read-only view (itself when it is one already).

    numba compiles a kernel once per tuple of argument types, and an array's read-only flag is part of its type:
    an input the caller happened to pass read-only (a ``np.broadcast_to`` view, a memory map, a buffer) compiled
    the whole kernel again. Every array a kernel only reads is therefore passed read-only, always. In a cold test
    run the GEMM driver had 8 specializations, 7 of them read-only variants of one, and the QuantizeLinear and
    DequantizeLinear kernels 100 of 580."""
    if a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a
