"""The output pool: large results reuse the memory of dropped results, never of live ones, within a limit."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import qlinear
from qlinear.kernels import output_pool
from qlinear.kernels.quantize_linear import use_kernels

BIG = output_pool.MIN_POOLED_BYTES // 4  # float32 elements of the smallest pooled output


@pytest.fixture(autouse=True)
def fresh_pool():
    old = output_pool.get_output_pool_limit()
    output_pool.set_output_pool_limit(0)  # empties the pool
    output_pool.set_output_pool_limit(1 << 30)
    yield
    gc.collect()
    output_pool.set_output_pool_limit(0)
    output_pool.set_output_pool_limit(old)


def test_dropped_results_are_reused_live_ones_never():
    a = output_pool.empty((BIG,), np.float32)
    assert a.shape == (BIG,) and a.dtype == np.float32 and not a.flags.owndata
    address = a.ctypes.data
    b = output_pool.empty((BIG,), np.float32)
    assert b.ctypes.data != address  # a is alive
    view = a[::3]
    del a
    c = output_pool.empty((BIG,), np.float32)
    assert c.ctypes.data not in (address, b.ctypes.data)  # a view of a is alive
    del view
    d = output_pool.empty((BIG // 2, 2), np.float32)
    assert d.ctypes.data == address and d.shape == (BIG // 2, 2)


def test_small_outputs_are_plain_arrays():
    a = output_pool.empty((1000,), np.float32)
    assert a.flags.owndata and output_pool.pooled_bytes() == 0


def test_a_buffer_serves_requests_between_half_and_all_of_its_size():
    a = output_pool.empty((2 * BIG,), np.float32)
    address = a.ctypes.data
    del a
    small = output_pool.empty((BIG // 2,), np.float32)  # a quarter of the buffer: not worth it
    assert small.ctypes.data != address
    fits = output_pool.empty((BIG + 1,), np.float32)
    assert fits.ctypes.data == address


def test_the_pool_never_holds_more_than_the_limit():
    limit = 3 * output_pool.MIN_POOLED_BYTES
    output_pool.set_output_pool_limit(limit)
    live = [output_pool.empty((BIG,), np.float32) for _ in range(5)]
    assert output_pool.pooled_bytes() == limit  # the last two are ordinary arrays
    assert [x.flags.owndata for x in live] == [False, False, False, True, True]
    del live
    gc.collect()
    bigger = output_pool.empty((2 * BIG - 8,), np.float32)  # evicts free buffers to make room
    assert output_pool.pooled_bytes() <= limit and not bigger.flags.owndata


def test_limit_zero_turns_the_pool_off_and_releases_free_buffers():
    a = output_pool.empty((BIG,), np.float32)
    del a
    assert output_pool.pooled_bytes() > 0
    output_pool.set_output_pool_limit(0)
    assert output_pool.pooled_bytes() == 0
    assert output_pool.empty((BIG,), np.float32).flags.owndata


@pytest.mark.parametrize("value, error", [(-1, ValueError), (1.5, TypeError), (True, TypeError), ("1", TypeError)])
def test_set_output_pool_limit_validates(value, error):
    with pytest.raises(error, match="set_output_pool_limit: nbytes"):
        qlinear.set_output_pool_limit(value)


def test_environment_variable_sets_the_default():
    code = "import qlinear; print(qlinear.get_output_pool_limit())"
    env = dict(os.environ, QLINEAR_OUTPUT_POOL_BYTES="12345")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "12345"
    env["QLINEAR_OUTPUT_POOL_BYTES"] = "lots"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode != 0 and "QLINEAR_OUTPUT_POOL_BYTES must be a non-negative integer" in out.stderr


def test_reused_memory_gives_the_reference_results():
    """Quantize/dequantize into memory that held another result: every element is rewritten."""
    rng = np.random.default_rng(0)
    x1 = rng.standard_normal(BIG).astype(np.float32)
    x2 = rng.standard_normal(BIG).astype(np.float32) * 100
    y = qlinear.dequantize_linear(qlinear.quantize_linear(x1, np.float32(0.01), np.uint8(3)), np.float32(0.01),
                                  np.uint8(3))
    assert not y.flags.owndata
    address = y.ctypes.data
    del y
    q2 = qlinear.quantize_linear(x2, np.float32(0.5), np.uint8(7))
    y2 = qlinear.dequantize_linear(q2, np.float32(0.5), np.uint8(7))
    assert y2.ctypes.data == address
    with use_kernels(False):
        expected = qlinear.dequantize_linear(q2, np.float32(0.5), np.uint8(7))
    np.testing.assert_array_equal(y2, expected)
    t = qlinear.tf.dequantize(q2, -1.0, 1.0, mode="MIN_COMBINED")
    assert t.shape == (BIG,) and not t.flags.owndata


def test_concurrent_requests_never_share_a_live_buffer():
    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(6):
            a = output_pool.empty((BIG,), np.float32)
            value = rng.random()
            a[:] = value
            b = output_pool.empty((BIG,), np.float32)
            b[:] = -value
            if not (a[::4096] == value).all() or not (b[::4096] == -value).all():
                return False
            del a, b
        return True

    output_pool.set_output_pool_limit(6 * output_pool.MIN_POOLED_BYTES)
    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(work, range(4)))
    assert output_pool.pooled_bytes() <= 6 * output_pool.MIN_POOLED_BYTES
