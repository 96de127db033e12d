"""`qlinear quantize --rounding`: weights rounded by GPTQ (and HQQ, and the others), calibrated on the user's
samples with the activations float (`--activations float`) or quantized; the models are valid, onnxruntime
runs them, and on the calibration data their output is closer to float's than round-to-nearest's."""

from __future__ import annotations

import json

import numpy as np
import pytest

from qlinear.cli import main

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _model(path, seed=0):
    """x [N, 8, 12, 12] -> Conv 3x3 (32) -> Relu -> Conv 1x1 (48) -> GlobalAveragePool -> Flatten -> MatMul (48x10)."""
    rng = np.random.default_rng(seed)
    weights = [numpy_helper.from_array(rng.standard_normal((32, 8, 3, 3)).astype(np.float32) * 0.2, "w1"),
               numpy_helper.from_array(rng.standard_normal((48, 32, 1, 1)).astype(np.float32) * 0.2, "w2"),
               numpy_helper.from_array(rng.standard_normal((48, 10)).astype(np.float32) * 0.2, "w3")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2"),
             helper.make_node("GlobalAveragePool", ["c2"], ["p"], name="pool"),
             helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
             helper.make_node("MatMul", ["f", "w3"], ["y"], name="fc")]
    graph = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def _data(path, count=48, seed=1):
    rng = np.random.default_rng(seed)
    mixing = rng.standard_normal((8, 8))  # correlated channels: where compensation pays
    x = np.einsum("nchw,cd->ndhw", rng.standard_normal((count, 8, 12, 12)), mixing).astype(np.float32)
    np.savez(path, x=x)
    return x


def _quantize(capsys, *args):
    code = main(["quantize", *map(str, args), "--json", "--force"])
    captured = capsys.readouterr()
    return code, (json.loads(captured.out) if code == 0 else None), captured.err


def _run(path, x, **feeds):
    """The model's first output for input ``x`` (and the other inputs ``feeds``) in onnxruntime, unoptimized."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    # onnxruntime 1.32's graph optimizations compute blocked int2 DequantizeLinear wrongly, and differently
    # from session to session (docs/semantics.md); unoptimized it agrees with onnx's reference and qlinear.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x, **feeds})[0]


@pytest.fixture
def net(tmp_path):
    model, data = tmp_path / "net.onnx", tmp_path / "calib.npz"
    _model(model)
    return model, data, _data(data)


@pytest.mark.parametrize("dtype", ["int4", "uint4", "int2"])
def test_gptq_weights_only_beats_round_to_nearest_on_the_models_output(net, tmp_path, capsys, dtype):
    model, data, x = net
    reference = _run(model, x)
    errors = {}
    for method in ("rtn", "gptq"):
        out = tmp_path / f"net.{method}.onnx"
        extra = ["--calibrate", data, "--activations", "float"] if method == "gptq" else []
        code, report, err = _quantize(capsys, model, "--dtype", dtype, "-o", out, "--rounding", method, *extra)
        assert code == 0, err
        assert report["model"]["checker"] == "passed"
        rows = [r for r in report["tensors"] if r["quantized"]]
        assert len(rows) == 3
        if method == "gptq":
            for row in rows:
                assert row["rounding"] == "gptq"
                assert row["output_sqnr_db"]["gptq"] > row["output_sqnr_db"]["rtn"], row
        errors[method] = float(np.mean((_run(out, x) - reference) ** 2))
    assert errors["gptq"] < 0.8 * errors["rtn"], errors


def test_the_default_rounding_is_gptq_given_samples_hqq_without_below_8_bits_and_rtn_otherwise(net, tmp_path, capsys):
    model, data, _ = net
    code, report, err = _quantize(capsys, model, "--dtype", "int4", "-o", tmp_path / "a.onnx", "--calibrate", data,
                                  "--activations", "float")
    assert code == 0, err
    assert {r.get("rounding") for r in report["tensors"] if r["quantized"]} == {"gptq"}
    code, report, err = _quantize(capsys, model, "--dtype", "int4", "-o", tmp_path / "b.onnx")
    assert code == 0, err
    assert {r.get("rounding") for r in report["tensors"] if r["quantized"]} == {"hqq"}
    code, report, err = _quantize(capsys, model, "--dtype", "mxfp4", "-o", tmp_path / "d.onnx")
    assert code == 0, err
    assert all("rounding" not in r for r in report["tensors"])
    code, report, err = _quantize(capsys, model, "--dtype", "int8", "-o", tmp_path / "c.onnx", "--calibrate", data,
                                  "--activations", "float")
    assert code == 0, err
    assert all("rounding" not in r for r in report["tensors"])


@pytest.mark.parametrize("method", ["awq", "adaround"])
def test_awq_and_adaround_weights_only_beat_round_to_nearest(net, tmp_path, capsys, method):
    model, data, x = net
    reference = _run(model, x)
    errors = {}
    for name in ("rtn", method):
        out = tmp_path / f"net.{name}.onnx"
        code, report, err = _quantize(capsys, model, "--dtype", "int4", "-o", out, "--rounding", name, "--calibrate",
                                      data, "--activations", "float")
        assert code == 0, err
        assert report["model"]["checker"] == "passed"
        if name == method:
            for row in (r for r in report["tensors"] if r["quantized"]):
                assert row["rounding"] == method
                assert row["output_sqnr_db"][method] >= row["output_sqnr_db"]["rtn"], row
        errors[name] = float(np.mean((_run(out, x) - reference) ** 2))
        divs = [n for n in onnx.load(str(out)).graph.node if n.op_type == "Div"]
        if name == "awq":  # each layer's input divided by its channel scales: conv2's folded into conv1 (past the
            # Relu), the model input's and fc's (past a Flatten) by Div nodes
            assert report["model"]["channel_scales"]["folded"] == [{"layer": "conv2", "into": "conv1"}]
            assert sorted(report["model"]["channel_scales"]["divided"]) == ["conv1", "fc"]
            assert report["model"]["channel_scales"]["max_difference"] < 1e-4
            assert [d.output[0] for d in divs] == ["x_scaled", "f_scaled"]
        else:
            assert divs == []
    assert errors[method] < errors["rtn"], errors


def test_gptq_with_quantized_activations(net, tmp_path, capsys):
    model, data, x = net
    out = tmp_path / "static.onnx"
    code, report, err = _quantize(capsys, model, "--dtype", "int4", "-o", out, "--calibrate", data, "--rounding", "gptq",
                                  "--no-latency", "--report-samples", "4")
    assert code == 0, err
    assert report["model"]["checker"] == "passed"
    assert report["activations"]["pairs"] > 0
    assert all(r.get("rounding") == "gptq" for r in report["tensors"] if r["quantized"] and len(r["shape"]) > 1)
    assert np.isfinite(_run(out, x)).all()


@pytest.mark.parametrize("granularity,folds", [(["--granularity", "axis", "--axis", "0"], True),
                                               (["--granularity", "tensor"], False)])
def test_awq_folds_into_a_rounded_writer_only_where_its_groups_lie_in_its_output_channels(net, tmp_path, capsys,
                                                                                       monkeypatch, granularity, folds):
    """conv1's weight is rounded too: per output channel its codes stay and its channels' scales are divided by
    conv2's channel scales, and the model computes what the same codes with a Div before conv2 compute; per
    tensor one scale cannot be divided per channel, so conv2's input gets a Div."""
    from qlinear.io.formats import onnx_channel_scales

    model, data, x = net
    args = ["--dtype", "int4", *granularity, "--rounding", "awq", "--calibrate", data, "--activations", "float",
            "--no-bias-correction"]
    code, report, err = _quantize(capsys, model, "-o", tmp_path / "awq.onnx", *args)
    assert code == 0, err
    scales = report["model"]["channel_scales"]
    assert scales["folded"] == ([{"layer": "conv2", "into": "conv1"}] if folds else [])
    assert sorted(scales["divided"]) == (["conv1", "fc"] if folds else ["conv1", "conv2", "fc"])
    monkeypatch.setattr(onnx_channel_scales, "writer_of", lambda *args: None)  # every division a Div
    code, divided, err = _quantize(capsys, model, "-o", tmp_path / "divided.onnx", *args)
    assert code == 0, err
    assert sorted(divided["model"]["channel_scales"]["divided"]) == ["conv1", "conv2", "fc"]
    got, expected = _run(tmp_path / "awq.onnx", x), _run(tmp_path / "divided.onnx", x)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5 * float(np.abs(expected).max()))


def test_awq_with_quantized_activations_keeps_each_layer_next_to_its_input_pair(net, tmp_path, capsys):
    """The division by AWQ's channel scales goes before the activation's QuantizeLinear (folded into conv1, or a
    Div), whose parameters are calibrated on the divided tensor: every Conv and MatMul still reads a
    DequantizeLinear, as onnxruntime's QDQ fusion needs, and the model is closer to float than round to nearest's."""
    model, data, x = net
    reference = _run(model, x)
    errors = {}
    for method in ("rtn", "awq"):
        out = tmp_path / f"static.{method}.onnx"
        code, report, err = _quantize(capsys, model, "--dtype", "int4", "-o", out, "--calibrate", data, "--rounding",
                                      method, "--no-latency", "--report-samples", "4")
        assert code == 0, err
        assert report["model"]["checker"] == "passed"
        graph = onnx.load(str(out)).graph
        producers = {o: n for n in graph.node for o in n.output}
        for node in graph.node:
            if node.op_type in ("Conv", "MatMul"):
                assert producers[node.input[0]].op_type == "DequantizeLinear", node.name
        if method == "awq":
            assert report["model"]["channel_scales"]["folded"] == [{"layer": "conv2", "into": "conv1"}]
            divided = [n.output[0] for n in graph.node if n.op_type == "Div"]
            assert len(divided) == 2  # the model input's and fc's (past a Flatten)
            # each divided tensor has its own pair, calibrated on it
            readers = {n.input[0]: n.op_type for n in graph.node}
            assert [readers[name] for name in divided] == ["QuantizeLinear"] * 2
        errors[method] = float(np.mean((_run(out, x) - reference) ** 2))
    assert errors["awq"] < errors["rtn"], errors
    assert main(["quantize", str(model), "--dtype", "int4", "-o", str(tmp_path / "text.onnx"), "--calibrate", str(data),
                 "--rounding", "awq", "--no-latency", "--report-samples", "0"]) == 0
    assert "awq: 1 layers' inputs divided by their channel scales in the layer before them, 2 by a Div node" in \
        capsys.readouterr().out


def test_hqq_needs_no_data_and_beats_round_to_nearest(net, tmp_path, capsys):
    model, _, x = net
    reference = _run(model, x)
    errors = {}
    for method in ("rtn", "hqq"):
        out = tmp_path / f"{method}.onnx"
        code, report, err = _quantize(capsys, model, "--dtype", "uint4", "-o", out, "--rounding", method)
        assert code == 0, err
        errors[method] = float(np.mean((_run(out, x) - reference) ** 2))
    assert errors["hqq"] < errors["rtn"], errors


@pytest.mark.parametrize("dtype", ["mxfp4", "nvfp4"])
def test_gptq_rounds_the_microscaling_formats(net, tmp_path, capsys, dtype):
    model, data, _ = net
    code, report, err = _quantize(capsys, model, "--dtype", dtype, "-o", tmp_path / f"{dtype}.onnx", "--calibrate", data,
                                  "--activations", "float", "--rounding", "gptq")
    assert code == 0, err
    assert report["model"]["checker"] == "passed"
    for row in report["tensors"]:
        if row["quantized"] and row["name"] != "w3":  # w3: 48 inputs, a short second block
            assert row["output_sqnr_db"]["gptq"] > row["output_sqnr_db"]["rtn"], row


def test_mxfp4_with_gptq_takes_the_even_scale_rule_unless_one_is_given(net, tmp_path, capsys):
    model, data, _ = net
    cases = ((("--calibrate", data, "--activations", "float"), "even"),  # the default measured on the corpus
             (("--calibrate", data, "--activations", "float", "--scale-rule", "floor"), "floor"),
             (("--calibrate", data, "--activations", "float", "--rounding", "rtn"), "floor"),
             ((), "floor"))
    for index, (options, rule) in enumerate(cases):
        code, report, err = _quantize(capsys, model, "--dtype", "mxfp4", "-o", tmp_path / f"{index}.onnx", *options)
        assert code == 0, err
        assert {r.get("scale_rule") for r in report["tensors"] if r["quantized"]} == {rule}, options
    code = main(["quantize", str(model), "--dtype", "mxfp4", "-o", str(tmp_path / "t.onnx"), "--force", "--calibrate",
                 str(data), "--activations", "float"])
    assert code == 0
    assert "MX scale rule: even" in capsys.readouterr().out


def _if_model(path, w, named=True, outer=False):
    """y = If(c, then: MatMul(x, w) named "mm", else: Identity(x)); ``outer``: w stored by the main graph, not the
    branch."""
    stored = [numpy_helper.from_array(w, "w")]
    branch = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["t"], name="mm")], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)], [] if outer else stored)
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("If", ["c"], ["y"], name="choose" if named else "", then_branch=branch,
                              else_branch=other)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None),
                                           helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], stored if outer else [])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def _plain_model(path, w):
    """The If model's then branch as the whole model (c read by nothing)."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None),
                                           helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.mark.parametrize("conditions,note,method", [(None, "", "gptq"), ([False] * 6, "never take", "gptq"),
                                                    ([True, False] * 3, "", "gptq"), (None, "", "awq")])
def test_a_weight_in_the_if_branch_the_samples_take_is_rounded_as_in_a_model_without_the_if(tmp_path, capsys,
                                                                                              conditions, note,
                                                                                              method):
    """The samples' If branch is inlined to collect its layers' inputs: its weight gets the codes gptq (or awq,
    its input divided by the channel scales in the branch) gives the same layer in a model without the If,
    calibrated on the samples that take the branch (the oracle); a branch no sample takes is rounded to nearest
    and the row says why."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((16, 4)).astype(np.float32)
    x = (rng.standard_normal((6, 2, 16)) @ rng.standard_normal((16, 16))).astype(np.float32)
    c = np.array(conditions if conditions is not None else [True] * 6, bool)
    np.savez(tmp_path / "if.npz", x=x, c=c)
    np.savez(tmp_path / "plain.npz", x=x[c], c=c[c])  # the samples that take the branch
    outputs = {}
    for name, make in (("if", _if_model), ("plain", _plain_model)):
        make(tmp_path / f"{name}.onnx", w)
        if name == "plain" and note:
            continue
        code, report, err = _quantize(capsys, tmp_path / f"{name}.onnx", "--dtype", "int4", "-o",
                                      tmp_path / f"{name}.q.onnx", "--calibrate", tmp_path / f"{name}.npz",
                                      "--activations", "float",
                                      "--rounding", method, "--min-elements", "1")
        assert code == 0, err
        row = next(r for r in report["tensors"] if r["name"] == "w")
        if name == "if":
            assert row["rounding"] == (method if not note else "rtn"), row
            assert note in row.get("note", "")
        if method == "awq":  # the input divided by a Div node, in the branch where the weight is
            assert report["model"]["channel_scales"]["divided"] == ["mm"], report["model"]["channel_scales"]
            written = onnx.load(str(tmp_path / f"{name}.q.onnx")).graph
            graph = next(a.g for n in written.node if n.op_type == "If" for a in n.attribute
                         if a.name == "then_branch") if name == "if" else written
            assert [n.op_type for n in graph.node if n.op_type in ("Div", "MatMul")] == ["Div", "MatMul"]
        outputs[name] = _run(tmp_path / f"{name}.q.onnx", x[0], c=np.array(True))
    if not note:
        np.testing.assert_array_equal(outputs["if"], outputs["plain"])


def _nested_if_model(path, w):
    """y = If(c, then: If(d, then: MatMul(x, w) named "mm", else: Identity(x)), else: Identity(x))."""
    inner_then = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["t"], name="mm")], "inner_then", [],
                                   [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)],
                                   [numpy_helper.from_array(w, "w")])
    inner_else = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "inner_else", [],
                                   [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    outer_then = helper.make_graph([helper.make_node("If", ["d"], ["inner"], name="inner", then_branch=inner_then,
                                                     else_branch=inner_else)], "outer_then", [],
                                   [helper.make_tensor_value_info("inner", TensorProto.FLOAT, None)])
    outer_else = helper.make_graph([helper.make_node("Identity", ["x"], ["o"])], "outer_else", [],
                                   [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)])
    graph = helper.make_graph([helper.make_node("If", ["c"], ["y"], name="outer", then_branch=outer_then,
                                                else_branch=outer_else)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                               helper.make_tensor_value_info("d", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_a_weight_in_a_nested_if_is_rounded_on_the_samples_that_reach_it(tmp_path, capsys):
    """The outer If is inlined, the inner If's condition read on that model over the samples that take the outer
    branch, and the inner branch inlined in turn: the weight's codes are those of the same layer without the Ifs,
    calibrated on the samples that take both branches (the oracle)."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((16, 4)).astype(np.float32)
    x = (rng.standard_normal((8, 2, 16)) @ rng.standard_normal((16, 16))).astype(np.float32)
    c = np.array([True, True, False, True, True, False, True, True])
    d = np.array([True, False, True, True, True, False, False, True])
    both = c & d
    np.savez(tmp_path / "nested.npz", x=x, c=c, d=d)
    np.savez(tmp_path / "plain.npz", x=x[both], c=c[both])
    _nested_if_model(tmp_path / "nested.onnx", w)
    _plain_model(tmp_path / "plain.onnx", w)
    outputs = {}
    for name in ("nested", "plain"):
        code, report, err = _quantize(capsys, tmp_path / f"{name}.onnx", "--dtype", "int4", "-o",
                                      tmp_path / f"{name}.q.onnx", "--calibrate", tmp_path / f"{name}.npz",
                                      "--activations", "float", "--rounding", "gptq", "--min-elements", "1")
        assert code == 0, err
        row = next(r for r in report["tensors"] if r["name"] == "w")
        assert row["rounding"] == "gptq", row
        more = {"d": np.array(True)} if name == "nested" else {}
        outputs[name] = _run(tmp_path / f"{name}.q.onnx", x[0], c=np.array(True), **more)
    np.testing.assert_array_equal(outputs["nested"], outputs["plain"])


def test_a_main_graph_weight_read_inside_a_branch(tmp_path, capsys):
    """gptq collects the branch's layer for a weight the main graph stores; awq, which would write its division
    in the weight's own graph, rounds it to nearest and says why (no traceback)."""
    rng = np.random.default_rng(6)
    w = rng.standard_normal((16, 4)).astype(np.float32)
    _if_model(tmp_path / "m.onnx", w, outer=True)
    np.savez(tmp_path / "d.npz", x=(rng.standard_normal((6, 2, 16)) @ rng.standard_normal((16, 16))).astype(np.float32),
             c=np.ones(6, bool))
    for method, expected in (("gptq", "gptq"), ("awq", "rtn")):
        code, report, err = _quantize(capsys, tmp_path / "m.onnx", "--dtype", "int4", "--min-elements", "1", "-o",
                                      tmp_path / f"{method}.onnx", "--calibrate", tmp_path / "d.npz",
                                      "--activations", "float", "--rounding", method)
        assert code == 0, err
        row = next(r for r in report["tensors"] if r["name"] == "w")
        assert row["rounding"] == expected, row
    assert "in the weight's own graph" in row["note"]


def test_a_weight_inside_an_unnamed_if_is_rounded_to_nearest_and_said_so(tmp_path, capsys):
    rng = np.random.default_rng(3)
    _if_model(tmp_path / "if.onnx", rng.standard_normal((16, 4)).astype(np.float32), named=False)
    data = tmp_path / "d.npz"
    np.savez(data, x=rng.standard_normal((4, 2, 16)).astype(np.float32), c=np.ones((4,), bool))
    code, report, err = _quantize(capsys, tmp_path / "if.onnx", "--dtype", "int4", "-o", tmp_path / "o.onnx",
                                  "--calibrate", data, "--activations", "float", "--rounding", "gptq",
                                  "--min-elements", "1")
    assert code == 0, err
    row = next(r for r in report["tensors"] if r["name"] == "w")
    assert row["rounding"] == "rtn" and "subgraph" in row["note"]


@pytest.mark.parametrize("args,message", [
    (["--dtype", "int4", "--rounding", "gptq"], "--calibrate"),
    (["--dtype", "mxfp4", "--rounding", "hqq"], "integer zero point"),
    (["--dtype", "int4", "--rounding", "awq"], "--calibrate"),
    (["--dtype", "nvfp4", "--rounding", "adaround"], "integer codes"),
    (["--dtype", "int4", "--calibrate", "DATA", "--activations", "float", "--method", "minmax"], "--method"),
    (["--dtype", "int4", "--rounding", "median"], "invalid choice"),
])
def test_bad_rounding_arguments_are_one_line_and_exit_2(net, tmp_path, capsys, args, message):
    model, data, _ = net
    args = [str(data) if a == "DATA" else a for a in args]
    try:
        code = main(["quantize", str(model), "-o", str(tmp_path / "o.onnx"), *args])
    except SystemExit as stop:  # argparse's own refusals
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and len(err.strip().splitlines()) <= 2, err
    assert not (tmp_path / "o.onnx").exists()


def test_rounding_a_tensor_file_is_refused(tmp_path, capsys):
    source = tmp_path / "w.npy"
    np.save(source, np.ones((4, 64), np.float32))
    code = main(["quantize", str(source), "--dtype", "int4", "--rounding", "hqq"])
    err = capsys.readouterr().err
    assert code == 2 and "ONNX models" in err


def test_gptq_rounds_lstm_weights_against_their_inputs_and_states(tmp_path, capsys):
    rng = np.random.default_rng(5)
    hidden, size = 32, 48
    w = numpy_helper.from_array((rng.standard_normal((2, 4 * hidden, size)) * 0.3).astype(np.float32), "W")
    r = numpy_helper.from_array((rng.standard_normal((2, 4 * hidden, hidden)) * 0.3).astype(np.float32), "R")
    nodes = [helper.make_node("Transpose", ["x"], ["sequence"], perm=[1, 0, 2]),  # batch first, as PyTorch exports
             helper.make_node("LSTM", ["sequence", "W", "R"], ["y"], name="lstm", hidden_size=hidden,
                              direction="bidirectional")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, r])
    model = tmp_path / "lstm.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    data = tmp_path / "d.npz"
    mixing = rng.standard_normal((size, size))
    np.savez(data, x=np.einsum("ntk,kl->ntl", rng.standard_normal((32, 6, size)), mixing).astype(np.float32))
    code, report, err = _quantize(capsys, model, "--dtype", "int4", "-o", tmp_path / "o.onnx", "--calibrate", data,
                                  "--activations", "float")
    assert code == 0, err
    assert report["model"]["checker"] == "passed"
    for row in (r for r in report["tensors"] if r["quantized"]):
        assert row["rounding"] == "gptq"
        # W reads the correlated sequence; R the hidden states of a random LSTM, nearly uncorrelated
        margin = 1.0 if row["name"] == "W" else 0.0
        assert row["output_sqnr_db"]["gptq"] > row["output_sqnr_db"]["rtn"] + margin, row


def _lstm_model(path, w, r, chain: bool):
    """A one-direction LSTM whose W and R are ``w`` and ``r`` [4H, I] with their gate blocks in PyTorch's order
    (i, f, g, o): reordered to ONNX's (i, o, f, c) through Slice -> Concat -> Unsqueeze as PyTorch exports them
    (``chain``), or stored already reordered, [1, 4H, I], and read directly."""
    hidden = w.shape[0] // 4
    order = [0, 3, 1, 2]  # ONNX's gates from PyTorch's blocks
    inits, nodes = [], [helper.make_node("Transpose", ["x"], ["sequence"], perm=[1, 0, 2])]
    for name, value in (("W", w), ("R", r)):
        if not chain:
            reordered = np.concatenate([value[g * hidden:(g + 1) * hidden] for g in order])[None]
            inits.append(numpy_helper.from_array(reordered, name))
            continue
        inits.append(numpy_helper.from_array(value, f"{name}_torch"))
        for g in order:
            for suffix, v in (("start", g * hidden), ("end", (g + 1) * hidden)):
                inits.append(numpy_helper.from_array(np.array([v], np.int64), f"{name}_{g}_{suffix}"))
            nodes.append(helper.make_node("Slice", [f"{name}_torch", f"{name}_{g}_start", f"{name}_{g}_end"],
                                          [f"{name}_gate{g}"]))
        nodes.append(helper.make_node("Concat", [f"{name}_gate{g}" for g in order], [f"{name}_2d"], axis=0))
        nodes.append(helper.make_node("Unsqueeze", [f"{name}_2d", "axes0"], [name]))
    inits.append(numpy_helper.from_array(np.array([0], np.int64), "axes0"))
    nodes.append(helper.make_node("LSTM", ["sequence", "W", "R"], ["y"], name="lstm", hidden_size=hidden))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, w.shape[1]])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_lstm_weights_read_through_pytorch_s_gate_reordering_are_rounded_as_read_directly(tmp_path, capsys):
    """W and R reach the LSTM through Slice -> Concat -> Unsqueeze (PyTorch's gate order to ONNX's): every row is
    weighed by the same Hessian, so gptq rounds them against the LSTM's inputs and states as it rounds the same
    weights stored reordered (the oracle): the two quantized models compute the same bits."""
    rng = np.random.default_rng(8)
    hidden, size = 16, 32
    w = (rng.standard_normal((4 * hidden, size)) * 0.3).astype(np.float32)
    r = (rng.standard_normal((4 * hidden, hidden)) * 0.3).astype(np.float32)
    x = np.einsum("ntk,kl->ntl", rng.standard_normal((24, 6, size)), rng.standard_normal((size, size)))
    x = x.astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x)
    outputs = {}
    for name, chain in (("chain", True), ("direct", False)):
        _lstm_model(tmp_path / f"{name}.onnx", w, r, chain)
        code, report, err = _quantize(capsys, tmp_path / f"{name}.onnx", "--dtype", "int4", "-o",
                                      tmp_path / f"{name}.q.onnx", "--calibrate", tmp_path / "d.npz",
                                      "--activations", "float")
        assert code == 0, err
        rows = {row["name"]: row for row in report["tensors"] if row.get("quantized")}
        assert {row.get("rounding") for row in rows.values()} == {"gptq"}, rows
        assert len(rows) == 2
        outputs[name] = _run(tmp_path / f"{name}.q.onnx", x[:1])
    np.testing.assert_array_equal(outputs["chain"], outputs["direct"])


def test_a_weight_two_layers_read_is_rounded_against_both_inputs(tmp_path, capsys):
    """One Gemm weight read by two Gemm nodes, on two differently correlated inputs: gptq weighs its error by
    the sum of their Hessians, and both layers' outputs on the samples move less than round to nearest's."""
    rng = np.random.default_rng(2)
    w = (rng.standard_normal((8, 64)) * 0.3).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["a", "w"], ["ya"], name="first", transB=1),
             helper.make_node("Gemm", ["b", "w"], ["yb"], name="second", transB=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, 64]) for n in "ab"],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("ya", "yb")],
                              [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    a = (rng.standard_normal((200, 64)) @ rng.standard_normal((64, 64))).astype(np.float32)
    b = (rng.standard_normal((200, 64)) @ rng.standard_normal((64, 64))).astype(np.float32)
    np.savez(tmp_path / "d.npz", a=a, b=b)
    errors = {}
    for method in ("gptq", "rtn"):
        code, report, err = _quantize(capsys, tmp_path / "m.onnx", "--dtype", "int4", "-o", tmp_path / f"{method}.onnx",
                                      "--calibrate", tmp_path / "d.npz", "--activations", "float", "--rounding", method)
        assert code == 0, err
        if method == "gptq":
            row = next(r for r in report["tensors"] if r["name"] == "w")
            assert row["rounding"] == "gptq", row
        session = ort.InferenceSession(str(tmp_path / f"{method}.onnx"), providers=["CPUExecutionProvider"])
        ya, yb = session.run(None, {"a": a, "b": b})
        errors[method] = [float(np.sum((ya - a @ w.T) ** 2)), float(np.sum((yb - b @ w.T) ** 2))]
    assert errors["gptq"][0] < errors["rtn"][0] and errors["gptq"][1] < errors["rtn"][1], errors


def test_samples_the_model_cannot_run_are_one_line_and_exit_2(net, tmp_path, capsys):
    model, _, _ = net
    data = tmp_path / "wrong.npz"
    np.savez(data, x=np.zeros((4, 3, 5, 5), np.float32))  # 3 channels where the model takes 8
    code = main(["quantize", str(model), "--dtype", "int4", "-o", str(tmp_path / "o.onnx"), "--calibrate", str(data),
                 "--activations", "float"])
    err = capsys.readouterr().err
    assert code == 2 and "does not run on sample 0" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o.onnx").exists()


def test_hessians_beyond_the_budget_are_collected_in_groups_with_the_same_codes(net, tmp_path, capsys, monkeypatch):
    from qlinear.io import weight_rounding

    model, data, _ = net
    written, passes = {}, []
    collect = weight_rounding.hessians.collect
    monkeypatch.setattr(weight_rounding.hessians, "collect", lambda *a, **k: passes.append(1) or collect(*a, **k))
    for budget in (weight_rounding.HESSIAN_BUDGET, 1):  # 1 byte: every layer a group of its own, a pass each
        monkeypatch.setattr(weight_rounding, "HESSIAN_BUDGET", budget)
        out = tmp_path / f"net.{budget}.onnx"
        code, report, err = _quantize(capsys, model, "--dtype", "int4", "-o", out, "--calibrate", data,
                                      "--activations", "float")
        assert code == 0, err
        written[budget] = {i.name: i.raw_data for i in onnx.load(str(out)).graph.initializer}
    assert len(passes) == 1 + 3  # one pass for the three layers, then one each
    first, second = written.values()
    assert first == second


def test_the_same_model_is_written_on_every_run_and_thread_count(net, tmp_path):
    import os
    import subprocess
    import sys

    model, data, _ = net
    written = set()
    for run, threads in enumerate(("1", "2", "2")):
        out = tmp_path / f"net.{run}.onnx"
        env = dict(os.environ, OPENBLAS_NUM_THREADS=threads, OMP_NUM_THREADS=threads, NUMBA_NUM_THREADS=threads)
        result = subprocess.run([sys.executable, "-m", "qlinear", "quantize", str(model), "--dtype", "int4", "-o",
                                 str(out), "--calibrate", str(data), "--activations", "float", "--no-eval"],
                                capture_output=True, text=True, env=env, timeout=300)
        assert result.returncode == 0, result.stderr
        written.add(out.read_bytes())
    assert len(written) == 1


@pytest.mark.parametrize("method", ["gptq", "awq", "adaround"])
def test_a_model_with_external_data_is_rounded_as_the_same_model_inline(net, tmp_path, capsys, method):
    """The calibration runs read the weights from the model's data file (onnxruntime's external-initializers
    folder); the codes written are the ones the inline model gets, and the output keeps its data file."""
    model, data, x = net
    external = tmp_path / "ext" / "net.onnx"
    external.parent.mkdir()
    onnx.save(onnx.load(str(model)), str(external), save_as_external_data=True, all_tensors_to_one_file=True,
              location="net.onnx.data", size_threshold=0)
    assert not onnx.load(str(external), load_external_data=False).graph.initializer[0].raw_data
    written = {}
    for source in (model, external):
        out = tmp_path / f"out.{source.parent.name}" / "net.q.onnx"
        out.parent.mkdir()
        code, report, err = _quantize(capsys, source, "--dtype", "int4", "-o", out, "--rounding", method,
                                      "--calibrate", data, "--activations", "float")
        assert code == 0, err
        assert report["model"]["checker"] == "passed"
        assert {r["rounding"] for r in report["tensors"] if r["quantized"]} == {method}
        loaded = onnx.load(str(out))  # with its data file, if any
        written[source] = ({t.name: numpy_helper.to_array(t).tobytes() for t in loaded.graph.initializer},
                           _run(out, x))
    (inline, inline_y), (from_file, from_file_y) = written.values()
    assert inline == from_file
    assert np.array_equal(inline_y, from_file_y)
    assert (tmp_path / "out.ext" / "net.q.onnx.data").is_file()


def _bn_model(path):
    """x [N, 8, 12, 12] -> Conv 3x3 (16) -> BatchNormalization -> Relu -> Conv 1x1 (24) -> GlobalAveragePool ->
    Flatten -> MatMul (24x10): a batch norm to fold before static quantization."""
    rng = np.random.default_rng(5)
    arrays = {"w1": rng.standard_normal((16, 8, 3, 3)) * 0.2, "g": rng.uniform(0.5, 1.5, 16),
              "b": rng.normal(0, 0.1, 16), "m": rng.normal(0, 0.1, 16), "v": rng.uniform(0.5, 1.5, 16),
              "w2": rng.standard_normal((24, 16, 1, 1)) * 0.2, "w3": rng.standard_normal((24, 10)) * 0.2}
    weights = [numpy_helper.from_array(a.astype(np.float32), name) for name, a in arrays.items()]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c1", "g", "b", "m", "v"], ["n1"], name="bn1"),
             helper.make_node("Relu", ["n1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2"),
             helper.make_node("GlobalAveragePool", ["c2"], ["p"], name="pool"),
             helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
             helper.make_node("MatMul", ["f", "w3"], ["y"], name="fc")]
    graph = helper.make_graph(nodes, "bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.mark.parametrize("rounding", ["rtn", "gptq"])
def test_a_model_with_external_data_is_quantized_statically_as_the_same_model_inline(tmp_path, capsys, rounding):
    """Static int8 (and int4 gptq with quantized activations) of a model whose weights are in a data file: the
    batch norm folded and checked, the activations calibrated and compared layer by layer reading the input's
    data file, then the output's; the same codes, scales and report figures as the inline model's."""
    model, data = tmp_path / "bn.onnx", tmp_path / "calib.npz"
    _bn_model(model)
    x = _data(data, count=24)
    external = tmp_path / "ext" / "bn.onnx"
    external.parent.mkdir()
    onnx.save(onnx.load(str(model)), str(external), save_as_external_data=True, all_tensors_to_one_file=True,
              location="bn.onnx.data", size_threshold=0)
    args = ["--dtype", "int8"] if rounding == "rtn" else ["--dtype", "int4", "--rounding", "gptq"]
    written = {}
    for source in (model, external):
        out = tmp_path / f"out.{source.parent.name}" / "bn.q.onnx"
        out.parent.mkdir()
        code, report, err = _quantize(capsys, source, *args, "-o", out, "--calibrate", data, "--report-samples", "4",
                                      "--no-latency")
        assert code == 0, err
        assert report["model"]["checker"] == "passed"
        assert report["activations"]["folded"]["nodes"] and "max_difference" in report["activations"]["folded"]
        layers = {row["tensor"]: row["sqnr_db"] for row in report["activations"]["per_layer"]["layers"]}
        assert layers and all(np.isfinite(v) and v > 20 for v in layers.values()), layers
        loaded = onnx.load(str(out))
        written[source] = ({t.name: numpy_helper.to_array(t).tobytes() for t in loaded.graph.initializer},
                           {row["name"]: (row["scale"], row["zero_point"]) for row in report["activations"]["tensors"]},
                           layers, _run(out, x))
    inline, from_file = written.values()
    assert inline[0] == from_file[0] and inline[1] == from_file[1] and inline[2] == from_file[2]
    assert np.array_equal(inline[3], from_file[3])
    assert (tmp_path / "out.ext" / "bn.q.onnx.data").is_file()
