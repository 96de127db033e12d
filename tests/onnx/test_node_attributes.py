"""Each op class maps node attributes and the model's opset to the qlinear function: one-node models over the
attributes and versions, bit-identical (bytes and dtype) to onnx's ReferenceEvaluator.

Cases avoid the reference's documented bugs (docs/semantics.md: blocked sizes it accepts wrongly, 1-D/3-D
per-channel convolutions, per-channel ConvInteger zero points outside 2-D, DequantizeLinear before 19)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from _onnx_models import run_reference
from onnx import TensorProto, helper, numpy_helper

import qlinear.onnx as qonnx

RNG = np.random.default_rng(2024)
X_FLOAT = RNG.normal(scale=3, size=(2, 4, 6)).astype(np.float32)
X_CONV_U8 = RNG.integers(0, 256, (2, 4, 9, 8)).astype(np.uint8)
X_CONV_S8 = RNG.integers(-128, 128, (1, 4, 7, 7)).astype(np.int8)
W_CONV = RNG.integers(-128, 128, (6, 2, 3, 3)).astype(np.int8)
W_CONV_FULL = RNG.integers(-128, 128, (6, 4, 3, 2)).astype(np.int8)
A_U8 = RNG.integers(0, 256, (3, 5, 7)).astype(np.uint8)
B_S8 = RNG.integers(-128, 128, (7, 4)).astype(np.int8)


def _model(op_type, x, initializers, attributes, opset, n_outputs=1):
    node = helper.make_node(op_type, ["x", *(name for name, _ in initializers)], [f"y{i}" for i in range(n_outputs)],
                            **attributes)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)],
        [helper.make_tensor_value_info(f"y{i}", 0, None) for i in range(n_outputs)],
        [numpy_helper.from_array(np.asarray(value), name) for name, value in initializers if value is not None],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def _empty(initializers):
    """Absent optional inputs as empty names (the node keeps its positions)."""
    return [(name if value is not None else "", value) for name, value in initializers]


CASES = {
    # QuantizeLinear: versions, granularities, output types, attributes
    "q10 per-tensor uint8": ("QuantizeLinear", X_FLOAT, [("s", np.float32(0.1)), ("z", np.uint8(100))], {}, 10),
    "q13 per-axis int8 (default axis 1)": ("QuantizeLinear", X_FLOAT, [("s", np.float32([0.1, 0.2, 0.3, 0.4])),
                                                                        ("z", np.int8([0, 1, -1, 5]))], {}, 13),
    "q13 per-axis axis=0": ("QuantizeLinear", X_FLOAT, [("s", np.float32([0.1, 0.2])), ("z", np.int8([0, 1]))],
                            {"axis": 0}, 13),
    "q13 axis=-1": ("QuantizeLinear", X_FLOAT, [("s", np.linspace(0.1, 0.6, 6, dtype=np.float32)),
                                                ("z", np.zeros(6, np.uint8))], {"axis": -1}, 13),
    "q19 float8e4m3fn saturate=0": ("QuantizeLinear", X_FLOAT, [("s", np.float32(0.01)),
                                                                ("z", np.zeros((), ml_dtypes.float8_e4m3fn))],
                                    {"saturate": 0}, 19),
    "q19 float8e5m2": ("QuantizeLinear", X_FLOAT, [("s", np.float32(0.01)), ("z", np.zeros((), ml_dtypes.float8_e5m2))],
                       {}, 19),
    "q21 blocked int4": ("QuantizeLinear", X_FLOAT, [("s", np.full((2, 2, 6), 0.5, np.float32)),
                                                     ("z", np.zeros((2, 2, 6), ml_dtypes.int4))],
                         {"axis": 1, "block_size": 2}, 21),
    "q21 output_dtype int8, no zero point": ("QuantizeLinear", X_FLOAT, [("s", np.float32(0.05))],
                                             {"output_dtype": TensorProto.INT8}, 21),
    "q21 output_dtype uint16": ("QuantizeLinear", X_FLOAT, [("s", np.float32(0.001))],
                                {"output_dtype": TensorProto.UINT16}, 21),
    "q23 float4e2m1": ("QuantizeLinear", X_FLOAT, [("s", np.float32(0.5)), ("z", np.zeros((), ml_dtypes.float4_e2m1fn))],
                       {}, 23),
    "q25 float16 scale, precision float": ("QuantizeLinear", X_FLOAT, [("s", np.float16(0.05)), ("z", np.int8(3))],
                                           {"precision": TensorProto.FLOAT}, 25),
    # DequantizeLinear (the reference has it from 19)
    "dq19 per-tensor uint8": ("DequantizeLinear", A_U8, [("s", np.float32(0.1)), ("z", np.uint8(100))], {}, 19),
    "dq19 per-axis axis=2": ("DequantizeLinear", A_U8, [("s", np.linspace(0.1, 0.7, 7, dtype=np.float32)),
                                                        ("z", np.arange(7, dtype=np.uint8))], {"axis": 2}, 19),
    "dq19 int32, no zero point": ("DequantizeLinear", RNG.integers(-2**31, 2**31 - 1, (3, 4)).astype(np.int32),
                                  [("s", np.float32(1e-3))], {}, 19),
    "dq21 blocked": ("DequantizeLinear", A_U8, [("s", RNG.uniform(0.1, 1, (3, 5, 2)).astype(np.float32)),
                                                ("z", RNG.integers(0, 256, (3, 5, 2)).astype(np.uint8))],
                     {"axis": 2, "block_size": 4}, 21),
    "dq21 float16 scale": ("DequantizeLinear", A_U8, [("s", np.float16(0.1)), ("z", np.uint8(7))], {}, 21),
    "dq23 output_dtype float16": ("DequantizeLinear", A_U8, [("s", np.float32(0.1)), ("z", np.uint8(7))],
                                  {"output_dtype": TensorProto.FLOAT16}, 23),
    # QLinearConv: geometry attributes, groups, per-channel weights, signed activations
    "qconv strides pads dilations group": (
        "QLinearConv", X_CONV_U8,
        [("xs", np.float32(0.02)), ("xz", np.uint8(120)), ("w", W_CONV), ("ws", RNG.uniform(0.001, 0.01, 6).astype(np.float32)),
         ("wz", np.zeros(6, np.int8)), ("ys", np.float32(0.1)), ("yz", np.uint8(128)),
         ("b", RNG.integers(-5000, 5000, 6).astype(np.int32))],
        {"strides": [2, 1], "pads": [1, 0, 0, 1], "dilations": [1, 2], "group": 2}, 10),
    "qconv SAME_UPPER stride 2, kernel_shape": (
        "QLinearConv", X_CONV_U8,
        [("xs", np.float32(0.02)), ("xz", np.uint8(120)), ("w", W_CONV_FULL), ("ws", np.float32(0.004)),
         ("wz", np.int8(0)), ("ys", np.float32(0.1)), ("yz", np.uint8(128))],
        {"auto_pad": "SAME_UPPER", "strides": [2, 2], "kernel_shape": [3, 2]}, 10),
    "qconv SAME_LOWER": (
        "QLinearConv", X_CONV_U8,
        [("xs", np.float32(0.02)), ("xz", np.uint8(120)), ("w", W_CONV_FULL), ("ws", np.float32(0.004)),
         ("wz", np.int8(0)), ("ys", np.float32(0.1)), ("yz", np.uint8(128))],
        {"auto_pad": "SAME_LOWER", "strides": [2, 3]}, 10),
    "qconv VALID, int8 activations": (
        "QLinearConv", X_CONV_S8,
        [("xs", np.float32(0.02)), ("xz", np.int8(-3)), ("w", W_CONV_FULL), ("ws", np.float32(0.004)),
         ("wz", np.int8(2)), ("ys", np.float32(0.2)), ("yz", np.int8(5))],
        {"auto_pad": "VALID"}, 10),
    # ConvInteger
    "convinteger zero points, group, dilation": (
        "ConvInteger", X_CONV_U8, [("w", W_CONV), ("xz", np.uint8(120)), ("wz", np.int8(-3))],
        {"group": 2, "dilations": [2, 1], "pads": [1, 1, 1, 1]}, 10),
    "convinteger no zero points": ("ConvInteger", X_CONV_U8, [("w", W_CONV_FULL)], {"strides": [1, 2]}, 10),
    # QLinearMatMul: versions and scale types
    "qmatmul10 batched": (
        "QLinearMatMul", A_U8, [("as", np.float32(0.02)), ("az", np.uint8(128)), ("b", B_S8), ("bs", np.float32(0.01)),
                                ("bz", np.int8(0)), ("ys", np.float32(0.05)), ("yz", np.uint8(100))], {}, 10),
    "qmatmul21 float16 scales, per-column b": (
        "QLinearMatMul", A_U8, [("as", np.float16(0.02)), ("az", np.uint8(128)), ("b", B_S8),
                                ("bs", RNG.uniform(0.005, 0.02, 4).astype(np.float16)), ("bz", np.zeros(4, np.int8)),
                                ("ys", np.float16(0.05)), ("yz", np.uint8(100))], {}, 21),
    "qmatmul21 bfloat16 scales": (
        "QLinearMatMul", A_U8, [("as", ml_dtypes.bfloat16(0.02)), ("az", np.uint8(128)), ("b", B_S8),
                                ("bs", ml_dtypes.bfloat16(0.01)), ("bz", np.int8(0)),
                                ("ys", ml_dtypes.bfloat16(0.05)), ("yz", np.uint8(100))], {}, 21),
    # MatMulInteger
    "matmulinteger per-column b zero point": ("MatMulInteger", A_U8, [("b", B_S8), ("az", np.uint8(7)),
                                                                       ("bz", np.int8([1, -2, 3, 0]))], {}, 10),
    "matmulinteger a zero point only": ("MatMulInteger", A_U8, [("b", B_S8), ("az", np.uint8(200))], {}, 10),
}


@pytest.mark.parametrize("case", list(CASES))
def test_node_equals_onnx_reference(case):
    op_type, x, initializers, attributes, opset = CASES[case]
    model = _model(op_type, x, _empty(initializers), attributes, opset)
    (expected,) = run_reference(model, {"x": x})
    ours = qonnx.run(model, {"x": x})["y0"]
    assert ours.dtype == expected.dtype and ours.shape == expected.shape
    np.testing.assert_array_equal(np.ascontiguousarray(ours).view(np.uint8), np.ascontiguousarray(expected).view(np.uint8))


def test_dynamic_quantize_linear_node_equals_onnx_reference():
    model = _model("DynamicQuantizeLinear", X_FLOAT, [], {}, 11, n_outputs=3)
    expected = run_reference(model, {"x": X_FLOAT})
    ours = qonnx.run(model, {"x": X_FLOAT})
    for value, reference in zip(ours.values(), expected):
        np.testing.assert_array_equal(value, np.asarray(reference), strict=True)


def test_optional_inputs_left_empty():
    """A node may leave an optional input in the middle absent (""): ConvInteger's x_zero_point before w_zero_point."""
    model = _model("ConvInteger", X_CONV_U8, [("w", W_CONV_FULL), ("", None), ("wz", np.int8(4))], {}, 10)
    (expected,) = run_reference(model, {"x": X_CONV_U8})
    np.testing.assert_array_equal(qonnx.run(model, {"x": X_CONV_U8})["y0"], expected, strict=True)
