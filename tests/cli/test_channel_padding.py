"""Zero channels for onnxruntime's int8 convolution kernels (`onnx_channel_padding`, `--target onnxruntime`).

onnxruntime runs an int8 depthwise QLinearConv in its vectorized kernel only when the channel count is a multiple
of 16, and a dense one only with at least 16 output channels in a multiple of 8 (MLAS `MlasConvSymPackWSize`);
the model here has a 24-channel depthwise convolution inside a MobileNetV3 block (expansion, hard swish,
depthwise 5x5, squeeze-excite with a HardSigmoid gate squeezed to 8 channels, projection), as PP-OCR's classifier
has them. The oracles: onnxruntime's float run of the model before the padding (every real channel computes what
it did), and onnxruntime's int8 run of the model quantized without the padding (the same codes)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from qlinear.cli import main
from qlinear.io.formats import onnx_channel_padding
from qlinear.io.formats.onnx_model import OnnxModel

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

C_IN, C, C_OUT = 8, 24, 16


def _block(depthwise_output: bool = False, concat: bool = False, shared: bool = False) -> onnx.ModelProto:
    rng = np.random.default_rng(5)
    inits, nodes = [], []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def conv(x, out, cin, cout, k, group=1, weight=None):
        w = weight or const(f"{out}_w", rng.normal(0, 0.4, (cout, cin // group, k, k)))
        b = const(f"{out}_b", rng.normal(0, 0.1, cout))
        nodes.append(helper.make_node("Conv", [x, w, b], [out], pads=[k // 2] * 4, group=group, name=f"{out}_conv"))
        return out

    expand = conv("x", "expand", C_IN, C, 1)
    nodes.append(helper.make_node("Add", [expand, const("three", 3.0)], ["hs_a"], name="hs_add"))
    nodes.append(helper.make_node("Clip", ["hs_a", const("lo", 0.0), const("hi", 6.0)], ["hs_c"], name="hs_clip"))
    nodes.append(helper.make_node("Mul", [expand, "hs_c"], ["hs_m"], name="hs_mul"))
    nodes.append(helper.make_node("Div", ["hs_m", const("six", 6.0)], ["hs"], name="hs_div"))
    dw = conv("hs", "dw", C, C, 5, group=C)
    nodes.append(helper.make_node("Relu", [dw], ["dw_relu"], name="dw_relu"))
    nodes.append(helper.make_node("GlobalAveragePool", ["dw_relu"], ["se_pool"], name="se_pool"))
    s1 = conv("se_pool", "se1", C, 8, 1)
    nodes.append(helper.make_node("Relu", [s1], ["se1_relu"], name="se1_relu"))
    s2 = conv("se1_relu", "se2", 8, C, 1)
    nodes.append(helper.make_node("HardSigmoid", [s2], ["gate"], alpha=0.2, beta=0.5, name="se_gate"))
    # A per-channel constant scale after the gate: padded with the rest.
    nodes.append(helper.make_node("Mul", ["dw_relu", "gate"], ["se_out"], name="se_mul"))
    nodes.append(helper.make_node("Mul", ["se_out", const("per_channel", rng.uniform(0.5, 1.5, (C, 1, 1)))],
                                  ["scaled"], name="scaled"))
    project = conv("scaled", "project", C, C_OUT, 1)
    outputs = [helper.make_tensor_value_info(project, TensorProto.FLOAT, ["N", C_OUT, 12, 16])]
    if depthwise_output:
        outputs.append(helper.make_tensor_value_info(dw, TensorProto.FLOAT, None))
    if concat:
        nodes.append(helper.make_node("Concat", ["scaled", "x"], ["joined"], axis=1, name="join"))
        outputs.append(helper.make_tensor_value_info("joined", TensorProto.FLOAT, None))
    if shared:  # a second convolution reads the expansion's weights
        conv("x", "twin", C_IN, C, 1, weight="expand_w")
        outputs.append(helper.make_tensor_value_info("twin", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                               ["N", C_IN, 12, 16])],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _inputs(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1, (count, C_IN, 12, 16)).astype(np.float32)


def _run(model, x: np.ndarray) -> list[np.ndarray]:
    data = model if isinstance(model, (str, bytes)) else model.SerializeToString()
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


def _padded(tmp_path, model) -> tuple[OnnxModel, list]:
    path = tmp_path / "block.onnx"
    onnx.save(model, str(path))
    loaded = OnnxModel(path)
    return loaded, loaded.pad_channels()


def _weights(model) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def test_the_region_gets_zero_channels_and_computes_what_it_did(tmp_path):
    original = _block()
    model, padded = _padded(tmp_path, original)
    assert [(p.depthwise, p.dense, p.channels, p.to) for p in padded] == [
        (["dw_conv"], ["expand_conv", "se2_conv"], 24, 32), ([], ["se1_conv"], 8, 16)]
    onnx.checker.check_model(model.model, full_check=True)
    weights = _weights(model.model)
    assert weights["dw_w"].shape == (32, 1, 5, 5) and weights["expand_w"].shape == (32, C_IN, 1, 1)
    assert weights["se1_w"].shape == (16, 32, 1, 1) and weights["se2_w"].shape == (32, 16, 1, 1)
    assert weights["project_w"].shape == (C_OUT, 32, 1, 1) and weights["per_channel"].shape == (32, 1, 1)
    # The writers of the region write zeros there, its readers read nothing from there.
    for name in ("dw_w", "dw_b", "expand_w", "expand_b", "se2_w", "se2_b"):
        assert not weights[name][C:].any()
    assert not weights["se1_w"][:, C:].any() and not weights["project_w"][:, C:].any()
    assert not weights["se1_w"][8:].any() and not weights["se1_b"][8:].any() and not weights["se2_w"][:, 8:].any()
    group = {a.name: a.i for node in model.model.graph.node if node.name == "dw_conv" for a in node.attribute}
    assert group["group"] == 32
    x = _inputs(4, 1)
    before, after = _run(original, x)[0], _run(model.model, x)[0]
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", ["depthwise_output", "concat", "shared"])
def test_a_region_that_reaches_anything_else_is_left_as_it_is(tmp_path, variant, monkeypatch):
    monkeypatch.setattr(onnx_channel_padding, "DENSE_MINIMUM", 8)  # the squeeze's own region aside
    original = _block(**{variant: True})
    model, padded = _padded(tmp_path, original)
    assert padded == []
    assert model.model.SerializeToString() == original.SerializeToString()


def test_channels_already_aligned_are_not_padded(tmp_path, monkeypatch):
    monkeypatch.setattr(onnx_channel_padding, "MULTIPLE", 8)  # 24 = 3 x 8
    monkeypatch.setattr(onnx_channel_padding, "DENSE_MINIMUM", 8)  # the squeeze's 8
    _, padded = _padded(tmp_path, _block())
    assert padded == []


def _unpadded(monkeypatch) -> None:
    """Every channel count aligned: nothing padded."""
    for name in ("MULTIPLE", "DENSE_MINIMUM", "DENSE_MULTIPLE"):
        monkeypatch.setattr(onnx_channel_padding, name, 1)


@pytest.mark.parametrize(("channels", "depthwise", "expected"), [
    (24, True, 32), (32, True, 32), (200, True, 208),  # depthwise: a multiple of 16
    (8, False, 16), (2, False, 16), (16, False, 16), (20, False, 24), (50, False, 56), (60, False, 64),
    (24, False, 24)])  # dense: at least 16, a multiple of 8 (AVX2's KernelOutputChannelAlignment)
def test_the_counts_onnxruntimes_kernels_take(channels, depthwise, expected):
    assert onnx_channel_padding.aligned(channels, depthwise) == expected


def _narrow(output_reads_it: bool = False) -> onnx.ModelProto:
    """A 1x1 convolution projecting 16 channels to 8 over a 12 x 16 map, a Relu and a residual Add, and a 1x1
    convolution back to 16: the 8-channel tensors are a region of two dense writers and one dense reader."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.normal(0, 0.4, shape).astype(np.float32), name) for name, shape in
             [("a_w", (8, 16, 1, 1)), ("a_b", (8,)), ("b_w", (8, 16, 1, 1)), ("c_w", (16, 8, 1, 1)), ("c_b", (16,))]]
    nodes = [helper.make_node("Conv", ["x", "a_w", "a_b"], ["a"], name="a_conv"),
             helper.make_node("Relu", ["a"], ["a_relu"], name="a_relu"),
             helper.make_node("Conv", ["x", "b_w"], ["b"], name="b_conv"),
             helper.make_node("Add", ["a_relu", "b"], ["sum"], name="sum"),
             helper.make_node("Conv", ["sum", "c_w", "c_b"], ["y"], name="c_conv")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16, 12, 16])]
    if output_reads_it:
        outputs.append(helper.make_tensor_value_info("sum", TensorProto.FLOAT, ["N", 8, 12, 16]))
    graph = helper.make_graph(nodes, "narrow", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                ["N", 16, 12, 16])], outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_a_narrow_dense_output_gets_zero_channels_and_computes_what_it_did(tmp_path):
    original = _narrow()
    model, padded = _padded(tmp_path, original)
    assert [(p.depthwise, p.dense, p.channels, p.to, p.tensors) for p in padded] == [
        ([], ["a_conv", "b_conv"], 8, 16, ["a", "a_relu", "b", "sum"])]
    onnx.checker.check_model(model.model, full_check=True)
    weights = _weights(model.model)
    assert weights["a_w"].shape == weights["b_w"].shape == (16, 16, 1, 1) and weights["c_w"].shape == (16, 16, 1, 1)
    assert not weights["a_w"][8:].any() and not weights["a_b"][8:].any() and not weights["b_w"][8:].any()
    assert not weights["c_w"][:, 8:].any()
    x = np.random.default_rng(4).normal(0, 1, (2, 16, 12, 16)).astype(np.float32)
    np.testing.assert_allclose(_run(model.model, x)[0], _run(original, x)[0], rtol=1e-5, atol=1e-5)


def test_a_narrow_output_that_leaves_the_graph_is_not_padded(tmp_path):
    original = _narrow(output_reads_it=True)
    model, padded = _padded(tmp_path, original)
    assert padded == []
    assert model.model.SerializeToString() == original.SerializeToString()


def test_quantized_narrow_model_gives_the_codes_of_the_unpadded_one(tmp_path, monkeypatch):
    source = tmp_path / "narrow.onnx"
    onnx.save(_narrow(), str(source))
    np.savez(tmp_path / "narrow_cal.npz", x=np.random.default_rng(6).normal(0, 1, (16, 16, 12, 16)).astype(np.float32))

    def quantized(name: str) -> str:
        output = tmp_path / f"{name}.onnx"
        assert main(["quantize", str(source), "--dtype", "int8", "--calibrate", str(tmp_path / "narrow_cal.npz"),
                     "-o", str(output), "--no-eval", "--no-latency", "--report-samples", "0"]) == 0
        return str(output)

    padded = quantized("padded")
    _unpadded(monkeypatch)
    unpadded = quantized("unpadded")
    codes = [t.dims for t in onnx.load(padded).graph.initializer
             if t.name.startswith("a_w") and t.data_type == TensorProto.INT8]
    assert [16, 16, 1, 1] in codes  # the weight's codes (beside its zero points)
    x = np.random.default_rng(7).normal(0, 1, (4, 16, 12, 16)).astype(np.float32)
    np.testing.assert_array_equal(_run(padded, x)[0], _run(unpadded, x)[0])


def _quantize(tmp_path, name: str, *extra: str) -> tuple[dict, str]:
    source = tmp_path / "block.onnx"
    if not source.exists():
        onnx.save(_block(), str(source))
        np.savez(tmp_path / "cal.npz", x=_inputs(16, 2))
    output = tmp_path / f"{name}.onnx"
    samples = [] if "--report-samples" in extra else ["--report-samples", "0"]
    code = main(["quantize", str(source), "--dtype", "int8", "--calibrate", str(tmp_path / "cal.npz"),
                 "-o", str(output), "--no-eval", "--no-latency", *samples, *extra])
    assert code == 0
    return output


def test_quantized_padded_model_gives_the_codes_of_the_unpadded_one(tmp_path, capsys, monkeypatch):
    padded = _quantize(tmp_path, "padded", "--json")
    report = json.loads(capsys.readouterr().out)
    layers = report["activations"]["folded"]["padded"]["layers"]
    assert [(row["depthwise"], row["dense"], row["channels"], row["to"]) for row in layers] == [
        (["dw_conv"], ["expand_conv", "se2_conv"], 24, 32), ([], ["se1_conv"], 8, 16)]
    assert report["model"]["checker"].startswith("passed")
    onnx.checker.check_model(str(padded), full_check=True)
    _unpadded(monkeypatch)
    unpadded = _quantize(tmp_path, "unpadded", "--json")
    assert json.loads(capsys.readouterr().out)["activations"]["folded"]["padded"]["layers"] == []
    x = _inputs(8, 3)
    np.testing.assert_array_equal(_run(str(padded), x)[0], _run(str(unpadded), x)[0])


def test_the_report_says_what_was_padded(tmp_path, capsys):
    _quantize(tmp_path, "shown")
    out = capsys.readouterr().out
    assert "zero channels for onnxruntime's int8 convolution kernels: 2 regions (24->32, 8->16 channels)" in out


def test_qdq_portable_is_not_padded(tmp_path, capsys):
    output = _quantize(tmp_path, "portable", "--target", "qdq-portable", "--json")
    assert "padded" not in json.loads(capsys.readouterr().out)["activations"]["folded"]
    weights = {t.name: t.dims for t in onnx.load(str(output)).graph.initializer}
    assert [d for name, d in weights.items() if name.startswith("dw_w")][0][0] == C


def test_the_per_layer_report_compares_the_real_channels_alone(tmp_path, capsys, monkeypatch):
    """The report's SQNR is the unpadded model's, to the bit: a zero channel holds what a hard swish's ``x + 3``
    makes of 0 (3, quantized) and would count as signal."""
    _quantize(tmp_path, "padded", "--report-samples", "4", "--json")
    padded = json.loads(capsys.readouterr().out)["activations"]["per_layer"]
    _unpadded(monkeypatch)
    _quantize(tmp_path, "unpadded", "--report-samples", "4", "--json")
    unpadded = json.loads(capsys.readouterr().out)["activations"]["per_layer"]
    rows = {row["tensor"]: row["sqnr_db"] for row in unpadded["layers"]}
    assert len(rows) > 5 and {row["tensor"]: row["sqnr_db"] for row in padded["layers"]} == rows
    assert padded["outputs"] == unpadded["outputs"]
