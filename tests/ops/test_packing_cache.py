"""Raw weights passed again reuse their packing only while they hold the same bytes (kernels/packing_cache.py).
Expected values: the exact integer sums computed here with int64 NumPy (a 1x1 convolution is a matrix
product), never the cached call's own earlier output."""

import threading

import numpy as np
import pytest

import qlinear
from qlinear.kernels import packing_cache


@pytest.fixture(autouse=True)
def _fresh_cache():
    packing_cache.set_enabled(True)
    packing_cache.clear()
    yield
    packing_cache.set_enabled(True)
    packing_cache.clear()


def _exact_1x1(x, zx, w, zw):
    """sum_c (x - zx)(w - zw) for a 1x1 convolution, int64."""
    xc = x.astype(np.int64) - np.int64(zx)
    wc = w[:, :, 0, 0].astype(np.int64) - np.asarray(zw, np.int64).reshape(-1, 1)
    return np.einsum("nchw,mc->nmhw", xc, wc)


def _case(rng, m=24, c=40):
    x = rng.integers(0, 256, (1, c, 5, 6), dtype=np.uint8)
    w = rng.integers(-128, 128, (m, c, 1, 1), dtype=np.int8)
    return x, w


def test_the_same_array_reuses_its_packing_and_a_modified_one_does_not():
    rng = np.random.default_rng(0)
    x, w = _case(rng)
    first = qlinear.conv_integer(x, w, np.uint8(3), np.int8(0))
    assert packing_cache.size()[0] == 1
    entry = next(iter(packing_cache._entries.values()))
    again = qlinear.conv_integer(x, w, np.uint8(3), np.int8(0))
    assert packing_cache.size()[0] == 1 and next(iter(packing_cache._entries.values()))[1] is entry[1]
    assert np.array_equal(first, _exact_1x1(x, 3, w, 0)) and np.array_equal(again, first)
    # modified in place: same address, shape and strides, other bytes
    w[5, 7, 0, 0] = -w[5, 7, 0, 0] - 1
    w[-1, -1, 0, 0] ^= 1
    changed = qlinear.conv_integer(x, w, np.uint8(3), np.int8(0))
    assert np.array_equal(changed, _exact_1x1(x, 3, w, 0))
    assert not np.array_equal(changed, first)
    assert next(iter(packing_cache._entries.values()))[1] is not entry[1]


def test_zero_points_and_group_are_part_of_the_key():
    rng = np.random.default_rng(1)
    x, w = _case(rng)
    zw = rng.integers(-3, 4, w.shape[0]).astype(np.int8)
    for zero_point in (np.int8(0), zw, np.int8(2), zw):
        got = qlinear.conv_integer(x, w, np.uint8(3), zero_point)
        assert np.array_equal(got, _exact_1x1(x, 3, w, zero_point))
    assert packing_cache.size()[0] == 3
    # the same bytes as groups of 4 input channels: another packing
    grouped = qlinear.conv_integer(x, w[:, :10], np.uint8(3), np.int8(0), group=4)
    assert grouped.shape == (1, 24, 5, 6)


def test_qlinear_conv_and_the_matmuls_use_it():
    rng = np.random.default_rng(2)
    x, w = _case(rng)
    a = rng.integers(0, 256, (7, 40), dtype=np.uint8)
    b = rng.integers(-128, 128, (40, 9), dtype=np.int8)
    exact = (a.astype(np.int64) - 5) @ b.astype(np.int64)
    for _ in range(2):
        assert np.array_equal(qlinear.matmul_integer(a, b, np.uint8(5), np.int8(0)), exact)
        y = qlinear.qlinear_conv(x, np.float32(0.5), np.uint8(3), w, np.float32(0.25), np.int8(0), np.float32(64),
                                 np.uint8(128))
        expected = np.clip(np.rint(_exact_1x1(x, 3, w, 0) * (0.5 * 0.25 / 64)) + 128, 0, 255)
        assert np.array_equal(y, expected.astype(np.uint8))
    assert packing_cache.size()[0] == 2
    b[0, 0] = -b[0, 0] - 1
    exact = (a.astype(np.int64) - 5) @ b.astype(np.int64)
    assert np.array_equal(qlinear.matmul_integer(a, b, np.uint8(5), np.int8(0)), exact)


def test_limits_and_switch():
    rng = np.random.default_rng(3)
    x, _ = _case(rng)
    arrays = [rng.integers(-128, 128, (24, 40, 1, 1), dtype=np.int8) for _ in range(packing_cache.MAX_ENTRIES + 5)]
    for w in arrays:
        assert np.array_equal(qlinear.conv_integer(x, w, np.uint8(3), np.int8(0)), _exact_1x1(x, 3, w, 0))
    count, held = packing_cache.size()
    assert count == packing_cache.MAX_ENTRIES and held == count * arrays[0].nbytes
    packing_cache.set_enabled(False)
    assert packing_cache.size() == (0, 0)
    assert np.array_equal(qlinear.conv_integer(x, arrays[0], np.uint8(3), np.int8(0)), _exact_1x1(x, 3, arrays[0], 0))
    assert packing_cache.size() == (0, 0)


def test_threads_calling_with_shared_and_changing_arrays():
    rng = np.random.default_rng(4)
    x, w = _case(rng)
    others = [rng.integers(-128, 128, w.shape, dtype=np.int8) for _ in range(3)]
    errors = []

    def work(seed):
        local = np.random.default_rng(seed)
        for _ in range(20):
            weights = w if local.random() < 0.5 else others[local.integers(3)]
            got = qlinear.conv_integer(x, weights, np.uint8(3), np.int8(0))
            if not np.array_equal(got, _exact_1x1(x, 3, weights, 0)):
                errors.append(seed)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors


@pytest.mark.parametrize("n", [1, 7, 8, 63, 64, 65, 511, 512, 513, 4096 + 3])
def test_the_byte_comparison_sees_a_change_at_every_position(n):
    """packing_cache._same (word by word where the array is C-contiguous, in blocks of 64 words with a tail):
    equal arrays compare equal, and a change of one bit anywhere, in the blocks or the tail, is seen; a
    non-contiguous array takes numpy.array_equal."""
    rng = np.random.default_rng(n)
    w = rng.integers(-128, 128, n, dtype=np.int8)
    copy = w.copy()
    assert packing_cache._same(copy, w)
    for position in sorted({0, n // 2, n - 1} | set(rng.integers(0, n, 8).tolist())):
        changed = w.copy()
        changed.view(np.uint8)[position] ^= np.uint8(1 << int(rng.integers(0, 8)))
        assert not packing_cache._same(copy, changed), position
    grid = rng.integers(0, 256, (n, 3), dtype=np.uint8)
    column = grid[:, 1]  # strided
    assert packing_cache._same(np.ascontiguousarray(column), column)
    other = column.copy()
    other[-1] ^= 0x80
    assert not packing_cache._same(other, column)
