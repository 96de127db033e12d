"""`io.sensitivity`: each quantized activation's effect alone on the model's outputs, with one switched model.

Oracles: the float model in onnxruntime (all switches off: the same bits), a model built here by hand with a single
QuantizeLinear -> DequantizeLinear pair (one switch on: the same bits), and the outputs' SQNR computed in NumPy
from those runs. The model amplifies one tensor 1000-fold into its output, so that tensor ranks first though its
own quantization error is no larger than the other's."""

from __future__ import annotations

import math

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from qlinear.io import sensitivity  # noqa: E402

D = 16


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(8)
    inits = [numpy_helper.from_array(rng.normal(0, 0.5, (D, D)).astype(np.float32), n) for n in ("w1", "w2")]
    inits.append(numpy_helper.from_array(np.float32(1000.0), "gain"))
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"], name="first"),
             helper.make_node("MatMul", ["x", "w2"], ["b"], name="second"),
             helper.make_node("Mul", ["a", "gain"], ["loud"], name="amplify"),
             helper.make_node("Add", ["loud", "b"], ["y"], name="sum")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, D])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, D])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


PARAMETERS = {"a": (np.float32(0.02), np.uint8(128)), "b": (np.float32(0.02), np.uint8(128))}


def _feeds():
    rng = np.random.default_rng(9)
    return [{"x": rng.normal(0, 1, (4, D)).astype(np.float32)} for _ in range(3)]


def _run(model, feeds):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)


def _one_pair(name: str) -> onnx.ModelProto:
    model = _model()
    scale, zero_point = PARAMETERS[name]
    model.graph.initializer.extend([numpy_helper.from_array(scale, "s"), numpy_helper.from_array(zero_point, "z")])
    for node in model.graph.node:
        node.input[:] = [f"{name}_dq" if i == name else i for i in node.input]
    model.graph.node.extend([helper.make_node("QuantizeLinear", [name, "s", "z"], [f"{name}_q"]),
                             helper.make_node("DequantizeLinear", [f"{name}_q", "s", "z"], [f"{name}_dq"])])
    return model


def test_each_switch_is_the_float_model_or_one_pair():
    switched, flags = sensitivity.switched_model(_model(), PARAMETERS)
    assert set(flags) == {"a", "b"}
    onnx.checker.check_model(switched, full_check=True)
    for feeds in _feeds():
        off = {flag: np.array(False) for flag in flags.values()}
        np.testing.assert_array_equal(_run(switched, {**feeds, **off})[0], _run(_model(), feeds)[0])
        for name, flag in flags.items():
            got = _run(switched, {**feeds, **off, flag: np.array(True)})[0]
            np.testing.assert_array_equal(got, _run(_one_pair(name), feeds)[0])


def test_the_amplified_tensor_costs_the_outputs_most():
    feeds = _feeds()
    found = sensitivity.output_sqnr(_model(), PARAMETERS, feeds)
    reference = [_run(_model(), f)[0].astype(np.float64) for f in feeds]
    for name in PARAMETERS:
        quantized = [_run(_one_pair(name), f)[0].astype(np.float64) for f in feeds]
        expected = 10 * math.log10(sum(np.sum(r ** 2) for r in reference)
                                   / sum(np.sum((q - r) ** 2) for q, r in zip(quantized, reference)))
        assert found[name] == pytest.approx(expected, abs=1e-9)
    assert found["a"] < found["b"] - 40  # 1000-fold amplification: 60 dB, less what b's own error adds


def test_a_tensor_that_changes_nothing_is_infinite():
    parameters = {"a": (np.float32(1.0), np.uint8(128))}  # an exact grid for nothing here, but ...
    model = _model()
    x = {"x": np.zeros((2, D), np.float32)}  # ... zero input: a is 0, exactly representable
    found = sensitivity.output_sqnr(model, parameters, [x])
    assert found["a"] == math.inf


def test_a_model_input_is_switched_before_every_node():
    parameters = {"x": (np.float32(0.05), np.uint8(128))}
    switched, flags = sensitivity.switched_model(_model(), parameters)
    onnx.checker.check_model(switched, full_check=True)  # sorted: the switch comes first
    by_hand = _model()
    by_hand.graph.initializer.extend([numpy_helper.from_array(np.float32(0.05), "s"),
                                      numpy_helper.from_array(np.uint8(128), "z")])
    for node in by_hand.graph.node:
        node.input[:] = ["x_dq" if i == "x" else i for i in node.input]
    by_hand.graph.node.insert(0, helper.make_node("DequantizeLinear", ["x_q", "s", "z"], ["x_dq"]))
    by_hand.graph.node.insert(0, helper.make_node("QuantizeLinear", ["x", "s", "z"], ["x_q"]))
    for feeds in _feeds():
        got = _run(switched, {**feeds, flags["x"]: np.array(True)})[0]
        np.testing.assert_array_equal(got, _run(by_hand, feeds)[0])
