"""Whether two equal-length 1-D arrays hold the same values, word by word: `packing_cache`'s check that a weight
array passed again still holds the bytes it was packed from (numpy.array_equal builds a boolean array first:
12 us for 147 KB, this 4.5)."""

from qlinear.kernels import ensure_fresh_numba_cache

ensure_fresh_numba_cache()  # before any cached kernel loads
import numpy as np  # noqa: E402
from numba import njit  # noqa: E402

_BLOCK = 64  # words or-ed together between exits: a loop LLVM vectorizes, and an early exit per 512 bytes


@njit(cache=True, nogil=True)
def same_values(a, b):
    """a == b element by element (integer arrays of one dtype and length)."""
    n = a.size
    i = 0
    while i + _BLOCK <= n:
        d = a[i] ^ b[i]
        for j in range(i + 1, i + _BLOCK):
            d |= a[j] ^ b[j]
        if d != 0:
            return False
        i += _BLOCK
    for j in range(i, n):
        if a[j] != b[j]:
            return False
    return True
