"""`qlinear.kernels.bfloat16.cast` against ml_dtypes' float32 -> bfloat16 cast, bit for bit: every exponent with
significands around the rounding boundaries (ties, one below and above, the carries into the next binade and
to Inf), signed zeros, subnormals, Inf and NaNs with payloads and both signs. All 2^32 float32 patterns were
checked offline (see the module)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from qlinear.kernels import bfloat16, threads
from qlinear.kernels.quantize_linear import HAVE_NUMBA, use_kernels

pytestmark = pytest.mark.skipif(not HAVE_NUMBA, reason="numba is not installed")


def _patterns() -> np.ndarray:
    exponents = np.arange(256, dtype=np.uint32) << np.uint32(23)
    low = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x10000, 0x17FFF, 0x18000, 0x18001,
                    0x7F7FFF, 0x7F8000, 0x7FFFFF, 0x400000, 0x400001, 0x7FC000], np.uint32)
    rng = np.random.default_rng(5)
    bits = (exponents[:, None] | np.concatenate([low, rng.integers(0, 1 << 23, 64).astype(np.uint32)])[None, :])
    bits = bits.ravel()
    return np.concatenate([bits, bits | np.uint32(0x80000000)])


def test_cast_equals_ml_dtypes():
    x = _patterns().view(np.float32)
    with np.errstate(all="ignore"):
        expected = x.astype(ml_dtypes.bfloat16)
    got = bfloat16.cast(x, ml_dtypes.bfloat16)
    assert got.dtype == expected.dtype and got.shape == x.shape
    bad = np.nonzero(got.view(np.uint16) != expected.view(np.uint16))[0]
    assert bad.size == 0, f"{bad.size} mismatches, first float32 {x.view(np.uint32)[bad[0]]:#010x}"


def test_cast_large_split_between_threads_and_shapes_kept(monkeypatch):
    monkeypatch.setattr(threads, "SPLIT_ALWAYS", True)
    n = 3 * (1 << 20) + 5
    x = (np.random.default_rng(6).standard_normal(n) * 1e3).astype(np.float32).reshape(-1, 1)[:n - 5].reshape(-1, 2)
    got = bfloat16.cast(x, ml_dtypes.bfloat16)
    assert got.shape == x.shape
    np.testing.assert_array_equal(got.view(np.uint16), x.astype(ml_dtypes.bfloat16).view(np.uint16))
    strided = x[:, ::2]  # not contiguous
    np.testing.assert_array_equal(bfloat16.cast(strided, ml_dtypes.bfloat16).view(np.uint16),
                                  strided.astype(ml_dtypes.bfloat16).view(np.uint16))


def test_other_types_and_switched_off_kernels_are_astype():
    x = np.linspace(-3, 3, 11, dtype=np.float32)
    for dtype in (np.float16, np.float64, np.float32):
        assert bfloat16.cast(x, dtype).dtype == np.dtype(dtype)
    with use_kernels(False):
        np.testing.assert_array_equal(bfloat16.cast(x, ml_dtypes.bfloat16).view(np.uint16),
                                      x.astype(ml_dtypes.bfloat16).view(np.uint16))
    assert bfloat16.cast(np.zeros((0, 3), np.float32), ml_dtypes.bfloat16).shape == (0, 3)
