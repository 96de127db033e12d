"""Every invalid-input rule of QuantizeLinear/DequantizeLinear: the error type and a message that
names the argument and the rule."""

import ml_dtypes
import numpy as np
import pytest

import qlinear

F32 = np.float32
X = np.arange(24, dtype=F32).reshape(2, 3, 4)


def q(*args, **kwargs):
    return qlinear.quantize_linear(*args, **kwargs)


def dq(*args, **kwargs):
    return qlinear.dequantize_linear(*args, **kwargs)


@pytest.mark.parametrize("call, error, match", [
    # opsets
    (lambda: q(X, F32(1), opset=9), ValueError, r"opset=9 is out of range: QuantizeLinear exists from opset 10"),
    (lambda: q(X, F32(1), opset=29), ValueError, r"opset=29 is out of range.*up to 28"),
    (lambda: dq(np.uint8(1), F32(1), opset="21"), TypeError, r"opset must be an int"),
    # attributes a version lacks
    (lambda: q(X, F32(1), axis=0, opset=10), ValueError, r"QuantizeLinear-10 has no attribute 'axis'"),
    (lambda: q(X, F32(1), saturate=0, opset=13), ValueError, r"QuantizeLinear-13 has no attribute 'saturate'"),
    (lambda: q(X, np.ones((2, 3, 2), F32), block_size=2, opset=19), ValueError, r"QuantizeLinear-19 has no attribute 'block_size'"),
    (lambda: q(X, F32(1), output_dtype="int8", opset=19), ValueError, r"QuantizeLinear-19 has no attribute 'output_dtype'"),
    (lambda: q(X, F32(1), precision="float16", opset=22), ValueError, r"QuantizeLinear-21 has no attribute 'precision'"),
    (lambda: dq(np.uint8(1), F32(1), output_dtype="float16", opset=21), ValueError, r"DequantizeLinear-21 has no attribute 'output_dtype'"),
    (lambda: dq(np.ones((4, 4), np.uint8), np.ones((4, 2), F32), block_size=2, opset=19), ValueError, r"DequantizeLinear-19 has no attribute 'block_size'"),
    # types a version lacks
    (lambda: q(X.astype(np.float64), F32(1)), TypeError, r"x has dtype float64; QuantizeLinear-28 accepts float, float16, bfloat16, int32"),
    (lambda: q(X.astype(np.float16), F32(1), opset=13), TypeError, r"x has dtype float16; QuantizeLinear-13 accepts float, int32"),
    (lambda: q(X, np.float16(1), opset=19), TypeError, r"QuantizeLinear-19 requires y_scale to have x's type \(float\)"),
    (lambda: q(X, np.float16(1), opset=13), TypeError, r"y_scale has dtype float16; QuantizeLinear-13 accepts float"),
    (lambda: q(X, np.float64(1)), TypeError, r"y_scale has dtype float64"),
    (lambda: q(X, np.array(1, ml_dtypes.float8_e8m0fnu), opset=23), TypeError, r"y_scale has dtype float8_e8m0fnu; QuantizeLinear-23"),
    (lambda: q(X, F32(1), np.array(0, ml_dtypes.int4), opset=19), TypeError, r"y_zero_point has dtype int4; its type is the output type"),
    (lambda: q(X, F32(1), output_dtype="int2", opset=24), ValueError, r"QuantizeLinear-24 cannot output int2"),
    (lambda: q(X, F32(1), output_dtype="float6e2m3", opset=25), ValueError, r"QuantizeLinear-25 cannot output float6e2m3"),
    (lambda: q(X, F32(1), output_dtype="float", opset=25), ValueError, r"cannot output float"),
    (lambda: dq(np.int16(1), F32(1), opset=19), TypeError, r"x has dtype int16; DequantizeLinear-19 accepts"),
    (lambda: dq(np.array(1, ml_dtypes.float4_e2m1fn), F32(1), opset=21), TypeError, r"x has dtype float4_e2m1fn; DequantizeLinear-21"),
    (lambda: dq(np.array(1, ml_dtypes.int2), F32(1), opset=24), TypeError, r"x has dtype int2; DequantizeLinear-24"),
    (lambda: dq(np.array(1, ml_dtypes.float6_e3m2fn), F32(1), opset=25), TypeError, r"x has dtype float6_e3m2fn; DequantizeLinear-25"),
    (lambda: dq(np.uint8(1), np.float16(1), opset=13), TypeError, r"x_scale has dtype float16; DequantizeLinear-13 accepts float"),
    (lambda: dq(np.uint8(1), np.array(1, ml_dtypes.float8_e8m0fnu), opset=23), TypeError, r"x_scale has dtype float8_e8m0fnu"),
    (lambda: dq(np.uint8(1), np.array(1, ml_dtypes.float8_e8m0fnu)), ValueError, r"defaults to x_scale's type \(float8e8m0\).*set output_dtype"),
    (lambda: dq(np.uint8(1), F32(1), output_dtype="int8"), ValueError, r"output_dtype must be one of float, float16, bfloat16, got int8"),
    (lambda: dq([1, 2], F32(1)), TypeError, r"x must be an array with a dtype"),
    (lambda: dq(np.float32(1), F32(1)), TypeError, r"x has dtype float32; DequantizeLinear-28 accepts"),
    # zero points
    (lambda: q(X, F32(1), 3), TypeError, r"y_zero_point's dtype sets the output type, but 3 has none"),
    (lambda: q(X, F32(1), np.float32(0)), TypeError, r"y_zero_point has dtype float32; its type is the output type"),
    (lambda: q(X, F32(1), np.int8(0), output_dtype="uint8"), ValueError, r"output_dtype \(uint8\) must equal y_zero_point's type \(int8\)"),
    (lambda: q(X, F32(1), 300, output_dtype="uint8"), ValueError, r"y_zero_point must lie in \[0, 255\] for type uint8"),
    (lambda: q(X, F32(1), 1.5, output_dtype="int8"), ValueError, r"y_zero_point must hold integers for type int8"),
    (lambda: dq(np.uint8(1), F32(1), np.int8(0)), TypeError, r"x_zero_point must have x's type \(uint8\), got int8"),
    (lambda: dq(np.uint8(1), F32(1), 256), ValueError, r"x_zero_point must lie in \[0, 255\]"),
    # dtype arguments
    (lambda: q(X, F32(1), output_dtype="int3"), ValueError, r"output_dtype='int3' is not a type name qlinear knows"),
    (lambda: q(X, F32(1), output_dtype=99), ValueError, r"output_dtype=99 is not a TensorProto type number"),
    (lambda: q(X, F32(1), output_dtype=[1]), TypeError, r"output_dtype must be a dtype, a type name or a TensorProto number"),
    (lambda: q(X, F32(1), precision="int8"), ValueError, r"precision must be a float type"),
    (lambda: q(X, F32(1), saturate=2), ValueError, r"saturate must be 0 or 1, got 2"),
    # granularity and shapes
    (lambda: q(X, np.ones(3, F32), np.zeros(4, np.uint8)), ValueError, r"y_zero_point must have the same shape as y_scale, got \(4,\) and \(3,\)"),
    (lambda: q(X, np.ones(4, F32)), ValueError, r"per-axis quantization needs a 1-D y_scale of length x.shape\[1\] = 3, got length 4"),
    (lambda: q(X, np.ones(3, F32), axis=3), ValueError, r"axis=3 is out of range for x of rank 3 \(the accepted range is \[-r, r-1\] = \[-3, 2\]\)"),
    (lambda: q(np.ones(4, F32), np.ones(4, F32)), ValueError, r"axis=1 is out of range for x of rank 1"),
    (lambda: q(X, np.ones(3, F32), axis=1.0), TypeError, r"axis must be an int"),
    (lambda: q(X, np.ones(3, F32), opset=10), ValueError, r"QuantizeLinear-10 supports only per-tensor quantization; y_scale of shape \(3,\) asks for per-axis"),
    (lambda: q(X, np.ones(2, F32), opset=10), ValueError, r"QuantizeLinear-10 supports only per-tensor quantization"),
    (lambda: dq(np.ones((2, 3), np.uint8), np.ones((2, 3), F32), opset=13), ValueError, r"DequantizeLinear-13 needs a scalar or 1-D x_scale"),
    (lambda: q(F32(1), np.ones(3, F32)), ValueError, r"x is a scalar, so y_scale must be a scalar too"),
    (lambda: q(X, np.ones((2, 3, 2), F32)), ValueError, r"a y_scale of rank 3 means blocked quantization, which needs block_size > 0"),
    (lambda: q(X, np.ones((2, 3, 2), F32), block_size=-1), ValueError, r"block_size must be 0 \(no blocking\) or a positive integer, got -1"),
    (lambda: q(X, np.ones((2, 3, 2), F32), block_size=2.0), TypeError, r"block_size must be an int"),
    (lambda: q(X, F32(1), block_size=2), ValueError, r"blocked quantization \(block_size=2\) needs y_scale of the same rank as x \(3\), got shape \(\)"),
    (lambda: q(X, np.ones((2, 3, 3), F32), axis=2, block_size=2), ValueError, r"needs y_scale.shape\[2\] == ceil\(x.shape\[2\] / block_size\) = ceil\(4 / 2\) = 2, got 3"),
    (lambda: q(X, np.ones((2, 2, 2), F32), axis=2, block_size=2), ValueError, r"needs y_scale.shape to equal x.shape \(2, 3, 4\) except on axis 2, got \(2, 2, 2\) \(dimension 1 differs\)"),
    (lambda: q(np.ones((10, 2), F32), np.ones((3, 2), F32), axis=0, block_size=5), ValueError, r"ceil\(10 / 5\) = 2, got 3"),
    (lambda: dq(np.ones((4, 4), np.uint8), np.ones((4, 2), F32), np.zeros((4, 3), np.uint8), axis=1, block_size=2), ValueError, r"x_zero_point must have the same shape as x_scale"),
])
def test_invalid_input_is_rejected_with_a_clear_error(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_blocked_with_axis_out_of_range():
    with pytest.raises(ValueError, match=r"axis=-4 is out of range for x of rank 3"):
        q(X, np.ones((2, 3, 2), F32), axis=-4, block_size=2)


@pytest.mark.parametrize("call, error, match", [
    (lambda: qlinear.pack(np.zeros(3, np.uint8)), ValueError, r"pack: array's dtype must be a 2-, 4- or 6-bit type .* got uint8"),
    (lambda: qlinear.pack([1, 2]), TypeError, r"pack: array must be a NumPy array"),
    (lambda: qlinear.unpack(np.zeros(2, np.uint8), "int8", (3,)), ValueError, r"unpack: dtype must be a 2-, 4- or 6-bit type"),
    (lambda: qlinear.unpack(np.zeros(3, np.uint8), "int4", (3,)), ValueError, r"3 elements of int4 take ceil\(3 \* 4 / 8\) = 2 bytes, got 3"),
    (lambda: qlinear.unpack(np.zeros(2, np.int8), "int4", (3,)), TypeError, r"data must be a uint8 array"),
    (lambda: qlinear.unpack(np.zeros(2, np.uint8), "int4", (-1, 3)), ValueError, r"shape must not have negative dimensions"),
    (lambda: qlinear.unpack(np.zeros(2, np.uint8), "int4", "abc"), TypeError, r"shape must be a tuple of ints"),
])
def test_packing_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


# out=: every rule, for both operators
_X_VIEW_OUT = np.zeros(24, F32)  # x, and an out of uint8 that is a view of its bytes
_SHARED = np.zeros(9, F32)  # a dequantize out and a per-axis scale sharing one element
_SHARED_U8 = np.zeros(24, np.uint8)  # a quantize out and a per-axis zero point in the same memory
U8 = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)


def _read_only(shape, dtype):
    a = np.empty(shape, dtype)
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("call, error, match", [
    (lambda: q(X, F32(1), out=[0] * 24), TypeError, r"quantize_linear: out must be a numpy.ndarray, got list"),
    (lambda: q(X, F32(1), out=np.uint8(0)), TypeError, r"out must be a numpy.ndarray, got uint8"),
    (lambda: q(X, F32(1), out=np.empty(24, np.uint8)), ValueError,
     r"quantize_linear: out must have the result's shape \(2, 3, 4\), got shape \(24,\)"),
    (lambda: q(X, F32(1), out=np.empty((2, 3, 4), np.int8)), TypeError,
     r"quantize_linear: out must have the result's dtype uint8, got dtype int8 \(the output type is y_zero_point's "
     r"dtype, else output_dtype, else uint8\)"),
    (lambda: q(X, F32(1), output_dtype="int4", out=np.empty((2, 3, 4), np.int8)), TypeError,
     r"out must have the result's dtype int4, got dtype int8"),
    (lambda: q(X, F32(1), output_dtype="float8e4m3fn", out=np.empty((2, 3, 4), ml_dtypes.float8_e5m2)), TypeError,
     r"out must have the result's dtype float8_e4m3fn, got dtype float8_e5m2"),
    (lambda: q(X, F32(1), out=_read_only((2, 3, 4), np.uint8)), ValueError,
     r"quantize_linear: out must be writeable, got a read-only array"),
    (lambda: q(_X_VIEW_OUT, F32(1), out=_X_VIEW_OUT.view(np.uint8)[::4]), ValueError,
     r"quantize_linear: out must not share memory with x"),
    (lambda: q(X, np.ones(3, F32), _SHARED_U8[:3], out=_SHARED_U8.reshape(2, 3, 4)), ValueError,
     r"quantize_linear: out must not share memory with y_zero_point"),
    (lambda: dq(U8, F32(1), out=np.empty((2, 3, 4), np.float16)), TypeError,
     r"dequantize_linear: out must have the result's dtype float32, got dtype float16 \(the output type is "
     r"output_dtype, else x_scale's type\)"),
    (lambda: dq(U8, F32(1), out=np.empty((2, 3), np.float32)), ValueError,
     r"dequantize_linear: out must have the result's shape \(2, 3, 4\), got shape \(2, 3\)"),
    (lambda: dq(U8, F32(1), out=_read_only((2, 3, 4), np.float32)), ValueError, r"out must be writeable"),
    (lambda: dq(U8, F32(1), out=(1, 2)), TypeError, r"dequantize_linear: out must be a numpy.ndarray, got tuple"),
    (lambda: dq(np.zeros(5, np.uint8), _SHARED[:5], axis=0, out=_SHARED[4:]), ValueError,
     r"dequantize_linear: out must not share memory with x_scale"),
    (lambda: dq(_SHARED.view(np.uint8)[:4], F32(1), out=_SHARED[:4]), ValueError,
     r"dequantize_linear: out must not share memory with x"),
])
def test_out_is_checked(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_out_beside_x_in_one_buffer_is_allowed():
    """Only memory both arrays touch counts: interleaved elements of one buffer do not overlap."""
    buffer = np.arange(24, dtype=F32)
    x, out = buffer[::2], buffer.view(np.int16)[2::4]  # out: the first half of each odd float32
    expected = q(x.copy(), F32(0.5), output_dtype="int16")
    assert q(x, F32(0.5), output_dtype="int16", out=out) is out
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(x, np.arange(0, 24, 2, dtype=F32))
