"""Under integer weight types of 4 bits or fewer, an image's first layers keep float weights: the convolution
reading the 3-channel input and the depthwise convolution after it (`placement.graph.image_stem`) stay float
under int4, uint4 and int2 and under MXFP4 with the OCP floor rule (its default), and are quantized under MXFP4's
other rules, NVFP4, float4e2m1 and every type of 8 bits or more. The dense convolution after them is quantized in every case; the
written model runs in onnxruntime, and its kept weights are the float model's, bit for bit."""

from __future__ import annotations

import json

import numpy as np
import pytest

from qlinear.cli import main

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

C = 32


def _stem_model() -> onnx.ModelProto:
    """x (3 channels) -> stem 3x3 -> Relu -> depthwise 3x3 -> dense 1x1 -> y."""
    rng = np.random.default_rng(5)
    weights = {"stem_w": rng.normal(0, 0.3, (C, 3, 3, 3)), "dw_w": rng.normal(0, 0.3, (C, 1, 3, 3)),
               "dense_w": rng.normal(0, 0.3, (C, C, 1, 1))}
    inits = [numpy_helper.from_array(w.astype(np.float32), name) for name, w in weights.items()]
    nodes = [helper.make_node("Conv", ["x", "stem_w"], ["s"], pads=[1] * 4, name="stem"),
             helper.make_node("Relu", ["s"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "dw_w"], ["d"], pads=[1] * 4, group=C, name="dw"),
             helper.make_node("Conv", ["d", "dense_w"], ["y"], name="dense")]
    graph = helper.make_graph(nodes, "stem", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("first_layers") / "stem.onnx"
    onnx.save(_stem_model(), str(path))
    return path


@pytest.mark.parametrize("dtype, rule, kept", [
    ("int4", None, True), ("uint4", None, True), ("int2", None, True), ("mxfp4", None, True),
    ("mxfp4", "floor", True), ("mxfp4", "even", False), ("mxfp4", "ceil", False), ("nvfp4", None, False),
    ("float4e2m1", None, False), ("int8", None, False), ("float8e4m3fn", None, False),
])
def test_first_layers_keep_float_weights_where_the_type_rounds_coarsely(source, tmp_path, capsys, dtype, rule, kept):
    output = tmp_path / f"stem.{dtype}.onnx"
    extra = ["--scale-rule", rule] if rule else []
    assert main(["quantize", str(source), "--dtype", dtype, "-o", str(output), "--no-eval", "--json", *extra]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {row["name"]: row for row in report["tensors"]}
    assert rows["dense_w"]["quantized"]
    for name in ("stem_w", "dw_w"):
        assert rows[name]["quantized"] is not kept, (name, rows[name])
        if kept:
            under = " under the floor rule" if dtype == "mxfp4" else ""
            assert rows[name]["note"] == (f"an image's first layers keep float weights at {dtype}{under}: their "
                                          f"rounding error is amplified by every layer after it")
    if kept:  # the kept weights are the float model's own, read by the Convs directly
        model = onnx.load(str(output))
        stored = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        for init in _stem_model().graph.initializer:
            if init.name != "dense_w":
                assert np.array_equal(stored[init.name], numpy_helper.to_array(init))
    if dtype in ("int4", "uint4", "int2", "int8"):  # onnxruntime runs these DequantizeLinear types
        x = np.random.default_rng(1).normal(0, 1, (1, 3, 8, 8)).astype(np.float32)
        options = ort.SessionOptions()
        options.log_severity_level = 3
        y = ort.InferenceSession(str(output), options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        assert y.shape == (1, C, 8, 8) and np.isfinite(y).all()


def test_a_model_of_only_its_first_layers_is_quantized(tmp_path, capsys):
    """No layer after them amplifies their rounding: a lone image convolution at int4 is quantized."""
    model = _stem_model()
    del model.graph.node[1:]
    model.graph.output[0].name = "s"
    del model.graph.initializer[1:]
    source, output = tmp_path / "lone.onnx", tmp_path / "lone.int4.onnx"
    onnx.save(model, str(source))
    assert main(["quantize", str(source), "--dtype", "int4", "-o", str(output), "--no-eval", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)["tensors"]}
    assert rows["stem_w"]["quantized"]
