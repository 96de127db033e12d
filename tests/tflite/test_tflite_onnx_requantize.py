"""QLinearConv / QLinearMatMul with ``requantize="tflite" | "tflite-single" | "xnnpack"`` (and an ONNX model run with
those modes) against the LiteRT interpreter running the same layer as a one-operator CONV_2D.

The layers are tie-heavy: power-of-two multipliers and small accumulators put many products exactly halfway,
where TFLite's reference kernels (two roundings, half up then half away), XNNPACK (half to even) and the onnx
reference differ; each test also checks that its case tells the modes apart.
"""

from __future__ import annotations

import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as schema

import qlinear
from qlinear.reference import requantize

from .litert_models import Runner, Tensor, build_model
from .test_tflite_requantize import fraction_mbqm, fraction_quantize_multiplier

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

import qlinear.onnx as qonnx  # noqa: E402

F32 = np.float32


def _conv_model(x_shape, x_dtype, x_scale, x_zp, w, w_scale, w_zp, bias, y_shape, y_scale, y_zp, padding):
    options = schema.Conv2DOptionsT()
    options.padding = schema.Padding.SAME if padding == "SAME" else schema.Padding.VALID
    options.strideH = options.strideW = options.dilationHFactor = options.dilationWFactor = 1
    channels = w.shape[0]
    w_scales = np.broadcast_to(np.asarray(w_scale, F32), (channels,)) if np.ndim(w_scale) else w_scale
    bias_scale = (F32(x_scale) * np.asarray(w_scales, F32)).tolist() if np.ndim(w_scales) else float(F32(x_scale) * F32(w_scale))
    per_channel = np.ndim(w_scales) > 0
    return build_model(
        "CONV_2D",
        [Tensor(x_shape, x_dtype, x_scale, x_zp),
         Tensor(w.shape, w.dtype, list(map(float, w_scales)) if per_channel else float(w_scale),
                [int(w_zp)] * channels if per_channel else int(w_zp), 0, data=w),
         Tensor(bias.shape, "int32", bias_scale, [0] * channels if per_channel else 0, 0, data=bias)],
        [Tensor(y_shape, x_dtype, y_scale, y_zp)], options=options, version=3)


def _tie_heavy_int8_layer(rng):
    """int8 x and per-channel int8 weights whose multipliers x_scale * w_scale / y_scale are 2^-1 .. 2^-4."""
    x = rng.integers(-6, 7, (1, 6, 6, 4), dtype=np.int8)
    w = rng.integers(-3, 4, (8, 3, 3, 4), dtype=np.int8)
    bias = rng.integers(-8, 9, 8).astype(np.int32)
    w_scale = (2.0 ** -(np.arange(8) % 4 + 1)).astype(F32)  # 2^-1 .. 2^-4, cycled
    return x, w, bias, F32(0.5), -2, w_scale, F32(0.5), 3


def _onnx_conv(x, w, bias, x_scale, x_zp, w_scale, w_zp, y_scale, y_zp, mode):
    """qlinear_conv on the NCHW / OIHW views of the NHWC / OHWI tensors, back to NHWC."""
    channels = w.shape[0]
    w_scale = np.asarray(w_scale, F32)
    y = qlinear.qlinear_conv(x.transpose(0, 3, 1, 2), F32(x_scale), np.asarray(x_zp, x.dtype),
                             w.transpose(0, 3, 1, 2), w_scale,
                             np.full(channels, w_zp, w.dtype) if w_scale.ndim else np.asarray(w_zp, w.dtype),
                             F32(y_scale), np.asarray(y_zp, x.dtype), bias, auto_pad="SAME_UPPER", requantize=mode)
    return y.transpose(0, 2, 3, 1)


def test_qlinear_conv_tflite_and_xnnpack_modes_equal_the_interpreter():
    x, w, bias, x_scale, x_zp, w_scale, y_scale, y_zp = _tie_heavy_int8_layer(np.random.default_rng(5))
    model = _conv_model(x.shape, "int8", x_scale, x_zp, w, w_scale, 0, bias, x.shape[:3] + (8,), y_scale, y_zp, "SAME")
    reference = Runner(model, "reference")(x)
    auto = Runner(model, "xnnpack")
    delegated = auto(x)
    assert auto.delegated
    ours = {mode: _onnx_conv(x, w, bias, x_scale, x_zp, w_scale, 0, y_scale, y_zp, mode)
            for mode in ("tflite", "xnnpack", "float32", "float64", "tflite-single")}
    np.testing.assert_array_equal(ours["tflite"], reference, strict=True)
    np.testing.assert_array_equal(ours["xnnpack"], delegated, strict=True)
    np.testing.assert_array_equal(ours["xnnpack"], ours["float32"], strict=True)
    # the case tells the arithmetics apart: halfway products round differently
    assert np.count_nonzero(ours["tflite"] != ours["xnnpack"]) > 20
    assert np.count_nonzero(ours["tflite"] != ours["float64"]) > 20
    # single rounding (a build flag no wheel uses): the exact Fraction transcription of QuantizeMultiplier and
    # the one-rounding MultiplyByQuantizedMultiplier, on the exact accumulator
    acc = qlinear.conv_integer(x.transpose(0, 3, 1, 2), w.transpose(0, 3, 1, 2), np.int8(x_zp), np.int8(0),
                               auto_pad="SAME_UPPER").transpose(0, 2, 3, 1).astype(np.int64) + bias
    fixed = [fraction_quantize_multiplier(float(x_scale) * float(s) / float(y_scale), True) for s in w_scale]
    single = np.array([min(127, max(-128, fraction_mbqm(int(a), *fixed[c], single_rounding=True) + y_zp))
                       for (*_, c), a in np.ndenumerate(acc)], np.int8).reshape(acc.shape)
    np.testing.assert_array_equal(ours["tflite-single"], single, strict=True)
    assert np.count_nonzero(ours["tflite-single"] != ours["tflite"]) > 0


def test_qlinear_conv_tflite_mode_uint8_takes_the_float32_scale_product():
    """uint8 x and weights (TFLite's uint8 CONV_2D, per-tensor, weight zero point allowed): the multiplier is
    double(float32(x_scale * w_scale)) / double(y_scale). The scales were searched for so that the double
    product (the int8 kernels') changes one output of this layer."""
    rng = np.random.default_rng(11)
    x = rng.integers(0, 256, (1, 32, 32, 16), dtype=np.uint8)
    w = rng.integers(0, 256, (32, 3, 3, 16), dtype=np.uint8)
    bias = np.zeros(32, np.int32)
    x_scale, w_scale, y_scale = F32(0.019566262), F32(0.028872795), F32(0.2589029)
    model = _conv_model(x.shape, "uint8", x_scale, 131, w, w_scale, 120, bias, x.shape[:3] + (32,), y_scale, 121, "SAME")
    reference = Runner(model, "reference")(x)
    ours = _onnx_conv(x, w, bias, x_scale, 131, w_scale, 120, y_scale, 121, "tflite")
    np.testing.assert_array_equal(ours, reference, strict=True)
    # the double product (what the int8 path takes) gives another output here
    double = requantize.requantize_multiplier(x_scale, w_scale, y_scale, "tflite", np.int8)
    acc = qlinear.conv_integer(x.transpose(0, 3, 1, 2), w.transpose(0, 3, 1, 2), np.uint8(131), np.uint8(120),
                               auto_pad="SAME_UPPER")
    other = requantize.requantize(acc, double, np.asarray(121, np.uint8), "tflite").transpose(0, 2, 3, 1)
    assert np.count_nonzero(other != reference) == 1


def test_qlinear_matmul_tflite_mode_equals_a_1x1_conv_in_the_interpreter():
    """QLinearMatMul (per-column b scales) is a 1x1 CONV_2D of a (1, 1, M, K) image with (N, 1, 1, K) weights."""
    rng = np.random.default_rng(7)
    a = rng.integers(-9, 10, (12, 16), dtype=np.int8)
    b = rng.integers(-5, 6, (16, 6), dtype=np.int8)
    b_scale = (2.0 ** -(np.arange(6) % 3 + 2)).astype(F32)
    a_scale, y_scale = F32(0.5), F32(0.25)
    w = np.ascontiguousarray(b.T).reshape(6, 1, 1, 16)
    model = _conv_model((1, 1, 12, 16), "int8", a_scale, 1, w, b_scale, 0, np.zeros(6, np.int32), (1, 1, 12, 6),
                        y_scale, -4, "VALID")
    reference = Runner(model, "reference")(a.reshape(1, 1, 12, 16)).reshape(12, 6)
    ours = {mode: qlinear.qlinear_matmul(a, a_scale, np.int8(1), b, b_scale, np.zeros(6, np.int8), y_scale, np.int8(-4),
                                         requantize=mode) for mode in ("tflite", "float64")}
    np.testing.assert_array_equal(ours["tflite"], reference, strict=True)
    assert np.count_nonzero(ours["tflite"] != ours["float64"]) > 5


def test_onnx_model_run_with_tflite_modes_equals_the_interpreter():
    """The same layer as an ONNX QLinearConv model, run by qlinear.onnx.run with each mode."""
    x, w, bias, x_scale, x_zp, w_scale, y_scale, y_zp = _tie_heavy_int8_layer(np.random.default_rng(9))
    tfl = _conv_model(x.shape, "int8", x_scale, x_zp, w, w_scale, 0, bias, x.shape[:3] + (8,), y_scale, y_zp, "SAME")
    inits = [
        helper.make_tensor("xs", TensorProto.FLOAT, [], [float(x_scale)]),
        helper.make_tensor("xz", TensorProto.INT8, [], [x_zp]),
        helper.make_tensor("w", TensorProto.INT8, [8, 4, 3, 3], w.transpose(0, 3, 1, 2).reshape(-1).tolist()),
        helper.make_tensor("ws", TensorProto.FLOAT, [8], w_scale.tolist()),
        helper.make_tensor("wz", TensorProto.INT8, [8], [0] * 8),
        helper.make_tensor("ys", TensorProto.FLOAT, [], [float(y_scale)]),
        helper.make_tensor("yz", TensorProto.INT8, [], [y_zp]),
        helper.make_tensor("b", TensorProto.INT32, [8], bias.tolist()),
    ]
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"],
                            auto_pad="SAME_UPPER")
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TensorProto.INT8, [1, 4, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.INT8, [1, 8, 6, 6])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    nchw = x.transpose(0, 3, 1, 2).copy()
    for mode, kernel in (("tflite", "reference"), ("xnnpack", "xnnpack")):
        y = qonnx.run(model, {"x": nchw}, requantize=mode)["y"].transpose(0, 2, 3, 1)
        np.testing.assert_array_equal(y, Runner(tfl, kernel)(x), strict=True)


def test_qlinear_conv_tflite_mode_adds_the_zero_point_in_int32_as_the_interpreter():
    """The scaled accumulator plus the output zero point is an int32 addition in TFLite, which wraps. uint8, a
    multiplier just below 1 (x_scale * w_scale / y_scale = 1 - 2^-24: M = 2^31 - 128, no shift) and a bias near
    INT32_MAX put the scaled value within 200 of INT32_MAX; the zero point 200 carries channel 0 past it, to
    a large negative value clamped to 0, where a wider addition would saturate at 255."""
    channels = 4
    x = np.zeros((1, 2, 2, 1), np.uint8)  # x at its zero point: the accumulator is the bias
    w = np.ones((channels, 1, 1, 1), np.uint8)
    top = np.iinfo(np.int32).max
    bias = np.array([top, top - 100, top - 300, 1000], np.int32)
    x_scale, w_scale, y_scale, y_zp = F32(1.0), F32(1 - 2.0**-24), F32(1.0), 200
    model = _conv_model(x.shape, "uint8", x_scale, 0, w, w_scale, 0, bias, x.shape[:3] + (channels,), y_scale, y_zp,
                        "VALID")
    ours = _onnx_conv(x, w, bias, x_scale, 0, w_scale, 0, y_scale, y_zp, "tflite")
    for resolver in ("reference", "optimized"):
        np.testing.assert_array_equal(ours, Runner(model, resolver)(x), strict=True)
    assert ours[0, 0, 0, 0] == 0 and (ours[0, 0, 0, 1:] == 255).all()  # channel 0 wrapped
