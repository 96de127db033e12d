"""qlinear.onnx.float_ops: Conv and MaxPool give onnx's reference classes' results bit for bit (the oracle:
onnx.reference.ReferenceEvaluator running the same one-node model without them)."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import qlinear.onnx as qonnx  # noqa: E402
from qlinear.onnx import float_ops  # noqa: E402


def _node_model(op: str, inputs: dict, opset: int = 17, **attributes) -> onnx.ModelProto:
    node = helper.make_node(op, list(inputs), ["y"], **attributes)
    values = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for name, v in inputs.items()]
    graph = helper.make_graph([node], "one", values, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _both(op: str, inputs: dict, opset: int = 17, **attributes) -> tuple[np.ndarray, np.ndarray]:
    model = _node_model(op, inputs, opset, **attributes)
    reference = ReferenceEvaluator(model).run(None, inputs)[0]
    ours = ReferenceEvaluator(model, new_ops=list(float_ops.FLOAT_OPS)).run(None, inputs)[0]
    return ours, reference


CONV_CASES = [  # x shape, w shape, attributes
    ((2, 3, 9, 11), (4, 3, 3, 3), dict(pads=[1, 1, 1, 1])),
    ((1, 6, 12, 10), (6, 1, 5, 5), dict(group=6, pads=[2, 2, 2, 2], strides=[2, 1])),  # depthwise 5x5, (2, 1)
    ((1, 4, 13, 13), (6, 2, 3, 3), dict(group=2, dilations=[2, 3], pads=[0, 1, 2, 3], strides=[2, 2])),
    ((2, 5, 17), (3, 5, 4), dict(strides=[3], pads=[2, 1])),  # 1-D
    ((1, 2, 5, 6, 7), (3, 2, 2, 3, 2), dict(pads=[1, 0, 1, 0, 1, 1])),  # 3-D
    ((1, 3, 10, 9), (2, 3, 3, 2), dict(auto_pad="SAME_UPPER", strides=[2, 2])),
    ((1, 3, 10, 9), (2, 3, 3, 2), dict(auto_pad="SAME_LOWER", strides=[3, 2], dilations=[2, 1])),
    ((1, 3, 8, 8), (2, 3, 3, 3), dict(auto_pad="VALID")),
    ((3, 8, 7, 7), (16, 8, 1, 1), {}),  # 1x1, no padding
    ((1, 8, 7, 9), (16, 8, 1, 1), {}),  # 1x1 of one image: x itself is the matrix
    ((1, 8, 7, 9), (4, 2, 1, 1), dict(group=4)),
]


@pytest.mark.parametrize("bias", ["none", "per_channel", "one"])
@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_is_the_reference_to_the_bit(case, bias):
    xs, ws, attributes = case
    rng = np.random.default_rng(len(xs) + sum(ws))
    inputs = {"x": rng.normal(0, 3, xs).astype(np.float32), "w": rng.normal(0, 1, ws).astype(np.float32)}
    if bias != "none":
        inputs["b"] = rng.normal(0, 1, ws[0] if bias == "per_channel" else 1).astype(np.float32)
    ours, reference = _both("Conv", inputs, **attributes)
    assert ours.dtype == reference.dtype and ours.shape == reference.shape
    np.testing.assert_array_equal(ours.view(np.uint32), reference.view(np.uint32))


POOL_CASES = [  # x shape, attributes (the cases the reference runs pixel by pixel: a stride or dilation above 1)
    ((2, 3, 12, 13), dict(kernel_shape=[2, 2], strides=[2, 2])),
    ((1, 4, 11, 9), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ((1, 2, 10, 10), dict(kernel_shape=[3, 2], strides=[2, 3], pads=[2, 0, 1, 1], ceil_mode=1)),
    ((1, 2, 9, 12), dict(kernel_shape=[2, 3], dilations=[2, 2], pads=[1, 1, 0, 2])),
    ((1, 2, 4, 4), dict(kernel_shape=[3, 3], strides=[3, 3], pads=[2, 2, 2, 2], ceil_mode=1)),  # windows of padding
    ((2, 3, 20), dict(kernel_shape=[3], strides=[2], pads=[1, 1])),  # 1-D
    ((1, 2, 6, 7, 5), dict(kernel_shape=[2, 2, 2], strides=[2, 2, 1])),  # 3-D
]


@pytest.mark.parametrize("nan", [False, True])
@pytest.mark.parametrize("case", POOL_CASES)
def test_max_pool_is_the_reference_to_the_bit(case, nan):
    xs, attributes = case
    rng = np.random.default_rng(len(xs) * 7 + xs[-1])
    x = rng.normal(0, 3, xs).astype(np.float32)
    if nan:  # NaN first in some windows, later in others: the reference's comparisons decide
        x.reshape(-1)[rng.choice(x.size, x.size // 5, replace=False)] = np.nan
    ours, reference = _both("MaxPool", {"x": x}, **attributes)
    assert ours.dtype == reference.dtype and ours.shape == reference.shape
    np.testing.assert_array_equal(ours.view(np.uint32), reference.view(np.uint32))


def test_run_uses_them(monkeypatch):
    calls = []
    real = float_ops.Conv._run
    monkeypatch.setattr(float_ops.Conv, "_run", lambda self, *a, **k: (calls.append(1), real(self, *a, **k))[1])
    inputs = {"x": np.ones((1, 2, 5, 5), np.float32), "w": np.ones((1, 2, 3, 3), np.float32)}
    y = qonnx.run(_node_model("Conv", inputs), inputs)["y"]
    assert calls == [1] and float(y[0, 0, 1, 1]) == 18.0


def _qdq_conv_model() -> tuple[onnx.ModelProto, dict]:
    """x -> QuantizeLinear -> DequantizeLinear -> Conv (weights: DequantizeLinear of int8 codes) -> y."""
    from onnx import numpy_helper

    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(np.float32(0.05), "xs"), numpy_helper.from_array(np.uint8(128), "xz"),
             numpy_helper.from_array(rng.integers(-100, 100, (4, 3, 3, 3)).astype(np.int8), "wq"),
             numpy_helper.from_array(np.full(4, 0.01, np.float32), "ws"),
             numpy_helper.from_array(np.zeros(4, np.int8), "wz")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=0),
             helper.make_node("Conv", ["xd", "w"], ["y"], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return model, {"x": rng.normal(0, 2, (1, 3, 6, 6)).astype(np.float32)}


def test_constant_dequantized_weights_are_computed_once():
    model, feeds = _qdq_conv_model()
    session = qonnx.evaluator(model)
    assert [node.op_type for node in session.rt_nodes_] == ["QuantizeLinear", "DequantizeLinear", "Conv"]
    assert not session.rt_inits_["w"].flags.writeable
    for _ in range(2):  # the same bits on every run, and the reference's
        np.testing.assert_array_equal(qonnx.run(session, feeds)["y"], ReferenceEvaluator(model).run(None, feeds)[0])


def test_a_constant_node_that_fails_still_fails_in_the_run():
    model, feeds = _qdq_conv_model()
    model.graph.initializer[3].CopyFrom(onnx.numpy_helper.from_array(np.full(3, 0.01, np.float32), "ws"))
    session = qonnx.evaluator(model)  # 3 scales for 4 channels: not folded, and the run says why
    assert [node.op_type for node in session.rt_nodes_].count("DequantizeLinear") == 2
    with pytest.raises(ValueError, match="DequantizeLinear"):
        qonnx.run(session, feeds)


TRANSPOSE_CASES = [  # x shape, w shape (C_in, C_out, *kernel), attributes
    ((2, 4, 5, 6), (4, 3, 2, 2), dict(strides=[2, 2])),  # the detector's upsampling: no overlap
    ((1, 3, 5, 5), (3, 2, 3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])),  # overlaps
    ((1, 2, 4, 7), (2, 3, 3, 2), dict(strides=[1, 2], dilations=[2, 1], pads=[0, 1, 2, 0])),
    ((2, 3, 9), (3, 2, 4), dict(strides=[3], pads=[1, 2])),  # 1-D
    ((1, 2, 3, 4, 3), (2, 2, 2, 2, 2), dict(strides=[2, 1, 2])),  # 3-D
    ((1, 2, 4, 4), (2, 2, 3, 3), dict(strides=[2, 2], output_shape=[9, 10])),
]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("case", TRANSPOSE_CASES)
def test_conv_transpose_is_the_reference_to_the_bit(case, bias):
    xs, ws, attributes = case
    rng = np.random.default_rng(len(xs) + sum(ws) + len(attributes))
    inputs = {"x": rng.normal(0, 3, xs).astype(np.float32), "w": rng.normal(0, 1, ws).astype(np.float32)}
    if bias:
        inputs["b"] = rng.normal(0, 1, ws[1]).astype(np.float32)
    ours, reference = _both("ConvTranspose", inputs, **attributes)
    assert ours.dtype == reference.dtype and ours.shape == reference.shape
    np.testing.assert_array_equal(ours.view(np.uint32), reference.view(np.uint32))


AVERAGE_CASES = [  # x shape, attributes
    ((2, 3, 9, 8), dict(kernel_shape=[3, 2], strides=[3, 2])),  # the recogniser's
    ((1, 2, 7, 7), dict(kernel_shape=[2, 2])),
    ((1, 2, 12, 11), dict(kernel_shape=[3, 3], strides=[2, 2], count_include_pad=1)),  # 9 values: pairwise sums
    ((1, 2, 9, 9), dict(kernel_shape=[4, 4], strides=[1, 2])),  # 16 values
    ((2, 3, 20), dict(kernel_shape=[5], strides=[3])),  # 1-D
    ((1, 2, 6, 5, 7), dict(kernel_shape=[2, 2, 3], strides=[2, 1, 2])),  # 3-D
    ((1, 2, 7, 7), dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])),  # padded: the reference's code
]


@pytest.mark.parametrize("opset", [11, 19])
@pytest.mark.parametrize("nan", [False, True])
@pytest.mark.parametrize("case", AVERAGE_CASES)
def test_average_pool_is_the_reference_to_the_bit(case, nan, opset):
    xs, attributes = case
    rng = np.random.default_rng(len(xs) * 5 + xs[-1])
    x = rng.normal(0, 3, xs).astype(np.float32)
    if nan:
        x.reshape(-1)[::7] = np.nan
    ours, reference = _both("AveragePool", {"x": x}, opset, **attributes)
    assert ours.dtype == reference.dtype and ours.shape == reference.shape
    np.testing.assert_array_equal(ours.view(np.uint32), reference.view(np.uint32))


def test_a_qdq_network_runs_to_the_bits_of_the_reference_classes():
    """Quantize -> Conv -> MaxPool -> ConvTranspose -> AveragePool, each weight a DequantizeLinear of int8 codes:
    qlinear's evaluator (folded weights, float_ops) against the same evaluator with onnx's own float classes."""
    from onnx import numpy_helper

    from qlinear.onnx import QlinearEvaluator, ops

    rng = np.random.default_rng(11)
    inits, nodes = [numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(np.uint8(128), "z")], []

    def weight(name, shape):
        inits.extend([numpy_helper.from_array(rng.integers(-90, 90, shape).astype(np.int8), f"{name}_q"),
                      numpy_helper.from_array(np.full(shape[0], 0.02, np.float32), f"{name}_s"),
                      numpy_helper.from_array(np.zeros(shape[0], np.int8), f"{name}_z")])
        nodes.append(helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [name], axis=0))
        return name

    def requantized(name):
        nodes.extend([helper.make_node("QuantizeLinear", [name, "s", "z"], [f"{name}_q8"]),
                      helper.make_node("DequantizeLinear", [f"{name}_q8", "s", "z"], [f"{name}_d"])])
        return f"{name}_d"

    x = requantized("x")
    nodes.append(helper.make_node("Conv", [x, weight("w1", (6, 3, 3, 3))], ["c1"], pads=[1, 1, 1, 1]))
    nodes.append(helper.make_node("MaxPool", [requantized("c1")], ["p1"], kernel_shape=[2, 2], strides=[2, 2]))
    nodes.append(helper.make_node("ConvTranspose", [requantized("p1"), weight("w2", (6, 4, 2, 2))], ["t1"],
                                  strides=[2, 2]))
    nodes.append(helper.make_node("AveragePool", [requantized("t1")], ["y"], kernel_shape=[2, 2], strides=[2, 2]))
    graph = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 12, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    feeds = {"x": rng.normal(0, 2, (2, 3, 12, 16)).astype(np.float32)}

    class Plain(QlinearEvaluator):
        default_new_ops = ops.OPS + ops.PEER_FIXES
        FOLDED_OPS = frozenset()

    fast, plain = qonnx.run(qonnx.evaluator(model), feeds)["y"], qonnx.run(Plain(model), feeds)["y"]
    assert fast.shape == (2, 4, 6, 8)
    np.testing.assert_array_equal(fast.view(np.uint32), plain.view(np.uint32))
