"""TensorFlow's own test vectors for QuantizeV2 and Dequantize, replayed against qlinear.tf.

Each case names the TensorFlow test it comes from (tensorflow/tensorflow repository):
  [quantize_op_test.cc]    tensorflow/core/kernels/quantize_op_test.cc
  [dequantize_op_test.cc]  tensorflow/core/kernels/dequantize_op_test.cc
  [quantized_ops_test.py]  tensorflow/python/ops/quantized_ops_test.py
  [dequantize_op_test.py]  tensorflow/python/kernel_tests/quantization_ops/dequantize_op_test.py
  [array_ops_test.py]      tensorflow/python/kernel_tests/array_ops/array_ops_test.py
Comparisons are as strict as TensorFlow's: exact where the test uses ExpectTensorEqual /
EXPECT_EQ / assertAllEqual, the test's own tolerance otherwise. C++ double literals are rounded to
float32 the way FillValues<float> / AddInputFromArray<float> do.

None of these need TensorFlow installed.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from qlinear.tf import dequantize, quantize_v2

f32 = np.float32


def f32a(values):
    return np.array(values, dtype=np.float64).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Data generators of the C++ tests
# ---------------------------------------------------------------------------------------------
def minstd_rand(seed: int, n: int) -> np.ndarray:
    """std::minstd_rand: x <- 48271 * x mod (2^31 - 1), yielding each new state."""
    out = np.empty(n, dtype=np.int64)
    x = seed
    for i in range(n):
        x = (48271 * x) % 2147483647
        out[i] = x
    return out


def scale_per_slice_along_axis_cc(dims, axis, data, dtype):
    """ScalePerSliceAlongAxis<T> of quantize_op_test.cc / dequantize_op_test.cc.

    out[i] = data[rng() % len(data)] * ((i / minor_size) % num_slices + 1), computed in T.
    """
    size = int(np.prod(dims))
    minor = int(np.prod(dims[axis + 1 :])) if axis != -1 else size
    num_slices = 1 if axis == -1 else dims[axis]
    picks = np.asarray(data, dtype=dtype)[minstd_rand(123, size) % len(data)]
    multiplier = (np.arange(size) // minor) % num_slices + 1
    return (picks * multiplier.astype(dtype)).astype(dtype).reshape(dims)


def scale_per_slice_py(shape, axis, values):
    """scale_per_slice of the Python tests (np.take tiling, in-place multiply along axis)."""
    out = np.take(values, np.remainder(np.arange(np.prod(shape)), len(values))).reshape(shape)
    if axis is not None:
        scale_shape = [1] * len(shape)
        scale_shape[axis] = shape[axis]
        out *= np.arange(1, shape[axis] + 1).reshape(scale_shape)
    return out


def test_minstd_rand_matches_the_standard():
    # The C++ standard fixes the 10000th value of a default-seeded minstd_rand: 399268537.
    assert minstd_rand(1, 10000)[-1] == 399268537


# ---------------------------------------------------------------------------------------------
# quantize_op_test.cc
# ---------------------------------------------------------------------------------------------
def test_quantize_op_test_cc_QuantizeV2():
    q, _, _ = quantize_v2(f32a([0.0, 1.0, 1.25, 1.75, 127.0, 255.0, 500.0]), f32a([0]), f32a([255.0]), "quint8", mode="MIN_FIRST")
    assert q.dtype == np.uint8
    np.testing.assert_array_equal(q, [0, 1, 1, 2, 127, 255, 255])


AXES_CC = [-1, 1, 3]
DIMS = [2, 3, 4, 5]


def _per_slice_ranges(axis, lo, hi):
    n = 1 if axis == -1 else DIMS[axis]
    k = np.arange(1, n + 1, dtype=np.float64)
    return (k * lo).astype(np.float32), (k * hi).astype(np.float32)


@pytest.mark.parametrize("axis", AXES_CC)
def test_quantize_op_test_cc_QuantizeV2Quint8Scaled(axis):
    x = scale_per_slice_along_axis_cc(DIMS, axis, [-255.0, 0.0, 1.0, 1.25, 1.75, 64.0, 127.0, 500.0], np.float32)
    mins, maxs = _per_slice_ranges(axis, -255.0, 127.0)
    q, out_min, out_max = quantize_v2(x, mins, maxs, "quint8", mode="SCALED", axis=axis)
    expected = scale_per_slice_along_axis_cc(DIMS, -1, [0, 0, 2, 3, 4, 129, 255, 255], np.uint8)
    np.testing.assert_array_equal(q, expected)
    k = np.arange(1, mins.size + 1)
    np.testing.assert_array_equal(np.ravel(out_min), 0)
    np.testing.assert_array_equal(np.ravel(out_max), (127.0 * k).astype(np.float32))


def test_quantize_op_test_cc_QuantizeV2Quint8ScaledSmallInputRange():
    q, out_min, out_max = quantize_v2(f32a([-1.0, 0.0, 2.0]), f32a([-1.0]), f32a([2.0]), "quint8", mode="SCALED")
    np.testing.assert_array_equal(q, [0, 0, 255])
    assert out_min.shape == () and out_max.shape == ()
    assert out_min == f32(0.0) and out_max == f32(2.0)


@pytest.mark.parametrize("axis", AXES_CC)
@pytest.mark.parametrize(
    "narrow_range, expected_values, out_max_unit",
    [(False, [-128, 0, 1, 1, 2, 64, 127], 127.0), (True, [-127, 0, 1, 1, 2, 64, 126], 128.0)],
    ids=["QuantizeV2Qint8Scaled", "QuantizeV2Qint8ScaledNarrowRange"],
)
def test_quantize_op_test_cc_QuantizeV2Qint8Scaled(axis, narrow_range, expected_values, out_max_unit):
    x = scale_per_slice_along_axis_cc(DIMS, axis, [-128.0, 0.0, 1.0, 1.25, 1.75, 64.0, 127.0], np.float32)
    mins, maxs = _per_slice_ranges(axis, -128.0, 100.0)
    q, out_min, out_max = quantize_v2(x, mins, maxs, "qint8", mode="SCALED", narrow_range=narrow_range, axis=axis)
    np.testing.assert_array_equal(q, scale_per_slice_along_axis_cc(DIMS, -1, expected_values, np.int8))
    k = np.arange(1, mins.size + 1)
    np.testing.assert_array_equal(np.ravel(out_min), (-128.0 * k).astype(np.float32))
    np.testing.assert_array_equal(np.ravel(out_max), (out_max_unit * k).astype(np.float32))


def test_quantize_op_test_cc_QuantizeV2Qint8ScaledSmallInputRange():
    q, out_min, out_max = quantize_v2(f32a([-0.064, 0.0, 0.127]), f32a([-0.064]), f32a([0.127]), "qint8", mode="SCALED")
    np.testing.assert_array_equal(q, [-64, 0, 127])
    assert out_min == f32(-0.128) and out_max == f32(0.127)


@pytest.mark.parametrize(
    "round_mode, expected",
    [("HALF_TO_EVEN", [-126, 0, 1, 2, 4, 64, 127]), ("HALF_AWAY_FROM_ZERO", [-127, 0, 1, 3, 4, 64, 127])],
    ids=["QuantizeV2Qint8ScaledRoundToEven", "QuantizeV2Qint8ScaledRoundAwayFromZero"],
)
def test_quantize_op_test_cc_QuantizeV2Qint8ScaledRounding(round_mode, expected):
    x = f32a([-126.5, 0.0, 1.0, 2.5, 3.5, 64.0, 127.0])
    q, out_min, out_max = quantize_v2(x, f32a([-128.0]), f32a([-128.0]), "qint8", mode="SCALED", round_mode=round_mode)
    np.testing.assert_array_equal(q, expected)
    assert out_min == f32(-128.0) and out_max == f32(127.0)


def test_quantize_op_test_cc_QuantizeV2_32Bit():
    x = f32a([-500.0, 0.0, 1.0, 1.25, 1.75, 127.0, 255.0, 500.0])
    q, _, _ = quantize_v2(x, f32a([-256.0]), f32a([256.0]), "qint32", mode="MIN_FIRST")
    assert q.dtype == np.int32
    two23 = 1 << 23
    expected = np.array(
        [-(2**31), 0, 1.0 * two23, 1.25 * two23, 1.75 * two23, 127.0 * two23, 255.0 * two23, 2**31 - 1], dtype=np.int64
    )
    # "We expect there will be some fuzziness in the lower bits": |delta| < 2^8.
    assert np.all(np.abs(q.astype(np.int64) - expected) < 256)


def test_quantize_op_test_cc_QuantizeV2Ports():
    q, out_min, out_max = quantize_v2(f32a([1.0, 1.25, 1.75, 127.0, 255.0, 500.0]), f32a([0]), f32a([255.0]), "quint8", mode="MIN_FIRST")
    np.testing.assert_array_equal(q, [1, 1, 2, 127, 255, 255])
    assert abs(out_min - 0.0) <= 1e-5 and abs(out_max - 255.0) <= 1e-5


def test_quantize_op_test_cc_QuantizeV2EqualRange():
    q, out_min, out_max = quantize_v2(np.zeros(6, np.float32), f32a([0.0]), f32a([0.0]), "quint8", mode="MIN_FIRST")
    np.testing.assert_array_equal(q, [0] * 6)
    assert abs(out_min) <= 1e-5 and out_max > 0.0


def test_quantize_op_test_cc_QuantizeV2MovesMinToIncludeZero():
    q, out_min, out_max = quantize_v2(f32a([0.1, 0.2, 0.3]), f32a([0.1]), f32a([0.3]), "quint8", mode="MIN_FIRST")
    np.testing.assert_array_equal(q, [85, 170, 255])
    assert abs(out_min) <= 1e-5 and abs(out_max - f32(0.3)) <= 1e-5


def test_quantize_op_test_cc_QuantizeV2MovesMaxToIncludeZero():
    q, out_min, out_max = quantize_v2(f32a([-0.1, -0.2, -0.3]), f32a([-0.3]), f32a([-0.1]), "quint8", mode="MIN_FIRST")
    np.testing.assert_array_equal(q, [170, 85, 0])
    assert abs(out_min - f32(-0.3)) <= 1e-5 and abs(out_max) <= 1e-5


def test_quantize_op_test_cc_Dequantize():
    out = dequantize(np.array([1, 2, 4, 8, 16, 255], np.uint8), f32a([0]), f32a([255.0]), mode="MIN_FIRST")
    np.testing.assert_allclose(out, [1.0, 2.0, 4.0, 8.0, 16.0, 255.0], rtol=0, atol=0.5)


def test_quantize_op_test_cc_QuantizeV2DisableEnsureMinimumRange():
    q, out_min, out_max = quantize_v2(
        f32a([-0.000001, 0.0, 0.000042]), f32a([-0.000128]), f32a([0.000127]), "qint8", mode="MIN_FIRST", ensure_minimum_range=0.0
    )
    np.testing.assert_array_equal(q, [-1, 0, 42])
    assert abs(out_min - f32(-0.000128)) <= 1e-7 and abs(out_max - 0.000127) <= 1e-7


# ---------------------------------------------------------------------------------------------
# dequantize_op_test.cc
# ---------------------------------------------------------------------------------------------
def _compute_dequantize_min_combined_using_eigen(q, min_range, max_range):
    """ComputeDequantizeMinCombinedUsingEigen of dequantize_op_test.cc (the test's own oracle)."""
    info = np.iinfo(q.dtype)
    half_range = f32(0.0) if info.min == 0 else f32(f32(f32(info.max) - f32(info.min) + f32(1)) / f32(2.0))
    scale_factor = f32(f32(max_range - min_range) / f32(f32(info.max) - f32(info.min)))
    return ((q.astype(np.int32).astype(np.float32) + half_range) * scale_factor + min_range).astype(np.float32)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.uint16], ids=["Quint8", "Qint8", "Qint16", "Quint16"])
def test_dequantize_op_test_cc_DequantizeMinCombined(dtype):
    info = np.iinfo(dtype)
    q = np.arange(info.min, info.max, dtype=np.int64).astype(dtype)  # min .. max - 1, as the test
    out = dequantize(q, f32(0), f32(255.0))
    expected = _compute_dequantize_min_combined_using_eigen(q, f32(0), f32(255.0))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.uint16], ids=["Quint8", "Qint8", "Qint16", "Quint16"])
def test_dequantize_op_test_cc_DequantizeBfloat16MinCombined(dtype):
    info = np.iinfo(dtype)
    q = np.arange(info.min, info.max, dtype=np.int64).astype(dtype)
    out = dequantize(q, f32(0), f32(255.0), dtype="bfloat16")
    expected = _compute_dequantize_min_combined_using_eigen(q, f32(0), f32(255.0)).astype(ml_dtypes.bfloat16)
    assert out.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(out.view(np.uint16), expected.view(np.uint16))


def _expect_close(actual, expected):
    """test::ExpectClose defaults: |a - e| <= atol + rtol * |e| with atol = rtol = float epsilon."""
    eps = float(np.finfo(np.float32).eps)
    assert np.all(np.abs(actual.astype(np.float64) - expected) <= eps + eps * np.abs(expected))


SCALED_DEQ_CASES = [
    ("DequantizeScaledQuint8Zero", np.uint8, -255.0, 127.0, -1, [0], [0.0]),
    ("DequantizeScaledQuint8CheckIgnoresNegative", np.uint8, -512.0, 255.0, -1, [255], [255.0]),
    ("DequantizeScaledQuint8ScaleDown", np.uint8, -1.0, 2.0, -1, [255], [2.0]),
    ("DequantizeScaledQuint8ScaleUp", np.uint8, 200.0, 400.0, -1, [255], [400.0]),
    ("DequantizeScaledQint8Zero", np.int8, -255.0, 127.0, -1, [0], [0.0]),
    ("DequantizeScaledQint8ScaleIdentity", np.int8, -10.0, 127.0, -1, [-127], [-127.0]),
    ("DequantizeScaledQint8ScaleDown", np.int8, -2.0, 1.0, -1, [-128], [-2.0]),
    ("DequantizeScaledQint8ScaleUp", np.int8, -1.0, 300.0, -1, [42], [99.212601]),
    ("DequantizeScaledQint8Axis1", np.int8, -12.8, 12.7, 1, [-20, -10, 0, 1, 10, 20], [-2.0, -1.0, 0.0, 0.1, 1.0, 2.0]),
    ("DequantizeScaledQint8Axis3", np.int8, -12.8, 12.7, 3, [-20, -10, 0, 1, 10, 20], [-2.0, -1.0, 0.0, 0.1, 1.0, 2.0]),
]


@pytest.mark.parametrize("name, dtype, lo, hi, axis, values, expected", SCALED_DEQ_CASES, ids=[c[0] for c in SCALED_DEQ_CASES])
def test_dequantize_op_test_cc_RunDequantizeScaledTest(name, dtype, lo, hi, axis, values, expected):
    q = scale_per_slice_along_axis_cc(DIMS, -1, values, dtype)
    n = 1 if axis == -1 else DIMS[axis]
    k = np.arange(1, n + 1, dtype=np.float32)
    mins, maxs = k * f32(lo), k * f32(hi)  # (slice_idx + 1) * float, in float
    out = dequantize(q, mins, maxs, mode="SCALED", axis=axis)
    want = scale_per_slice_along_axis_cc(DIMS, axis, f32a(expected), np.float32).astype(np.float64)
    _expect_close(out, want)


# ---------------------------------------------------------------------------------------------
# quantized_ops_test.py
# ---------------------------------------------------------------------------------------------
def test_quantized_ops_test_py_testQuantizeOp():
    q, _, _ = quantize_v2(f32a([1.0, 1.25, 1.75, 127.0, 255.0, 500.0]), 0.0, 255.0, "quint8", mode="MIN_FIRST")
    np.testing.assert_allclose(q, [1, 1, 2, 127, 255, 255], rtol=0, atol=0.1)


def test_quantized_ops_test_py_testDequantizeOp():
    out = dequantize(np.array([1, 2, 4, 8, 16, 255], np.uint8), 0.0, 255.0, mode="MIN_FIRST")
    np.testing.assert_allclose(out, [1, 2, 4, 8, 16, 255], rtol=0, atol=0.1)


SHAPE = np.array([2, 3, 4, 5])


@pytest.mark.parametrize("axis", [None, 0, 1, 2, 3])
def test_quantized_ops_test_py_testAxis(axis):
    values = np.array([-1, -0.5, 0, 0.3, 0.8, 0.555, 0.5], dtype=np.float32)
    quant_values = np.array([-128, -64, 0, 38, 102, 71, 64], dtype=np.int32)
    inputs = scale_per_slice_py(SHAPE, axis, values)
    expected = scale_per_slice_py(SHAPE, None, quant_values)
    if axis is None:
        min_range, max_range = -1.0, 0.8
    else:
        min_range = [-1.0 * (k + 1) for k in range(SHAPE[axis])]
        max_range = [0.8 * (k + 1) for k in range(SHAPE[axis])]
    # tf.quantization.quantize maps axis=None to the raw op's -1.
    q, _, _ = quantize_v2(
        inputs, min_range, max_range, "qint8", mode="SCALED", round_mode="HALF_TO_EVEN", axis=-1 if axis is None else axis
    )
    np.testing.assert_array_equal(q, expected)


# ---------------------------------------------------------------------------------------------
# dequantize_op_test.py
# ---------------------------------------------------------------------------------------------
def _np_dequantize(inputs, min_range, max_range, dtype, mode, narrow_range):
    """The NumPy oracle of dequantize_op_test.py's _testDequantizeOp."""
    v_max, v_min = np.iinfo(dtype).max, np.iinfo(dtype).min
    type_range = v_max - v_min
    if mode == "MIN_COMBINED":
        half_range = (type_range + 1) / 2 if v_min < 0 else 0.0
        return ((inputs.astype(np.float32) + half_range) * (max_range - min_range) / type_range) + min_range
    if narrow_range:
        v_min += 1
    scale_factor = max(min_range / v_min, max_range / v_max)
    return inputs.astype(np.float32) * scale_factor


PY_DEQ_CASES = [
    ("testBasicQuint8", [0, 128, 255], 0.0, 6.0, np.uint8, "MIN_COMBINED", False),
    ("testBasicQuint8", [0, 128, 255], 0.0, 123.456, np.uint8, "MIN_COMBINED", False),
    ("testBasicQuint8", [0, 4, 42, 108, 243], 5.0, 200.2, np.uint8, "MIN_COMBINED", False),
    ("testBasicQint8", [-128, 0, 127], -1.0, 2.0, np.int8, "MIN_COMBINED", False),
    ("testBasicQint8", [-2, 4, -17], -5.0, -3.0, np.int8, "MIN_COMBINED", False),
    ("testBasicQint8", [0, -4, 42, -108], 5.0, 40.0, np.int8, "MIN_COMBINED", False),
    ("testScaledMode", [-128, 0, 127], -1.0, 2.0, np.int8, "SCALED", False),
    ("testScaledMode", [-2, 4, -17], -5.0, -3.0, np.int8, "SCALED", False),
    ("testScaledMode", [0, -4, 42, -108], 5.0, 40.0, np.int8, "SCALED", False),
    ("testNarrowRange", [-128, 0, 127], -1.0, 2.0, np.int8, "SCALED", True),
    ("testNarrowRange", [-2, 4, -17], -5.0, -3.0, np.int8, "SCALED", True),
    ("testNarrowRange", [0, -4, 42, -108], 5.0, 40.0, np.int8, "SCALED", True),
]


@pytest.mark.parametrize(
    "name, inputs, lo, hi, dtype, mode, narrow_range", PY_DEQ_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(PY_DEQ_CASES)]
)
def test_dequantize_op_test_py(name, inputs, lo, hi, dtype, mode, narrow_range):
    inputs = np.array(inputs)
    out = dequantize(inputs.astype(dtype), lo, hi, mode=mode, narrow_range=narrow_range)
    np.testing.assert_allclose(out, _np_dequantize(inputs, lo, hi, dtype, mode, narrow_range), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("axis", [None, 0, 1, 2, 3])
def test_dequantize_op_test_py_testAxis(axis):
    values = np.array([-128, -64, 0, 38, 102, 71, 64], dtype=np.int32)
    dequant_values = np.array([-2, -1.0, 0, 0.59375, 1.59375, 1.109375, 1.0], dtype=np.float32)
    inputs = scale_per_slice_py(SHAPE, None, values).astype(np.int8)
    expected = scale_per_slice_py(SHAPE, axis, dequant_values)
    if axis is None:
        min_range, max_range = -2.0, 1.6
    else:
        min_range = [-2.0 * (k + 1) for k in range(SHAPE[axis])]
        max_range = [1.6 * (k + 1) for k in range(SHAPE[axis])]
    out = dequantize(inputs, min_range, max_range, mode="SCALED", axis=-1 if axis is None else axis)
    np.testing.assert_array_equal(out, expected)


# ---------------------------------------------------------------------------------------------
# array_ops_test.py
# ---------------------------------------------------------------------------------------------
def test_array_ops_test_py_testOutOfBoundAxis():
    input_tensor, _, _ = quantize_v2([1.0, 1.0], 0.0, 1.0, "qint32")
    with pytest.raises(ValueError, match="Axis must be less than input dimension|axis must be less than"):
        dequantize(input_tensor, [0], [1], axis=2**31 - 1)
