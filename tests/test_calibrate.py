"""qlinear.calibrate: group ranges per tensor/axis/block, and scales/zero points from them.

The asymmetric integer parameters are checked against onnxruntime's quantization tool
(`onnxruntime.quantization.quant_utils.compute_scale_zp`), the ranges against plain NumPy reductions
written out per group, and the reductions against dask (the calibration must work on any array with
NumPy-style .min/.max).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from qlinear import calibrate, dtypes
from qlinear.granularity import Granularity


def _groups_by_loop(x, gran):
    """min/max per group, one group at a time (the plain reading of the definitions)."""
    shape = gran.param_shape
    lo, hi = np.empty(shape), np.empty(shape)
    for index in np.ndindex(*shape):
        if gran.kind == "tensor":
            part = x
        elif gran.kind == "axis":
            part = np.take(x, index[0], axis=gran.axis)
        else:
            key = list(index)
            key[gran.axis] = slice(index[gran.axis] * gran.block_size, (index[gran.axis] + 1) * gran.block_size)
            part = x[tuple(key)]
        lo[index], hi[index] = part.min(), part.max()
    return lo, hi


@pytest.mark.parametrize("gran", [
    Granularity("tensor", (6, 10)),
    Granularity("axis", (6, 10), 0),
    Granularity("axis", (6, 10), 1),
    Granularity("block", (6, 10), 1, 4),  # 4 + 4 + 2: a short last block
    Granularity("block", (6, 10), 0, 6),
    Granularity("block", (3, 7, 5), 1, 3),
])
def test_ranges_per_group(gran):
    x = np.random.default_rng(0).standard_normal(gran.x_shape).astype(np.float32)
    lo, hi = calibrate.ranges(x, gran)
    expected_lo, expected_hi = _groups_by_loop(x, gran)
    assert lo.shape == gran.param_shape and np.array_equal(lo, expected_lo) and np.array_equal(hi, expected_hi)


def test_ranges_on_dask_arrays():
    da = pytest.importorskip("dask.array")
    x = np.random.default_rng(1).standard_normal((8, 50)).astype(np.float32)
    gran = Granularity("block", (8, 50), 1, 16)
    lo, hi = calibrate.ranges(da.from_array(x, chunks=(4, 25)), gran)
    expected = calibrate.ranges(x, gran)
    assert np.array_equal(lo, expected[0]) and np.array_equal(hi, expected[1])


@pytest.mark.parametrize("name", ["int8", "uint8", "int16", "uint16", "int4", "uint4"])
def test_asymmetric_parameters_equal_onnxruntime(name):
    quant_utils = pytest.importorskip("onnxruntime.quantization.quant_utils")
    qtype = dtypes.get(name)
    rng = np.random.default_rng(2)
    lo = (rng.standard_normal(300) * 10.0 ** rng.integers(-4, 3, 300)).astype(np.float32)
    hi = lo + np.abs(rng.standard_normal(300)).astype(np.float32) * 10.0 ** rng.integers(-4, 3, 300).astype(np.float32)
    scale, zero_point = calibrate.parameters(lo, hi, qtype)
    for i in range(lo.size):
        ort_zero, ort_scale = quant_utils.compute_scale_zp(lo[i], hi[i], np.array(qtype.qmin, np.int64),
                                                           np.array(qtype.qmax, np.int64))
        assert scale[i] == ort_scale, (i, lo[i], hi[i])
        assert int(zero_point[i]) == int(ort_zero), (i, lo[i], hi[i])


def test_symmetric_parameters():
    lo, hi = np.array([-2.0, -0.5, 0.0]), np.array([1.0, 3.0, 0.0])
    scale, zero = calibrate.parameters(lo, hi, dtypes.get("int8"), symmetric=True)
    assert np.array_equal(scale, np.float32([2 / 127, 3 / 127, 1.0])) and np.all(zero == 0)
    scale, zero = calibrate.parameters(lo, hi, dtypes.get("uint4"), symmetric=True)
    # the middle code 8, and +-absmax on codes 1 and 15 exactly
    assert np.all(zero.astype(np.int64) == 8) and np.array_equal(scale, np.float32([2 / 7, 3 / 7, 1.0]))


@pytest.mark.parametrize("name", ["float8e4m3fn", "float8e5m2", "float4e2m1", "float6e3m2"])
def test_float_parameters(name):
    qtype = dtypes.get(name)
    scale, zero = calibrate.parameters(np.array([-3.0, 0.0]), np.array([1.0, 0.0]), qtype)
    assert scale[0] == np.float32(3.0 / float(ml_dtypes.finfo(qtype.dtype).max)) and scale[1] == 1.0
    assert zero.dtype == qtype.dtype and np.all(zero.astype(np.float32) == 0)


def test_constant_and_tiny_ranges_keep_a_positive_scale():
    int8 = dtypes.get("int8")
    scale, zero = calibrate.parameters(np.zeros(2), np.zeros(2), int8)
    assert np.all(scale == 1.0) and np.all(zero == -128)
    scale, zero = calibrate.parameters(np.array([5.0]), np.array([5.0]), int8)  # widened to [0, 5]
    assert scale[0] == np.float32(5 / 255) and zero[0] == -128
    scale, _ = calibrate.parameters(np.array([0.0]), np.array([1e-45]), int8)
    assert scale[0] > 0 and np.isfinite(scale[0])
    scale, _ = calibrate.parameters(np.array([0.0]), np.array([1e-9]), int8, scale_dtype=np.float16)
    assert scale.dtype == np.float16 and scale[0] == np.finfo(np.float16).smallest_normal


def test_zero_point_clamped_into_range():
    scale, zero = calibrate.parameters(np.array([-7.0]), np.array([-1.0]), dtypes.get("uint8"))
    assert zero[0] == 255  # all-negative range: 0.0 maps to the top code
    with pytest.raises(ValueError, match="the range must be finite"):
        calibrate.parameters(np.array([np.nan]), np.array([1.0]), dtypes.get("uint8"))
