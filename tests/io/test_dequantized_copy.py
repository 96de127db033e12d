"""`onnx_dequantized.folded`: a quantized model's copy with each DequantizeLinear of constants replaced by the
tensor it computes. The oracle is onnx's reference evaluator running the written DequantizeLinear nodes themselves
(it runs the float4 codes and e8m0 scales onnxruntime cannot): the folded tensors are its values to the bit."""

from __future__ import annotations

import numpy as np
import pytest

from qlinear.cli import main

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from qlinear.io.formats import onnx_dequantized  # noqa: E402


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (16, 64, 3, 3)).astype(np.float32), "w_conv"),
             numpy_helper.from_array(rng.normal(0, 0.1, 16).astype(np.float32), "b_conv"),
             numpy_helper.from_array(rng.normal(0, 0.3, (16 * 36, 64)).astype(np.float32), "w_matmul")]
    nodes = [helper.make_node("Conv", ["x", "w_conv", "b_conv"], ["c"], strides=[2, 2], name="conv"),
             helper.make_node("Flatten", ["c"], ["f"]),
             helper.make_node("MatMul", ["f", "w_matmul"], ["y"], name="matmul")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 13, 13])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("dtype", ["int4", "mxfp4", "nvfp4"])
def test_each_folded_weight_is_what_its_dequantize_linear_computes(tmp_path, dtype):
    onnx.save(_model(), str(tmp_path / "model.onnx"))
    assert main(["quantize", str(tmp_path / "model.onnx"), "--dtype", dtype, "-o", str(tmp_path / "q.onnx"),
                 "--no-eval"]) == 0
    quantized = onnx.load(str(tmp_path / "q.onnx"))
    dequantized = [node.output[0] for node in quantized.graph.node if node.op_type == "DequantizeLinear"]
    assert {"w_conv", "w_matmul"} <= set(dequantized)
    exposed = type(quantized)()
    exposed.CopyFrom(quantized)
    exposed.graph.output.extend(helper.make_tensor_value_info(name, TensorProto.UNDEFINED, None)
                                for name in dequantized)
    expected = dict(zip(dequantized, ReferenceEvaluator(exposed).run(dequantized, {"x": np.zeros((1, 64, 13, 13),
                                                                                                  np.float32)})))
    folded = onnx_dequantized.folded(quantized)
    assert not [node for node in folded.graph.node if node.op_type == "DequantizeLinear"]
    stored = {t.name: numpy_helper.to_array(t) for t in folded.graph.initializer}
    for name in ("w_conv", "w_matmul"):
        assert stored[name].dtype == expected[name].dtype and stored[name].tobytes() == expected[name].tobytes(), name
    # the codes and scales nothing reads any longer are gone; the model is valid and computes the same
    assert not [name for name in stored if name.endswith(("_quantized", "_scale"))]
    onnx.checker.check_model(folded, full_check=True)
    x = np.random.default_rng(1).normal(0, 1, (1, 64, 13, 13)).astype(np.float32)
    np.testing.assert_allclose(ReferenceEvaluator(folded).run(None, {"x": x})[0],
                               ReferenceEvaluator(quantized).run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_a_branch_reads_its_outer_graph_s_codes():
    """A DequantizeLinear inside an If branch whose codes and scale the main graph stores is folded in the branch."""
    codes = numpy_helper.from_array(np.array([[-8, 7], [3, -1]], np.int8), "codes")
    scale = numpy_helper.from_array(np.array(0.5, np.float32), "scale")
    branch = helper.make_graph([helper.make_node("DequantizeLinear", ["codes", "scale"], ["w"]),
                                helper.make_node("MatMul", ["x", "w"], ["then_y"])], "then", [],
                               [helper.make_tensor_value_info("then_y", TensorProto.FLOAT, [1, 2])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["else_y"])], "else", [],
                              [helper.make_tensor_value_info("else_y", TensorProto.FLOAT, [1, 2])])
    graph = helper.make_graph([helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=other)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2]),
                               helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])], [codes, scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    folded = onnx_dequantized.folded(model)
    inner = folded.graph.node[0].attribute[0].g if folded.graph.node[0].attribute[0].name == "then_branch" \
        else folded.graph.node[0].attribute[1].g
    assert [node.op_type for node in inner.node] == ["MatMul"]
    np.testing.assert_array_equal(numpy_helper.to_array(inner.initializer[0]), [[-4.0, 3.5], [1.5, -0.5]])
    assert not folded.graph.initializer  # the outer codes and scale: read by nothing now


def test_with_a_data_file_the_copy_refers_to_the_same_tensors(tmp_path):
    """Given a data file, the folded tensors of 1 KB or more go there (the copy holds the quantized model's
    bytes, not the float model's); read back, and run by onnxruntime from the copy, they are the same bits."""
    ort = pytest.importorskip("onnxruntime")
    onnx.save(_model(), str(tmp_path / "model.onnx"))
    assert main(["quantize", str(tmp_path / "model.onnx"), "--dtype", "nvfp4", "-o", str(tmp_path / "q.onnx"),
                 "--no-eval"]) == 0
    quantized = onnx.load(str(tmp_path / "q.onnx"))
    inline = onnx_dequantized.folded(quantized)
    external = onnx_dequantized.folded(quantized, data=tmp_path / "weights.data")
    moved = [t.name for t in external.graph.initializer if t.data_location == TensorProto.EXTERNAL]
    assert sorted(moved) == ["w_conv", "w_matmul"]  # the bias (64 bytes) stays in the copy
    assert external.ByteSize() < inline.ByteSize() - 16 * 64 * 9 * 4
    for t, u in zip(inline.graph.initializer, external.graph.initializer):
        assert numpy_helper.to_array(u, base_dir=str(tmp_path)).tobytes() == numpy_helper.to_array(t).tobytes()
    options = ort.SessionOptions()
    options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(tmp_path))
    x = np.random.default_rng(2).normal(0, 1, (1, 64, 13, 13)).astype(np.float32)
    runs = [ort.InferenceSession(m.SerializeToString(), options if m is external else ort.SessionOptions(),
                                 providers=["CPUExecutionProvider"]).run(None, {"x": x})[0] for m in (inline, external)]
    np.testing.assert_array_equal(runs[0], runs[1])
