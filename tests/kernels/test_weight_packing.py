"""qlinear.kernels.weight_packing: the one-pass numba packers and column sums give the bits of their NumPy
references (reshapes and int64 sums), for both orientations, both group sizes, every tile width the GEMM paths
use, int8 and uint8 weights, K and N that do not fill a group or a panel. (That the layouts are the ones the
microkernels read is checked end to end by the exact GEMM and convolution tests.)"""

import numpy as np
import pytest

from qlinear.kernels import weight_packing as wp

pytestmark = pytest.mark.skipif(not wp.HAVE_NUMBA, reason="numba kernels")

SHAPES = [(1, 1), (3, 5), (8, 16), (37, 70), (64, 4608), (2048, 12)]  # (N, K)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("along", ["rows", "cols"])
def test_pack_matches_reference(dtype, along):
    rng = np.random.default_rng(0)
    info = np.iinfo(dtype)
    for n, k in SHAPES:
        w = rng.integers(info.min, info.max, (n, k), dtype=dtype, endpoint=True)
        w[0, :] = info.min  # the extremes, where a missed sign extension shows
        w[-1, :] = info.max
        if along == "cols":
            w = np.ascontiguousarray(w.T)
        for g, tile in [(4, 8), (4, 6), (4, 32), (4, 16), (2, 8), (2, 6), (2, 32), (2, 16)]:
            fast, ks = wp.pack(w, along, g, tile)
            ref, ks_ref = wp.pack_reference(w, along, g, tile)
            assert ks == ks_ref
            assert fast.dtype == np.int32 and np.array_equal(fast, ref), (n, k, g, tile)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("along", ["rows", "cols"])
def test_stats_match_reference(dtype, along):
    rng = np.random.default_rng(1)
    info = np.iinfo(dtype)
    for n, k in SHAPES + [(3, 70000), (1, 8_000_001)]:  # past 2**16 rows (cols), past 8M (rows: int64)
        w = rng.integers(info.min, info.max, (n, k), dtype=dtype, endpoint=True)
        if along == "cols":
            w = np.ascontiguousarray(w.T)
        zp = rng.integers(info.min, info.max, n, endpoint=True).astype(np.int64)
        fast = wp.stats(w, zp, along)
        ref = wp.stats_reference(w, zp, along)
        for a, b in zip(fast, ref):
            assert a.dtype == np.int64 and np.array_equal(a, b), (n, k)


def test_int32_words_of_a_row_slice():
    """A group's rows of a convolution's weights are a slice of the whole (N, K) array: the word path reads
    them in place."""
    rng = np.random.default_rng(2)
    w = rng.integers(0, 256, (48, 36), dtype=np.uint8)
    part = w[16:32]
    fast, _ = wp.pack(part, "rows", 4, 8)
    assert np.array_equal(fast, wp.pack_reference(part, "rows", 4, 8)[0])
