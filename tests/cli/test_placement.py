"""Where `qlinear quantize --calibrate` puts its pairs: `--target onnxruntime` (the default) where onnxruntime's
CPU provider turns them into int8 kernels, and `--target qdq-portable` around every operator a QDQ runtime may
fuse. The oracle of "onnxruntime runs it in int8" is onnxruntime itself: the graph it optimized
(``SessionOptions.optimized_model_filepath``); of the values, onnxruntime without its fusions and onnx's
reference evaluator (`qlinear run`) on the written model, and the float model within quantization error.

The model is built here as Paddle exports a MobileNetV3 block: a stem convolution on a 3-channel image and a
depthwise one after it, convolutions with batch norms and biases as
``Add(x, Reshape(b))``, hard swish as ``x * Clip(x + 3, 0, 6) / 6``, a squeeze-excite block ending in a
HardSigmoid, a residual Add, pooling, a reshape and a MatMul head with a Softmax output, and a float island (a
LayerNorm-like Sub/Pow/ReduceMean chain) that onnxruntime has no int8 kernel for."""

from __future__ import annotations

import json

import numpy as np
import pytest

from qlinear.cli import main

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

C = 8


def _block_model(opset: int = 13) -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    inits, nodes = [], []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value, np.float32 if np.asarray(value).dtype.kind == "f"
                                                        else np.int64), name))
        return name

    def conv(x, out, cin, cout, k, group=1, bias=True):
        w = const(f"{out}_w", rng.normal(0, 0.3, (cout, cin // group, k, k)))
        nodes.append(helper.make_node("Conv", [x, w], [f"{out}_c"], pads=[k // 2] * 4, group=group, name=f"{out}_conv"))
        if not bias:
            return f"{out}_c"
        shape = const(f"{out}_bshape", [1, cout, 1, 1])
        nodes.append(helper.make_node("Reshape", [const(f"{out}_b", rng.normal(0, 0.1, cout)), shape], [f"{out}_rb"]))
        nodes.append(helper.make_node("Add", [f"{out}_c", f"{out}_rb"], [out], name=f"{out}_bias"))
        return out

    def batch_norm(x, out, channels):
        nodes.append(helper.make_node("BatchNormalization", [x, const(f"{out}_g", rng.uniform(0.5, 1.5, channels)),
                                                             const(f"{out}_beta", rng.normal(0, 0.1, channels)),
                                                             const(f"{out}_m", rng.normal(0, 0.1, channels)),
                                                             const(f"{out}_v", rng.uniform(0.5, 1.5, channels))],
                                      [out], name=f"{out}_bn"))
        return out

    def hard_swish(x, out):
        nodes.append(helper.make_node("Add", [x, const(f"{out}_three", 3.0)], [f"{out}_a"], name=f"{out}_add3"))
        nodes.append(helper.make_node("Clip", [f"{out}_a", const(f"{out}_lo", 0.0), const(f"{out}_hi", 6.0)],
                                      [f"{out}_clip"], name=f"{out}_clip"))
        nodes.append(helper.make_node("Mul", [x, f"{out}_clip"], [f"{out}_m"], name=f"{out}_mul"))
        nodes.append(helper.make_node("Div", [f"{out}_m", const(f"{out}_six", 6.0)], [out], name=f"{out}_div"))
        return out

    x = "x"
    # The stem reads the 3-channel image (float for onnxruntime: placement rule 4), the depthwise convolution
    # after it stays float too (rule 5), the expansion after that is int8.
    stem = batch_norm(conv(x, "stem", 3, C, 3, bias=False), "stem_bn", C)
    h = hard_swish(conv(conv(stem, "stem_dw", C, C, 3, group=C, bias=False), "expand", C, C, 1), "hs1")
    d = conv(h, "dw", C, C, 3, group=C)
    r = "dw_relu"
    nodes.append(helper.make_node("Relu", [d], [r], name="dw_relu"))
    # squeeze-excite
    nodes.append(helper.make_node("GlobalAveragePool", [r], ["se_pool"], name="se_pool"))
    s1 = conv("se_pool", "se1", C, 4, 1)
    nodes.append(helper.make_node("Relu", [s1], ["se1_relu"], name="se1_relu"))
    s2 = conv("se1_relu", "se2", 4, C, 1)
    nodes.append(helper.make_node("HardSigmoid", [s2], ["se_gate"], alpha=0.2, beta=0.5, name="se_gate"))
    nodes.append(helper.make_node("Mul", [r, "se_gate"], ["se_out"], name="se_mul"))
    p = conv("se_out", "pw", C, C, 1)
    nodes.append(helper.make_node("Add", [p, h], ["res"], name="residual"))
    # a float island: (res - mean) ** 2 (onnxruntime has no int8 Sub/Pow/ReduceMean)
    nodes.append(helper.make_node("ReduceMean", ["res"], ["mean"], axes=[1], keepdims=1, name="island_mean"))
    nodes.append(helper.make_node("Sub", ["res", "mean"], ["centred"], name="island_sub"))
    nodes.append(helper.make_node("Mul", ["centred", "centred"], ["squared"], name="island_square"))
    q = conv("squared", "post", C, C, 1)
    nodes.append(helper.make_node("MaxPool", [q], ["pooled"], kernel_shape=[2, 2], strides=[2, 2], name="maxpool"))
    nodes.append(helper.make_node("GlobalAveragePool", ["pooled"], ["gap"], name="gap"))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"], axis=1, name="flatten"))
    w = const("head_w", rng.normal(0, 0.3, (C, 5)))
    nodes.append(helper.make_node("MatMul", ["flat", w], ["logits"], name="head"))
    nodes.append(helper.make_node("Softmax", ["logits"], ["probs"], axis=-1, name="softmax"))
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 32, 32])],
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder = tmp_path_factory.mktemp("placement")
    model_path = folder / "block.onnx"
    onnx.save(_block_model(), str(model_path))
    rng = np.random.default_rng(9)
    np.savez(folder / "calibration.npz", x=rng.normal(0, 1, (24, 3, 32, 32)).astype(np.float32))
    return folder, model_path


def _quantize(capsys, *args):
    code = main(["quantize", *map(str, args), "--json"])
    captured = capsys.readouterr()
    return code, (json.loads(captured.out) if code == 0 else None), captured.err


def _optimized(path, tmp_path) -> onnx.ModelProto:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.optimized_model_filepath = str(tmp_path / f"{path.stem}.optimized.onnx")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return onnx.load(options.optimized_model_filepath)


def _ops(model) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in model.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def _run(path, x, level):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = level
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.fixture(scope="module")
def targets(built, tmp_path_factory):
    folder, model_path = built
    out = {}
    for target in ("onnxruntime", "qdq-portable"):
        path = folder / f"{target}.onnx"
        code = main(["quantize", str(model_path), "--dtype", "int8", "--calibrate", str(folder / "calibration.npz"),
                     "-o", str(path), "--target", target, "--no-eval", "--no-latency", "--report-samples", "4",
                     "--json"])
        assert code == 0
        out[target] = path
    return out


def test_onnxruntime_target_runs_every_product_and_its_neighbours_in_int8(targets, tmp_path):
    optimized = _optimized(targets["onnxruntime"], tmp_path)
    ops = _ops(optimized)
    # Every Conv but the stem and the MatMul are int8 kernels; so are the hard swishes (QLinearAdd with the
    # quantized 3, the Clip folded into its QuantizeLinear, the /6 into the next DequantizeLinear's scale,
    # QLinearMul), the squeeze-excite gate (its HardSigmoid folded into the Conv as a Clip), the residual Add and
    # the pools. The stem reads the 3-channel input and stays float (rule 4), and so does the depthwise
    # convolution that reads its output (rule 5): two float Convs.
    assert ops.get("QLinearConv") == 6 and ops.get("QLinearMatMul", 0) + ops.get("QGemm", 0) == 1, ops
    assert ops.get("Conv") == 2, ops
    assert ops.get("QLinearAdd", 0) >= 2 and ops.get("QLinearMul", 0) >= 2, ops
    assert not {"HardSigmoid", "Div", "Clip", "BatchNormalization", "MatMul"} & set(ops), ops
    # The float island (ReduceMean, Sub, Mul) runs in float between one DequantizeLinear and one QuantizeLinear.
    assert {"ReduceMean", "Sub"} <= set(ops)
    portable = _ops(_optimized(targets["qdq-portable"], tmp_path))
    conversions = ops.get("QuantizeLinear", 0) + ops.get("DequantizeLinear", 0)
    assert conversions <= 6, ops  # the depthwise's Q, the island's DQ and Q, the Softmax's DQ
    assert conversions < portable.get("QuantizeLinear", 0) + portable.get("DequantizeLinear", 0), portable
    assert portable.get("QLinearConv") == 8  # qdq-portable quantizes the stem and the depthwise too


def test_the_convolution_of_the_image_input_stays_float_for_onnxruntime(targets, capsys, built, tmp_path):
    """Rule 4: the stem reads the model input (3 channels) with its float weights, no DequantizeLinear in front
    of either, and its output is quantized for the int8 layers after it; the report says why."""
    model = onnx.load(str(targets["onnxruntime"]))
    produced = {o: n for n in model.graph.node for o in n.output}
    stem = next(n for n in model.graph.node if n.name == "stem_conv")
    assert stem.input[0] == "x" and stem.input[1] not in produced or produced[stem.input[1]].op_type == "Constant"
    readers = [n for n in model.graph.node if stem.output[0] in n.input]
    assert [n.name for n in readers] == ["stem_dw_conv"]  # rule 5: float too, below
    folder, model_path = built
    code, report, err = _quantize(capsys, model_path, "--dtype", "int8", "--calibrate", folder / "calibration.npz",
                                  "-o", tmp_path / "stem.onnx", "--no-eval", "--no-latency", "--report-samples", "0")
    assert code == 0, err
    row = next(r for r in report["tensors"] if r["name"] == "stem_w")
    assert not row["quantized"] and "reads the model input x (3 channels)" in row["note"]
    # --keep-float still names its own reason; the other weights are unaffected.
    code, report, err = _quantize(capsys, model_path, "--dtype", "int8", "--calibrate", folder / "calibration.npz",
                                  "-o", tmp_path / "kept.onnx", "--no-eval", "--no-latency", "--report-samples", "0",
                                  "--keep-float", "pw_conv")
    assert code == 0, err
    notes = {r["name"]: r["note"] for r in report["tensors"]}
    assert notes["pw_w"].startswith("--keep-float") and "model input" in notes["stem_w"]
    assert sorted(r["name"] for r in report["tensors"] if r["name"].endswith("_w") and not r["quantized"]) \
        == ["pw_w", "stem_dw_w", "stem_w"]


def test_the_depthwise_convolution_after_the_image_convolution_stays_float_for_onnxruntime(targets, capsys, built,
                                                                                           tmp_path, monkeypatch):
    """Rule 5: the depthwise convolution that reads the stem's output (through its batch norm, folded) keeps its
    float weights and runs float; its output is quantized for the expansion, which runs in int8. The report says
    why; qdq-portable quantizes it; with the rule off only the stem stays float."""
    import qlinear.io.placement.onnxruntime as placement

    model = onnx.load(str(targets["onnxruntime"]))
    produced = {o: n for n in model.graph.node for o in n.output}
    dw = next(n for n in model.graph.node if n.name == "stem_dw_conv")
    assert dw.input[1] not in produced or produced[dw.input[1]].op_type == "Constant"  # float weights
    assert produced[dw.input[0]].name == "stem_conv"  # reads the float stem directly
    assert [n.op_type for n in model.graph.node if dw.output[0] in n.input] == ["QuantizeLinear"]
    expand = next(n for n in model.graph.node if n.name == "expand_conv")
    assert produced[expand.input[0]].op_type == "DequantizeLinear"
    assert produced[expand.input[1]].op_type == "DequantizeLinear"
    portable = onnx.load(str(targets["qdq-portable"]))
    produced = {o: n for n in portable.graph.node for o in n.output}
    assert produced[next(n for n in portable.graph.node if n.name == "stem_dw_conv").input[1]].op_type \
        == "DequantizeLinear"
    folder, model_path = built
    arguments = (model_path, "--dtype", "int8", "--calibrate", folder / "calibration.npz", "--no-eval",
                 "--no-latency", "--report-samples", "0")
    code, report, err = _quantize(capsys, *arguments, "-o", tmp_path / "dw.onnx")
    assert code == 0, err
    notes = {r["name"]: r["note"] for r in report["tensors"] if not r["quantized"]}
    assert notes["stem_dw_w"].startswith("a depthwise convolution reading the output of the float input "
                                         "convolution 'stem_conv': "), notes
    assert sorted(name for name in notes if name.endswith("_w")) == ["stem_dw_w", "stem_w"]
    monkeypatch.setattr(placement, "DEPTHWISE_AFTER_INPUT", False)
    code, report, err = _quantize(capsys, *arguments, "-o", tmp_path / "off.onnx")
    assert code == 0, err
    assert [r["name"] for r in report["tensors"] if r["name"].endswith("_w") and not r["quantized"]] == ["stem_w"]


def _stem_graph(*layers) -> onnx.ModelProto:
    """x (3 channels) -> the stem Conv -> ``layers`` in a chain: ("dw" | "dense" | "relu" | "maxpool", name)."""
    inits = [numpy_helper.from_array(np.ones((C, 3, 3, 3), np.float32), "stem_w")]
    nodes = [helper.make_node("Conv", ["x", "stem_w"], ["t0"], pads=[1] * 4, name="stem")]
    for k, (kind, name) in enumerate(layers, start=1):
        if kind in ("dw", "dense"):
            inits.append(numpy_helper.from_array(np.ones((C, 1 if kind == "dw" else C, 3, 3), np.float32), f"{name}_w"))
            nodes.append(helper.make_node("Conv", [f"t{k - 1}", f"{name}_w"], [f"t{k}"], pads=[1] * 4,
                                          group=C if kind == "dw" else 1, name=name))
        else:
            nodes.append(helper.make_node("Relu" if kind == "relu" else "MaxPool", [f"t{k - 1}"], [f"t{k}"], name=name,
                                          **({} if kind == "relu" else {"kernel_shape": [2, 2]})))
    graph = helper.make_graph(nodes, "stem", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info(f"t{len(layers)}", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize("layers, kept", [
    ((("dw", "dw1"),), ["stem_w", "dw1_w"]),
    ((("relu", "act"), ("maxpool", "pool"), ("dw", "dw1")), ["stem_w", "dw1_w"]),  # through non-products
    ((("dw", "dw1"), ("dw", "dw2")), ["stem_w", "dw1_w"]),  # the first product ends the walk
    ((("dense", "conv1"), ("dw", "dw1")), ["stem_w"]),  # a dense convolution is not rule 5's, nor what follows it
])
def test_rule_5_keeps_the_depthwise_convolutions_right_after_the_input_convolution(layers, kept):
    from qlinear.io.placement.onnxruntime import float_first_layers

    assert list(float_first_layers(_stem_graph(*layers))) == kept


def test_float_island_has_one_pair_at_each_edge(targets):
    """The island ReduceMean -> Sub -> Mul reads one DequantizeLinear (of the residual sum, which QLinearAdd
    writes: in float both its inputs would need one) and ends in one QuantizeLinear (the square needs one
    conversion in int8 or in float, and stays float, as a LayerNorm's last operators do)."""
    model = onnx.load(str(targets["onnxruntime"]))
    produced = {o: n for n in model.graph.node for o in n.output}
    assert produced["mean"].op_type == "ReduceMean" and produced["mean"].input == ["res"]
    assert produced["res"].op_type == "DequantizeLinear"
    assert produced["centred"].op_type == "Sub"
    square = produced[produced[produced["squared"].input[0]].input[0]]
    assert produced["squared"].op_type == "DequantizeLinear" and square.op_type == "Mul"


def test_scale_fold_and_operands_are_exact_dequantizations(targets):
    """The /6 of each hard swish is gone: a DequantizeLinear of the product's codes with the scale times 1/6
    writes its output (float32(scale / 6)), and Add's constant 3 comes from a DequantizeLinear of uint8 codes."""
    model = onnx.load(str(targets["onnxruntime"]))
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    produced = {o: n for n in model.graph.node for o in n.output}
    assert not any(n.op_type == "Div" for n in model.graph.node)
    folded = produced["hs1"]
    assert folded.op_type == "DequantizeLinear"
    codes_q = produced[folded.input[0]]
    pair_scale = inits[codes_q.input[1]]
    assert inits[folded.input[1]] == np.float32(np.float64(pair_scale) / 6.0)
    add = next(n for n in model.graph.node if n.name == "hs1_add3")
    three = produced[add.input[1]]
    assert three.op_type == "DequantizeLinear"
    value = (inits[three.input[0]].astype(np.float64) - inits[three.input[2]]) * inits[three.input[1]]
    assert abs(float(value) - 3.0) <= float(inits[three.input[1]]) / 2


def test_values_agree_with_the_runtimes_and_the_float_model(built, targets):
    import qlinear.onnx

    folder, model_path = built
    x = np.random.default_rng(11).normal(0, 1, (6, 3, 32, 32)).astype(np.float32)
    want = _run(model_path, x, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC)
    for path in targets.values():
        basic = _run(path, x, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC)  # the ONNX semantics
        fused = _run(path, x, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)  # the int8 kernels
        ours = np.asarray(qlinear.onnx.run(path, {"x": x})["probs"])
        assert np.max(np.abs(ours - basic)) <= 0.02, path  # one output step where float rounding moves a Q
        assert np.max(np.abs(fused - basic)) <= 0.05, path
        assert (basic.argmax(1) == want.argmax(1)).mean() >= 5 / 6, path
        assert np.max(np.abs(basic - want)) <= 0.15, path


def test_the_report_says_what_onnxruntime_runs_in_int8(built, capsys, tmp_path):
    folder, model_path = built
    code, report, err = _quantize(capsys, model_path, "--dtype", "int8", "--calibrate", folder / "calibration.npz",
                                  "-o", tmp_path / "timed.onnx", "--no-eval", "--report-samples", "2")
    assert code == 0, err
    activations, latency = report["activations"], report["model"]["latency"]
    assert activations["target"] == "onnxruntime"
    assert {row["kind"] for row in activations["operands"]} == {"operand"}
    assert set(latency["threads"]) == {"1", "2"}
    for figures in latency["threads"].values():
        assert figures["float_ms"] > 0 and figures["quantized_ms"] > 0 and figures["runs"] >= 5
        assert figures["ratio"] == pytest.approx(figures["quantized_ms"] / figures["float_ms"])
    assert latency["batch"] == {"x": [8, 3, 32, 32]}  # a batch of the calibration data: the batch axis is free
    nodes = latency["nodes"]
    assert nodes["int8"]["QLinearConv"] == 6 and "Sub" in nodes["float"] and "island_sub" in nodes["float_nodes"]
    assert nodes["float"]["Conv"] == 2  # the stem (rule 4) and the depthwise after it (rule 5)
    code, report, err = _quantize(capsys, model_path, "--dtype", "int8", "--calibrate", folder / "calibration.npz",
                                  "-o", tmp_path / "untimed.onnx", "--no-eval", "--no-latency", "--report-samples", "0")
    assert code == 0 and "latency" not in report["model"]
    code, _, err = _quantize(capsys, model_path, "--dtype", "int8", "--no-latency", "-o", tmp_path / "w.onnx")
    assert code == 2 and err.count("\n") == 1 and "--no-latency applies to static quantization" in err


def test_target_is_checked(built, capsys, tmp_path):
    folder, model_path = built
    with pytest.raises(SystemExit) as raised:
        main(["quantize", str(model_path), "--dtype", "int8", "--calibrate", str(folder / "calibration.npz"),
              "--target", "tensorrt", "-o", str(tmp_path / "t.onnx")])
    assert raised.value.code == 2
    assert "invalid choice: 'tensorrt'" in capsys.readouterr().err


def _untiled(path, tmp_path):
    """The written model with its gates' Tile nodes taken out again: what placement wrote before
    `broadcast_gates.rewrite`."""
    from qlinear.io.formats.onnx_constants import prune_unused

    model = onnx.load(str(path))
    tiles = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "Tile"}
    for node in model.graph.node:
        node.input[:] = [tiles.get(name, name) for name in node.input]
    prune_unused(model.graph)
    out = tmp_path / f"{path.stem}.untiled.onnx"
    onnx.save(model, str(out))
    return out, model


def test_the_squeeze_excite_gate_is_tiled_to_its_map_for_onnxruntime(targets, capsys, built, tmp_path):
    """onnxruntime's QLinearMul runs a broadcast gate on one thread; the gate's codes are tiled to the map's shape
    between its QuantizeLinear and DequantizeLinear. The oracle of "same values" is the model without the Tile,
    run by onnxruntime (fused and unfused) and by `qlinear run`: identical bits."""
    written = onnx.load(str(targets["onnxruntime"]))
    tiles = [n for n in written.graph.node if n.op_type == "Tile"]
    assert len(tiles) == 1  # the squeeze-excite gate; the hard swishes' products are of equal shapes
    readers = [n for n in written.graph.node if tiles[0].output[0] in n.input]
    assert [r.op_type for r in readers] == ["DequantizeLinear"]
    product = next(n for n in written.graph.node if readers[0].output[0] in n.input)
    assert product.name == "se_mul"
    assert not any(n.op_type == "Tile" for n in onnx.load(str(targets["qdq-portable"])).graph.node)
    untiled, _ = _untiled(targets["onnxruntime"], tmp_path)
    optimized, before = _ops(_optimized(targets["onnxruntime"], tmp_path)), _ops(_optimized(untiled, tmp_path))
    assert optimized.get("QLinearMul") == before.get("QLinearMul") and optimized.get("Tile") == 1, optimized
    assert optimized.get("Transpose", 0) == before.get("Transpose", 0), (optimized, before)
    x = np.random.default_rng(5).normal(0, 1, (3, 3, 32, 32)).astype(np.float32)
    for level in (ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        np.testing.assert_array_equal(_run(targets["onnxruntime"], x, level), _run(untiled, x, level))
    import qlinear.onnx

    np.testing.assert_array_equal(qlinear.onnx.run(targets["onnxruntime"], {"x": x})["probs"],
                                  qlinear.onnx.run(untiled, {"x": x})["probs"])
    folder, model_path = built
    code, report, err = _quantize(capsys, model_path, "--dtype", "int8", "--calibrate", folder / "calibration.npz",
                                  "-o", tmp_path / "gates.onnx", "--no-eval", "--no-latency", "--report-samples", "0")
    assert code == 0, err
    assert report["activations"]["gates_tiled"] == ["se_mul"]


def _gate_graph(gate_shape, readers: int = 1) -> onnx.ModelProto:
    """x [2, 4, 3, 5] times a gate of ``gate_shape``, both through QuantizeLinear -> DequantizeLinear, as placement
    writes them; ``readers`` > 1: the gate's DequantizeLinear is read by an Identity too."""
    inits = [numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(np.uint8(128), "z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("QuantizeLinear", ["g", "s", "z"], ["gq"]),
             helper.make_node("DequantizeLinear", ["gq", "s", "z"], ["gd"]),
             helper.make_node("Mul", ["xd", "gd"], ["y"], name="gate_mul")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 3, 5])]
    if readers > 1:
        nodes.append(helper.make_node("Identity", ["gd"], ["also"]))
        outputs.append(helper.make_tensor_value_info("also", TensorProto.FLOAT, gate_shape))
    graph = helper.make_graph(nodes, "gate", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 3, 5]),
                                              helper.make_tensor_value_info("g", TensorProto.FLOAT, gate_shape)],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize("gate_shape, readers, tiled", [
    ([2, 4, 1, 1], 1, True),
    (["N", 4, 1, 1], 1, True),  # an unknown batch: the gate's and x's are the same sample's
    ([-1, 4, 1, 1], 1, True),  # Paddle's way of writing an unknown batch
    ([2, 1, 1, 1], 1, False),  # one value for every channel: it would still broadcast
    ([1, 4, 1, 1], 1, False),  # one gate for the whole batch
    ([2, 4, 3, 5], 1, False),  # nothing to tile
    ([2, 4, 1, 1], 2, False),  # its DequantizeLinear has another reader
])
def test_which_gates_are_tiled(gate_shape, readers, tiled):
    from onnx.reference import ReferenceEvaluator

    from qlinear.io.placement import broadcast_gates

    model = _gate_graph(gate_shape, readers)
    before = onnx.ModelProto()
    before.CopyFrom(model)
    done = broadcast_gates.rewrite(model)
    assert done == ([("gate_mul", "gd")] if tiled else [])
    onnx.checker.check_model(model, full_check=True)
    rng = np.random.default_rng(1)
    shape = [2 if d in ("N", -1) else d for d in gate_shape]
    feeds = {"x": rng.normal(0, 2, (2, 4, 3, 5)).astype(np.float32), "g": rng.uniform(0, 1, shape).astype(np.float32)}
    for got, want in zip(ReferenceEvaluator(model).run(None, feeds), ReferenceEvaluator(before).run(None, feeds)):
        np.testing.assert_array_equal(got, want)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, feeds)[0], ReferenceEvaluator(before).run(None, feeds)[0])
