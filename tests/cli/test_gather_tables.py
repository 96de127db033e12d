"""4-bit Gather tables under ``--target onnxruntime``: ``DequantizeLinear -> Gather`` is written as onnxruntime's
contrib ``com.microsoft.GatherBlockQuantized`` on the same codes, scales and zero points, so that onnxruntime
dequantizes only the gathered rows. Oracles: onnxruntime running the standard ``DequantizeLinear -> Gather`` of the
``--target qdq-portable`` model (the same bits demanded), and onnxruntime's own contrib kernel for
`qlinear.onnx.ops.GatherBlockQuantized` (the transcription ``qlinear run`` uses)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import qlinear.onnx
from qlinear.cli import main

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

VOCAB, WIDTH = 50, 64


def _embedding_model(dtype=np.float32, gather_axis: int = 0, constant_node: bool = False,
                     table_is_output: bool = False) -> onnx.ModelProto:
    """ids -> Gather(table) twice (two readers of one table) -> Add -> y; the table an initializer or a Constant."""
    rng = np.random.default_rng(3)
    shape = (VOCAB, WIDTH) if gather_axis == 0 else (WIDTH, VOCAB)
    table = numpy_helper.from_array(rng.normal(0, 0.5, shape).astype(dtype), "table")
    element = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    nodes = [helper.make_node("Gather", ["table", "ids"], ["a"], axis=gather_axis, name="gather_a"),
             helper.make_node("Gather", ["table", "ids2"], ["b"], axis=gather_axis, name="gather_b"),
             helper.make_node("Add", ["a", "b"], ["y"], name="add")]
    initializers = [table]
    if constant_node:
        nodes.insert(0, helper.make_node("Constant", [], ["table"], value=table, name="table_constant"))
        initializers = []
    outputs = [helper.make_tensor_value_info("y", element, [2, 3, WIDTH] if gather_axis == 0 else [WIDTH, 2, 3])]
    if table_is_output:
        nodes.append(helper.make_node("Identity", ["table"], ["table_copy"]))
        outputs.append(helper.make_tensor_value_info("table_copy", element, list(shape)))
    graph = helper.make_graph(nodes, "embedding",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 3]),
                               helper.make_tensor_value_info("ids2", TensorProto.INT64, [2, 3])],
                              outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def _quantize(tmp_path, model, name: str, *options) -> tuple:
    source = tmp_path / f"{name}.onnx"
    onnx.save(model, source)
    out = tmp_path / f"{name}.q.onnx"
    code = main(["quantize", str(source), "-o", str(out), "--force", "--json", "--no-eval", "--min-elements", "0",
                 *options])
    assert code == 0
    return out, onnx.load(out)


def _run(path, feeds):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, feeds)


FEEDS = {"ids": np.array([[0, 7, 49], [-1, 3, 3]], np.int64), "ids2": np.array([[1, 2, 3], [-50, 48, 0]], np.int64)}


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("options", [("--dtype", "int4"), ("--dtype", "uint4", "--asymmetric"),
                                     ("--dtype", "int4", "--asymmetric", "--block-size", "16")])
def test_contrib_gather_gives_the_bits_of_dequantize_then_gather(tmp_path, capsys, dtype, options):
    model = _embedding_model(dtype)
    fused, proto = _quantize(tmp_path, model, "fused", *options)
    report = json.loads(capsys.readouterr().out)
    portable, standard = _quantize(tmp_path, model, "portable", *options, "--target", "qdq-portable")
    capsys.readouterr()
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("GatherBlockQuantized") == 2 and "DequantizeLinear" not in ops
    assert {n.domain for n in proto.graph.node if n.op_type == "GatherBlockQuantized"} == {"com.microsoft"}
    assert any(o.domain == "com.microsoft" and o.version == 1 for o in proto.opset_import)
    assert [n.op_type for n in standard.graph.node].count("DequantizeLinear") == 1
    assert report["model"]["gather_block_quantized"] == ["table"]
    assert report["model"]["checker"] == "passed"
    assert report["model"]["dequantize_nodes"] == 0
    expected = _run(portable, FEEDS)[0]
    got = _run(fused, FEEDS)[0]
    assert got.dtype == expected.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got.view(np.uint8), expected.view(np.uint8))
    ours = list(qlinear.onnx.run(qlinear.onnx.evaluator(str(fused)), FEEDS).values())[0]
    np.testing.assert_array_equal(np.asarray(ours).view(np.uint8), expected.view(np.uint8))


def test_gather_along_the_second_axis_and_constant_node_tables(tmp_path, capsys):
    model = _embedding_model(gather_axis=1, constant_node=True)
    fused, proto = _quantize(tmp_path, model, "fused", "--dtype", "int4", "--axis", "0")
    portable, _ = _quantize(tmp_path, model, "portable", "--dtype", "int4", "--axis", "0", "--target", "qdq-portable")
    capsys.readouterr()
    nodes = [n for n in proto.graph.node if n.op_type == "GatherBlockQuantized"]
    assert len(nodes) == 2
    attributes = {a.name: a.i for a in nodes[0].attribute}
    assert attributes == {"gather_axis": 1, "quantize_axis": 0, "block_size": 32, "bits": 4}
    np.testing.assert_array_equal(_run(fused, FEEDS)[0], _run(portable, FEEDS)[0])


@pytest.mark.parametrize("case", ["block 24", "table also an output", "int8"])
def test_tables_the_contrib_operator_cannot_take_keep_their_dequantize(tmp_path, capsys, case):
    model = _embedding_model(table_is_output=case == "table also an output")
    options = {"block 24": ("--dtype", "int4", "--block-size", "24"), "table also an output": ("--dtype", "int4"),
               "int8": ("--dtype", "int8")}[case]
    _, proto = _quantize(tmp_path, model, "kept", *options)
    report = json.loads(capsys.readouterr().out)
    ops = [n.op_type for n in proto.graph.node]
    assert "GatherBlockQuantized" not in ops and "DequantizeLinear" in ops
    assert report["model"]["gather_block_quantized"] == []
    assert not any(o.domain == "com.microsoft" for o in proto.opset_import)


def test_transcription_matches_onnxruntimes_kernel_on_indices_out_of_range():
    """The contrib kernel writes zeros for an index outside the table (Gather would fail); the transcription too."""
    rng = np.random.default_rng(5)
    codes = rng.integers(-8, 8, (6, 32)).astype(np.int8)
    scales = rng.uniform(0.01, 0.1, (6, 2)).astype(np.float32)
    zeros = rng.integers(-8, 8, (6, 2)).astype(np.int8)
    import ml_dtypes

    tensors = [numpy_helper.from_array(codes.astype(ml_dtypes.int4), "data"), numpy_helper.from_array(scales, "scales"),
               numpy_helper.from_array(zeros.astype(ml_dtypes.int4), "zero_points")]
    node = helper.make_node("GatherBlockQuantized", ["data", "ids", "scales", "zero_points"], ["y"],
                            domain="com.microsoft", gather_axis=0, quantize_axis=1, block_size=16, bits=4)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 32])], tensors)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    feeds = {"ids": np.array([0, 5, -6, 6, -7], np.int64)}
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    ours = list(qlinear.onnx.run(qlinear.onnx.evaluator(model), feeds).values())[0]
    np.testing.assert_array_equal(ours, expected)
    assert not expected[3:].any() and expected[:3].any()


def test_target_applies_to_onnx_models_only(tmp_path, capsys):
    source = tmp_path / "w.npy"
    np.save(source, np.ones((64, 64), np.float32))
    code = main(["quantize", str(source), "--dtype", "int4", "--target", "onnxruntime", "-o", str(tmp_path / "w.npz")])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--target applies to ONNX models" in err[0]


def _conv_gemm_model() -> onnx.ModelProto:
    rng = np.random.default_rng(9)
    inits = [numpy_helper.from_array(rng.normal(0, 0.2, (32, 32, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(0, 0.2, (32, 32, 1, 1)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.normal(0, 0.2, (32, 64)).astype(np.float32), "w3"),
             numpy_helper.from_array(rng.normal(0, 0.2, (64, 16)).astype(np.float32), "w4")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2"),
             helper.make_node("GlobalAveragePool", ["c2"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "w3"], ["g"], name="gemm"),
             helper.make_node("MatMul", ["g", "w4"], ["y"], name="matmul")]
    graph = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def test_weights_onnxruntime_dequantizes_on_every_run_are_counted(tmp_path, capsys):
    """Weights only: the report counts the DequantizeLinear nodes that onnxruntime's optimized graph keeps (the Convs',
    not the Gemm's and the MatMul's, which become MatMulNBits), and the session option it names folds them all at load."""
    out, _ = _quantize(tmp_path, _conv_gemm_model(), "net", "--dtype", "int4")
    report = json.loads(capsys.readouterr().out)
    kept = {}
    for config in ({}, {"session.disable_quant_qdq": "1"}):
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(tmp_path / f"optimized{len(kept)}.onnx")
        for key, value in config.items():
            options.add_session_config_entry(key, value)
        ort.InferenceSession(str(out), options, providers=["CPUExecutionProvider"])
        ops = [n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node]
        kept[bool(config)] = ops.count("DequantizeLinear")
    assert report["model"]["dequantized_per_run"] == kept[False] == 2
    assert kept[True] == 0
    _, _ = _quantize(tmp_path, _conv_gemm_model(), "portable", "--dtype", "int4", "--target", "qdq-portable")
    assert json.loads(capsys.readouterr().out)["model"]["dequantized_per_run"] == 0
