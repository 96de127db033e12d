"""Where onnx's reference evaluator is wrong for ordinary operators that real exports use, `qlinear run`
runs the spec instead (docs/semantics.md, "Whole ONNX models"). Oracles: the spec's formula in float64,
and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import qlinear.onnx  # noqa: E402

RNG = np.random.default_rng(11)
X = RNG.standard_normal((2, 4, 3, 5)).astype(np.float32)
PARAMS = {name: (RNG.random(4) + 0.5).astype(np.float32) for name in ("scale", "bias", "mean", "var")}


def _batch_norm_model(opset: int, outputs: int = 1, **attributes):
    names = ["y", "running_mean", "running_var", "saved_mean", "saved_var"][:outputs]
    node = helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], names, **attributes)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, X.shape)],
                              [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in names],
                              [numpy_helper.from_array(v, n) for n, v in PARAMS.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _spec(epsilon: float) -> np.ndarray:
    p = {n: v.astype(np.float64).reshape(-1, 1, 1) for n, v in PARAMS.items()}
    return (X - p["mean"]) / np.sqrt(p["var"] + epsilon) * p["scale"] + p["bias"]


@pytest.mark.parametrize("opset, momentum", [(9, 0.9), (11, 0.9), (12, None), (13, 0.9)])
def test_batch_normalization_before_14_is_inference_with_one_output(opset, momentum):
    """One output means inference (the given mean and variance) before version 14. onnx 1.23's reference
    takes the batch's statistics whenever ``momentum`` is set, and it fills in the latest schema's default
    (0.9) when the node has none: the Paddle OCR models of the corpus (opset 11/12) came out 0.22 off. If
    onnx fixes this, the last assertion fails."""
    model = _batch_norm_model(opset, epsilon=1e-5, **({} if momentum is None else {"momentum": momentum}))
    expected = _spec(1e-5)
    ours = qlinear.onnx.run(model, {"x": X})["y"]
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]
    assert np.max(np.abs(ours - expected)) < 1e-5 and np.max(np.abs(theirs - expected)) < 1e-5
    reference = ReferenceEvaluator(model).run(None, {"x": X})[0]
    assert np.max(np.abs(reference - expected)) > 0.05  # the peer deviation this class exists for


def test_batch_normalization_from_14_on_is_onnx_s():
    for model in (_batch_norm_model(14, epsilon=1e-3, momentum=0.9), _batch_norm_model(15, epsilon=1e-3)):
        ours = qlinear.onnx.run(model, {"x": X})["y"]
        assert np.array_equal(ours, ReferenceEvaluator(model).run(None, {"x": X})[0])
        assert np.max(np.abs(ours - _spec(1e-3))) < 1e-5


def test_a_dimension_written_as_minus_one_is_dynamic():
    """Paddle exports write a dynamic batch as dim_value -1 (the corpus' direction classifier)."""
    node = helper.make_node("Relu", ["x"], ["y"])
    x_info = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [-1, 3])
    graph = helper.make_graph([node], "g", [x_info], [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    assert np.array_equal(qlinear.onnx.run(model, {"x": x})["y"], np.maximum(x, 0))
    with pytest.raises(ValueError, match="must have size 3 along axis 1"):
        qlinear.onnx.run(model, {"x": np.zeros((2, 4), np.float32)})
