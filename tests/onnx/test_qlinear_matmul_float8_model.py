"""qlinear.onnx.run on QLinearMatMul-21 nodes with float8 types (neither peer runs these; see
tests/ops/test_qlinear_matmul_float8.py for the oracles): the node equals qlinear_matmul, feeds and chains."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import qlinear.onnx as qonnx
from qlinear.ops.qlinear_matmul import qlinear_matmul

E4M3FN, E5M2 = np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)


def float8_model(b, y_zero_point):
    """a (float8_e4m3fn graph input) x b -> QLinearMatMul -> y, and y dequantized to float32."""
    inits = [numpy_helper.from_array(np.asarray(v), name) for name, v in (
        ("a_scale", np.float32(0.5)), ("a_zero_point", np.zeros((), E4M3FN)), ("b", b),
        ("b_scale", np.full(b.shape[-1], 1.0, np.float32)), ("b_zero_point", np.zeros(b.shape[-1], b.dtype)),
        ("y_scale", np.float32(0.25)), ("y_zero_point", y_zero_point), ("unit", np.float32(1.0)))]
    nodes = [
        helper.make_node("QLinearMatMul", ["a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point",
                                           "y_scale", "y_zero_point"], ["y"], name="mm"),
        helper.make_node("DequantizeLinear", ["y", "unit", "y_zero_point"], ["y_value"]),
    ]
    y_type = TensorProto.FLOAT8E4M3FN if y_zero_point.dtype == E4M3FN else TensorProto.UINT8
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT8E4M3FN, [None, 2])],
                              [helper.make_tensor_value_info("y", y_type, None),
                               helper.make_tensor_value_info("y_value", TensorProto.FLOAT, None)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("y_zero_point", [np.zeros((), E4M3FN), np.uint8(3)], ids=["e4m3fn", "u8"])
def test_float8_qlinear_matmul_node_runs(y_zero_point):
    a = np.array([[1.5, 2.0], [-0.25, 448.0]], E4M3FN)
    b = np.array([[0.5, 2.0**-16], [3.0, 57344.0]], E5M2)
    out = qonnx.run(float8_model(b, y_zero_point), {"a": a})
    expected = qlinear_matmul(a, np.float32(0.5), np.zeros((), E4M3FN), b, np.ones(2, np.float32),
                              np.zeros(2, E5M2), np.float32(0.25), y_zero_point)
    np.testing.assert_array_equal(out["y"].view(np.uint8), expected.view(np.uint8), strict=True)
    # (1.5 * 0.5 + 2 * 3) * 0.5 / 0.25 = 13.5: the tie goes to 14 (even) in e4m3fn; uint8: rint(13.5 + 3) = 16
    assert float(out["y"][0, 0]) == (14.0 if y_zero_point.dtype == E4M3FN else 16.0)
    np.testing.assert_array_equal(out["y_value"], expected.astype(np.float32) - np.float32(y_zero_point), strict=True)


def test_float8_qlinear_matmul_node_has_no_float32_requantization():
    model = float8_model(np.ones((2, 2), E5M2), np.zeros((), E4M3FN))
    with pytest.raises(ValueError, match=r"node 'mm' \(QLinearMatMul\): qlinear_matmul: requantize='float32' .* float8 a"):
        qonnx.run(model, {"a": np.ones((1, 2), E4M3FN)}, requantize="float32")
