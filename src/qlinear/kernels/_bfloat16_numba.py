"""The numba half of `qlinear.kernels.bfloat16` (see there for the rounding)."""

from __future__ import annotations

import numpy as np
from qlinear.kernels import ensure_fresh_numba_cache

ensure_fresh_numba_cache()  # before any cached kernel loads
from numba import njit  # noqa: E402

from ._vector_width import use_512_bit_vectors  # noqa: E402


@njit(cache=True, nogil=True)
def round_to_bfloat16(u, out, start, stop):
    """out[i] = the bfloat16 bits of float32 bits u[i], for i in [start, stop)."""
    use_512_bit_vectors()
    src, dst = u[start:stop], out[start:stop]  # slices indexed from 0: with signed offsets LLVM gathered and scattered
    for i in range(src.size):
        # every step cast back to uint32: numba widens integer arithmetic to 64 bits, which halved the lanes
        v = src[i]
        high = np.uint32(v >> np.uint32(16))
        biased = np.uint32(np.uint32(v + np.uint32(0x7FFF)) + np.uint32(high & np.uint32(1)))
        rounded = np.uint32(biased >> np.uint32(16))
        quiet = np.uint32(np.uint32(high & np.uint32(0x8000)) | np.uint32(0x7FC0))
        nan = np.uint32(v & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
        dst[i] = np.uint16(quiet if nan else rounded)
