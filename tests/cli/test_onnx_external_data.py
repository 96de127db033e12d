"""ONNX models with external data: read from their data files (memory-mapped), written with external data
(OUTPUT.data beside OUTPUT), the same quantized values as the same model stored inline, the kept tensors
carried over, loadable by onnx.checker and onnxruntime from where they land. Measured on a 2.42 GB model
by benchmarks/big_onnx.py (README, "Memory")."""

from __future__ import annotations

import json

import numpy as np
import pytest

from qlinear.cli import main

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import helper, numpy_helper  # noqa: E402


def _model(opset: int, constant_nodes: bool = False):
    """x [N, 64] -> MatMul 64x96 -> Add -> MatMul 96x10: weights as initializers or Constant nodes."""
    rng = np.random.default_rng(5)
    tensors = {"w0": rng.standard_normal((64, 96)).astype(np.float32) * 0.2,
               "b0": rng.standard_normal(96).astype(np.float32),
               "w1": rng.standard_normal((96, 10)).astype(np.float32) * 0.2}
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["m0"]), helper.make_node("Add", ["m0", "b0"], ["a0"]),
             helper.make_node("MatMul", ["a0", "w1"], ["y"])]
    initializers = [numpy_helper.from_array(v, k) for k, v in tensors.items()]
    if constant_nodes:
        nodes = [helper.make_node("Constant", [], [t.name], value=t) for t in initializers] + nodes
        initializers = []
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [None, 64])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [None, 10])], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _save(model, path, external: bool):
    if external:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=f"{path.stem}.weights", size_threshold=0, convert_attribute=True)
    else:
        onnx.save_model(model, str(path))


def _quantize(capsys, source, output, dtype):
    code = main(["quantize", str(source), "--dtype", dtype, "-o", str(output), "--json", "--no-eval"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def _tensors(path) -> dict[str, np.ndarray]:
    """Every initializer and Constant value of a model, loaded with onnx's own external-data reader."""
    model = onnx.load(str(path))
    found = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            found[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return found


@pytest.mark.parametrize("dtype", ["int8", "int4"])
@pytest.mark.parametrize("constant_nodes", [False, True])
def test_external_data_in_and_out(tmp_path, capsys, dtype, constant_nodes):
    model = _model(13, constant_nodes)
    inline, external = tmp_path / "inline.onnx", tmp_path / "ext" / "model.onnx"
    external.parent.mkdir()
    _save(model, inline, external=False)
    _save(model, external, external=True)
    assert len(onnx.load(str(external), load_external_data=False).SerializeToString()) < 2000

    report = _quantize(capsys, external, tmp_path / "ext" / "q.onnx", dtype)
    reference = _quantize(capsys, inline, tmp_path / "q-inline.onnx", dtype)
    assert report["model"]["external_data"] == "q.onnx.data" and reference["model"]["external_data"] is None
    assert report["model"]["checker"] == "passed"
    if dtype == "int4":  # opset 13 -> 21, checked on made-up inputs through links to the source's data file
        assert report["model"]["conversion"]["checked"]
    assert sorted(p.name for p in (tmp_path / "ext").iterdir()) == ["model.onnx", "model.weights", "q.onnx", "q.onnx.data"]
    out = onnx.load(str(tmp_path / "ext" / "q.onnx"), load_external_data=False)
    onnx.checker.check_model(str(tmp_path / "ext" / "q.onnx"), full_check=True)
    big = [t for t in out.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    if not constant_nodes:
        assert {t.name for t in big} >= {"w0_quantized", "w1_quantized", "b0"}  # the kept bias moved too
    # The same bits as the model stored inline, read back by onnx's own reader.
    ours, theirs = _tensors(tmp_path / "ext" / "q.onnx"), _tensors(tmp_path / "q-inline.onnx")
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert ours[name].dtype == theirs[name].dtype and ours[name].tobytes() == theirs[name].tobytes(), name
    assert report["tensors"] == reference["tensors"] and report["totals"] == reference["totals"]
    x = np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32)
    y_ext = ort.InferenceSession(str(tmp_path / "ext" / "q.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    y_inline = ort.InferenceSession(str(tmp_path / "q-inline.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(y_ext[0], y_inline[0])


def test_external_data_output_needs_force_for_both_files_and_leaves_nothing_on_error(tmp_path, capsys):
    source = tmp_path / "model.onnx"
    _save(_model(21), source, external=True)
    output = tmp_path / "q.onnx"
    _quantize(capsys, source, output, "int8")
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["quantize", str(source), "--dtype", "int8", "-o", str(output), "--no-eval"]) == 2
    assert "already exists; pass --force" in capsys.readouterr().err
    (tmp_path / "model.weights").write_bytes(b"short")  # the source's data is now corrupt
    assert main(["quantize", str(source), "--dtype", "int8", "-o", str(output), "--force", "--no-eval"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "external data file 'model.weights' has 5 bytes" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # the earlier output stands, no temporary left
