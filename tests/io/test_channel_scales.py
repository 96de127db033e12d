"""AWQ's channel scales in the float graph (`qlinear.io.formats.onnx_channel_scales`): the division of a layer's
input folded into the node that writes it, through the operators that commute with a per-channel scale, and
nowhere else. The oracle is onnxruntime running the float model before and after (the consumer's weight
multiplied by the scales, as AWQ's codes round it): the outputs agree to float rounding."""

from __future__ import annotations

import numpy as np
import pytest

from qlinear.io.formats import onnx_channel_scales as cs

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

C = 6


def _editor(model):
    by_name = {t.name: t for t in model.graph.initializer}

    def read(name):
        return numpy_helper.to_array(by_name[name]) if name in by_name else None

    def write(name, array):
        if name in by_name:
            by_name[name].CopyFrom(numpy_helper.from_array(array, name))
        else:
            model.graph.initializer.append(numpy_helper.from_array(array, name))
            by_name[name] = model.graph.initializer[-1]

    return read, write


def _conv_model(middle, rng, extra_outputs=()):
    """x [1, 3, 8, 8] -> conv1 (C channels, bias) -> ``middle`` nodes (from "c1" to "m") -> conv2 -> y."""
    inits = [numpy_helper.from_array(rng.standard_normal((C, 3, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal(C).astype(np.float32), "b1"),
             numpy_helper.from_array(rng.standard_normal((4, C, 3, 3)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.standard_normal((C, 1, 1)).astype(np.float32), "shift"),
             numpy_helper.from_array(np.float32(1.5), "half"),
             numpy_helper.from_array(np.float32(-0.75), "factor"),
             numpy_helper.from_array(rng.uniform(0.1, 0.3, (C, 1, 1)).astype(np.float32), "slope")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]), *middle,
             helper.make_node("Conv", ["m", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1])]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("y", *extra_outputs)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model, x):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]


CHAINS = {
    "relu": [helper.make_node("Relu", ["c1"], ["m"])],
    "add, leaky relu, max pool": [helper.make_node("Add", ["c1", "shift"], ["a"]),
                                  helper.make_node("LeakyRelu", ["a"], ["l"], alpha=0.1),
                                  helper.make_node("MaxPool", ["l"], ["m"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
    "scalar add, prelu, mul": [helper.make_node("Add", ["half", "c1"], ["a"]),
                               helper.make_node("PRelu", ["a", "slope"], ["p"]),
                               helper.make_node("Mul", ["p", "factor"], ["m"])],
    "average pool": [helper.make_node("AveragePool", ["c1"], ["m"], kernel_shape=[2, 2], strides=[1, 1],
                                      pads=[0, 0, 1, 1])],
}


@pytest.mark.parametrize("chain", list(CHAINS))
def test_a_division_folded_into_the_writer_computes_what_the_model_did(chain):
    rng = np.random.default_rng(3)
    model = _conv_model(CHAINS[chain], rng)
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    before = _run(model, x)
    read, write = _editor(model)
    writer = cs.writer_of(model.graph, model.graph.node[-1], read)
    assert writer is not None and writer.node.name == "conv1" and writer.weight == "w1" and writer.axis == 0
    assert writer.tensors[0] == "m" and writer.tensors[-1] == "c1"
    scales = rng.uniform(0.25, 4.0, C)
    original = read("w1")
    write("w2", (read("w2") * scales[None, :, None, None]).astype(np.float32))  # what AWQ's codes round
    cs.fold(writer, scales, read, write)
    after = _run(model, x)
    np.testing.assert_allclose(after, before, rtol=1e-4, atol=1e-4 * float(np.abs(before).max()))
    np.testing.assert_allclose(read("w1") * scales[:, None, None, None], original, rtol=1e-6)  # the rows divided


@pytest.mark.parametrize("middle,why", [
    ([helper.make_node("Sigmoid", ["c1"], ["m"])], "sigmoid(x / s) is not sigmoid(x) / s"),
    ([helper.make_node("Clip", ["c1", "", "half"], ["m"])], "a clip's bounds do not scale"),
    ([helper.make_node("Relu", ["c1"], ["m"]), helper.make_node("Relu", ["c1"], ["other"])], "c1 read twice"),
    ([helper.make_node("Add", ["c1", "c1"], ["m"])], "an Add of two activations"),
    ([helper.make_node("Add", ["c1", "half"], ["a"]), helper.make_node("Mul", ["a", "half"], ["m"])],
     "a constant another node reads too"),
    ([helper.make_node("Mul", ["c1", "w1"], ["m"])], "a constant that is not one value per channel"),
])
def test_no_fold_where_the_division_would_not_commute_or_reaches_another_reader(middle, why):
    model = _conv_model(middle, np.random.default_rng(0))
    read, _ = _editor(model)
    assert cs.writer_of(model.graph, model.graph.node[-1], read) is None, why


def test_no_fold_past_a_graph_output_or_from_a_graph_input():
    model = _conv_model([helper.make_node("Relu", ["c1"], ["m"])], np.random.default_rng(0), extra_outputs=("c1",))
    read, _ = _editor(model)
    assert cs.writer_of(model.graph, model.graph.node[-1], read) is None
    model = _conv_model([helper.make_node("Relu", ["c1"], ["m"])], np.random.default_rng(0))
    read, _ = _editor(model)
    assert cs.writer_of(model.graph, model.graph.node[0], read) is None  # conv1 reads the model's input


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_and_matmul_writers_divide_their_output_columns(trans_b):
    rng = np.random.default_rng(5)
    w1 = rng.standard_normal((C, 5) if trans_b else (5, C)).astype(np.float32)
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(rng.standard_normal(C).astype(np.float32), "b1"),
             numpy_helper.from_array(rng.standard_normal((C, 3)).astype(np.float32), "w2")]
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["g"], name="fc1", transB=trans_b),
             helper.make_node("Relu", ["g"], ["m"]), helper.make_node("MatMul", ["m", "w2"], ["y"], name="fc2")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((4, 5)).astype(np.float32)
    before = _run(model, x)
    read, write = _editor(model)
    writer = cs.writer_of(model.graph, nodes[-1], read)
    assert writer is not None and writer.axis == (0 if trans_b else 1) and writer.bias == "b1"
    scales = rng.uniform(0.25, 4.0, C)
    write("w2", (read("w2") * scales[:, None]).astype(np.float32))
    cs.fold(writer, scales, read, write)
    np.testing.assert_allclose(_run(model, x), before, rtol=1e-4, atol=1e-5)
