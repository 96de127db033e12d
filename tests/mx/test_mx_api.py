"""qlinear.mx: the public API's shapes, axes, input types and errors (the values themselves are
checked against exact transcriptions and peers in the other files of this folder)."""

import doctest

import ml_dtypes
import numpy as np
import pytest

import qlinear
import qlinear.mx as mx

MX_NAMES = [name for name in mx.FORMATS if name != "nvfp4"]


def test_module_examples():
    failed, attempted = doctest.testmod(mx, optionflags=doctest.ELLIPSIS)
    assert attempted > 0 and failed == 0


def test_reachable_from_the_package():
    assert qlinear.mx is mx


@pytest.mark.parametrize("name", MX_NAMES)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_shapes_and_axes(name, axis):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((40, 70, 3)).astype(np.float32)
    codes, scales = mx.quantize(x, name, axis=axis)
    assert codes.shape == x.shape
    assert codes.dtype == mx.FORMATS[name].element.dtype
    expected = list(x.shape)
    expected[axis] = -(-x.shape[axis] // 32)
    assert scales.shape == tuple(expected) and scales.dtype == np.dtype(ml_dtypes.float8_e8m0fnu)
    # Blocking along an axis is blocking along the last axis of the moved array.
    last_codes, last_scales = mx.quantize(np.moveaxis(x, axis, -1), name)
    np.testing.assert_array_equal(np.moveaxis(codes, axis, -1).view(np.uint8), last_codes.view(np.uint8))
    np.testing.assert_array_equal(np.moveaxis(scales, axis, -1).view(np.uint8), last_scales.view(np.uint8))
    y = mx.dequantize(codes, scales, axis=axis)
    assert y.dtype == np.float32 and y.shape == x.shape


def test_nvfp4_shapes():
    x = np.random.default_rng(2).standard_normal((5, 40)).astype(np.float32)
    codes, block_scales, g = mx.quantize(x, "nvfp4", axis=1)
    assert codes.dtype == np.dtype(ml_dtypes.float4_e2m1fn) and codes.shape == x.shape
    assert block_scales.dtype == np.dtype(ml_dtypes.float8_e4m3fn) and block_scales.shape == (5, 3)
    assert g.shape == () and g.dtype == np.float32
    assert g == np.float32(np.abs(x).max() / np.float32(2688))
    y = mx.dequantize(codes, block_scales, axis=1, global_scale=g)
    assert y.shape == x.shape


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_narrow_inputs_widen_exactly(dtype):
    x = np.random.default_rng(3).standard_normal((3, 64)).astype(dtype)
    for name in MX_NAMES:
        a = mx.quantize(x, name)
        b = mx.quantize(x.astype(np.float32), name)
        for u, v in zip(a, b):
            np.testing.assert_array_equal(u.view(np.uint8), v.view(np.uint8))


def test_float64_is_rounded_to_float32_first():
    x = np.random.default_rng(4).standard_normal((2, 64))
    for u, v in zip(mx.quantize(x, "mxfp4"), mx.quantize(x.astype(np.float32), "mxfp4")):
        np.testing.assert_array_equal(u.view(np.uint8), v.view(np.uint8))


def test_mx_values_survive_a_round_trip():
    # Values that are already MXFP4 values come back unchanged (the floor rule picks their scale back).
    rng = np.random.default_rng(5)
    x = rng.standard_normal((8, 64)).astype(np.float32)
    codes, scales = mx.quantize(x, "mxfp4")
    y = mx.dequantize(codes, scales)
    codes2, scales2 = mx.quantize(y, "mxfp4")
    np.testing.assert_array_equal(mx.dequantize(codes2, scales2), y)


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda x: mx.quantize(x, "mxfp5"), ValueError, "fmt='mxfp5'"),
        (lambda x: mx.quantize(x, 4), TypeError, "fmt must be"),
        (lambda x: mx.quantize(x, "mxfp4", scale_rule="round"), ValueError, "scale_rule must be one of"),
        (lambda x: mx.quantize(x, "nvfp4", scale_rule="floor"), ValueError, "one of modelopt, got 'floor'"),
        (lambda x: mx.quantize(x, "mxfp4", axis=2), ValueError, "axis=2 is out of range"),
        (lambda x: mx.quantize(x, "mxfp4", axis=1.0), TypeError, "axis must be an int"),
        (lambda x: mx.quantize(x.astype(np.int32), "mxfp4"), TypeError, "x must be float32"),
        (lambda x: mx.quantize(np.float32(1), "mxfp4"), ValueError, "at least one dimension"),
        (lambda x: mx.quantize(x, "mxfp4", global_scale=np.float32(1)), ValueError, "mxfp4 takes none"),
        (lambda x: mx.quantize(x, "nvfp4", global_scale=0.5), TypeError, "global_scale must be one float32 value"),
        (lambda x: mx.quantize(x, "nvfp4", global_scale=np.ones(2, np.float32)), TypeError, "one float32 value"),
        (lambda x: mx.quantize(x, "nvfp4", global_scale=np.float32(0)), ValueError, "positive and finite"),
        (lambda x: mx.quantize(x, "nvfp4", global_scale=np.float32(-1)), ValueError, "positive and finite"),
        (lambda x: mx.quantize(x, "nvfp4", global_scale=np.float32(np.inf)), ValueError, "positive and finite"),
        (lambda x: mx.quantize(x, "nvfp4", global_scale=np.float32(np.nan)), ValueError, "positive and finite"),
    ],
)
def test_quantize_errors(call, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(")):
        call(np.ones((2, 64), np.float32))


def test_dequantize_errors():
    x = np.ones((2, 64), np.float32)
    codes, scales = mx.quantize(x, "mxfp4")
    with pytest.raises(ValueError, match=r"need \(2, 2\)"):
        mx.dequantize(codes, scales[:, :1])
    with pytest.raises(TypeError, match="scales must be float8_e8m0fnu"):
        mx.dequantize(codes, scales.astype(np.float32))
    with pytest.raises(TypeError, match="no MX element type"):
        mx.dequantize(codes.astype(np.float32), scales)
    with pytest.raises(ValueError, match="global_scale is NVFP4's"):
        mx.dequantize(codes, scales, global_scale=np.float32(1))
    nv_codes, nv_scales, g = mx.quantize(x, "nvfp4")
    with pytest.raises(ValueError, match="need global_scale"):
        mx.dequantize(nv_codes, nv_scales)
    with pytest.raises(TypeError, match="global_scale must be one float32"):
        mx.dequantize(nv_codes, nv_scales, global_scale=1.0)
    with pytest.raises(TypeError, match="NVFP4's, whose codes are float4_e2m1fn"):
        mx.dequantize(nv_codes.astype(ml_dtypes.float8_e4m3fn), nv_scales, global_scale=g)


def test_onnx_scales_folds_mxint8_and_refuses_what_e8m0_cannot_hold():
    x = np.random.default_rng(6).standard_normal((2, 64)).astype(np.float32)
    codes, scales = mx.quantize(x, "mxint8")
    onnx_codes, onnx_scales = mx.onnx_scales(codes, scales, "mxint8")
    assert (onnx_scales.view(np.uint8).astype(int) == scales.view(np.uint8).astype(int) - 6).all()
    # code * 2^(e-6) is the MX value code * 2^-6 * 2^e.
    folded = onnx_codes.astype(np.float64) * np.repeat(onnx_scales.astype(np.float64), 32, axis=-1)
    np.testing.assert_array_equal(folded.astype(np.float32), mx.dequantize(codes, scales))
    tiny = np.full((1, 32), 2.0**-125, np.float32)
    with pytest.raises(ValueError, match="1 MXINT8 block"):
        mx.onnx_scales(*mx.quantize(tiny, "mxint8"), "mxint8")
    same = mx.onnx_scales(*mx.quantize(x, "mxfp4"), "mxfp4")
    assert same[1].dtype == np.dtype(ml_dtypes.float8_e8m0fnu)
