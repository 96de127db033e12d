"""`qlinear quantize` never writes an ONNX model that fails onnx.checker's full check where the input passes it:
what onnx's version converter leaves is repaired (its value_info hints dropped, a declared output shape that the
new opset's shape inference contradicts replaced by the inferred one), and where the output still fails, nothing
is written and the command exits 2 with one line. The oracle is onnx.checker itself, and onnxruntime running
the written model against the float one."""

from __future__ import annotations

import json

import numpy as np
import pytest

from qlinear.cli import main

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _pytorch_style_reshape(opset: int = 12) -> onnx.ModelProto:
    """As PyTorch 1.9 exports a recogniser's head (ddddocr's common.onnx): a MatMul, then a Reshape to a shape
    built from Shape/Gather/Unsqueeze/Concat, and the output declared with the rank the author expected (2),
    not the one the Reshape gives (3). onnx's checker passes it at opset 12 and 13; from opset 19 its shape
    inference follows the Concat and sees rank 3."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.1, (64, 32)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array(0, np.int64), "i0"), numpy_helper.from_array(np.array(1, np.int64), "i1"),
             numpy_helper.from_array(np.array([-1], np.int64), "last")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Shape", ["h"], ["s"]),
             helper.make_node("Gather", ["s", "i0"], ["d0"], axis=0), helper.make_node("Gather", ["s", "i1"], ["d1"], axis=0),
             *_unsqueezes(opset, inits),
             helper.make_node("Concat", ["u0", "u1", "last"], ["shape"], axis=0),
             helper.make_node("Reshape", ["h", "shape"], ["y"])]
    graph = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", 1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seqlen"])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 6
    return model


def _unsqueezes(opset: int, inits: list) -> list:
    if opset < 13:  # axes an attribute
        return [helper.make_node("Unsqueeze", [d], [u], axes=[0]) for d, u in (("d0", "u0"), ("d1", "u1"))]
    inits.append(numpy_helper.from_array(np.array([0], np.int64), "axes"))
    return [helper.make_node("Unsqueeze", [d, "axes"], [u]) for d, u in (("d0", "u0"), ("d1", "u1"))]


def _quantize(capsys, *args):
    code = main(["quantize", *map(str, args), "--json"])
    captured = capsys.readouterr()
    return code, (json.loads(captured.out) if code == 0 else None), captured.err


def _run(path, x):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_the_built_model_fails_the_checker_only_at_the_new_opset():
    from onnx import version_converter

    model = _pytorch_style_reshape()
    onnx.checker.check_model(model, full_check=True)
    with pytest.raises(Exception, match="differ in rank"):  # onnx's InferenceError
        onnx.checker.check_model(version_converter.convert_version(model, 21), full_check=True)


def test_int4_output_shape_is_repaired_and_computes_the_same(tmp_path, capsys):
    source, output = tmp_path / "head.onnx", tmp_path / "head.int4.onnx"
    onnx.save(_pytorch_style_reshape(), str(source))
    code, report, err = _quantize(capsys, source, "--dtype", "int4", "--block-size", "16", "-o", output)
    assert code == 0, err
    assert report["model"]["opset_after"] == 21
    assert report["model"]["checker"].startswith("passed (after dropping the value_info hints; output shape y as inferred")
    written = onnx.load(str(output))
    onnx.checker.check_model(written, full_check=True)
    assert len(written.graph.output[0].type.tensor_type.shape.dim) == 3
    x = np.random.default_rng(1).normal(0, 1, (5, 1, 64)).astype(np.float32)
    want, got = _run(source, x), _run(output, x)
    assert got.shape == want.shape == (5, 1, 32)
    assert np.max(np.abs(got - want)) <= 0.1 * np.max(np.abs(want))  # int4 blocks of 16: a few percent


def test_a_model_that_still_fails_is_not_written(tmp_path, capsys, monkeypatch):
    """With the repairs switched off (as for a failure they do not cover), the checker's verdict refuses the
    model: exit 2, one line naming the input and the checker's error, no output file, no temporary left."""
    from qlinear.io.formats import onnx_model

    monkeypatch.setattr(onnx_model, "repair_value_info", lambda model, original=None: None)
    monkeypatch.setattr(onnx_model, "repair_output_shapes", lambda model: [])
    source, output = tmp_path / "head.onnx", tmp_path / "head.int4.onnx"
    onnx.save(_pytorch_style_reshape(), str(source))
    code, _, err = _quantize(capsys, source, "--dtype", "int4", "--block-size", "16", "-o", output)
    assert code == 2
    assert err.count("\n") == 1 and "fails onnx.checker's full check" in err and "differ in rank" in err
    assert str(source) in err and "nothing written" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["head.onnx"]


def test_an_input_that_fails_the_checker_is_still_written_and_said_so(tmp_path, capsys, monkeypatch):
    """The rule is relative to the input: an input that already fails the check is quantized (the user may run it
    anyway), and the report gives both verdicts."""
    from qlinear.io.formats import onnx_model

    monkeypatch.setattr(onnx_model, "repair_output_shapes", lambda model: [])
    source, output = tmp_path / "bad.onnx", tmp_path / "bad.int4.onnx"
    onnx.save(_pytorch_style_reshape(opset=21), str(source))  # fails as given: the declared rank is wrong at 21
    with pytest.raises(Exception, match="differ in rank"):
        onnx.checker.check_model(str(source), full_check=True)
    code, report, err = _quantize(capsys, source, "--dtype", "int4", "--block-size", "16", "-o", output)
    assert code == 0, err
    assert report["model"]["checker"].startswith("failed: ") and "(the input fails it too: " in report["model"]["checker"]
    assert output.exists()


def test_value_info_without_shapes_and_outputs_that_lost_theirs_are_repaired():
    """The version converter's leftovers: value_info entries with a type and no shape (harmless to the checker
    but stale) and a main-graph output without a shape, which the checker refuses ("Field 'shape' of 'type' is
    required but missing"); the output's shape comes back from the original model."""
    from qlinear.io.formats.onnx_model import repair_value_info

    original = _pytorch_style_reshape()
    original.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "T"
    original.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 1
    original.graph.output[0].type.tensor_type.shape.dim.add().dim_value = 32
    broken = onnx.ModelProto()
    broken.CopyFrom(original)
    broken.graph.output[0].type.tensor_type.ClearField("shape")
    broken.graph.value_info.append(helper.make_tensor_value_info("h", TensorProto.FLOAT, None))
    with pytest.raises(onnx.checker.ValidationError, match="Field 'shape' of 'type' is required but missing"):
        onnx.checker.check_model(broken, full_check=True)
    repair_value_info(broken, original)
    assert not broken.graph.value_info
    onnx.checker.check_model(broken, full_check=True)
    assert broken.graph.output[0].type == original.graph.output[0].type
