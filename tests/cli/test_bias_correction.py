"""Static quantization moves each layer's bias so that its outputs' per-channel mean on the calibration samples is
the float model's (empirical bias correction, Nagel et al. 2019): a channel whose values sit near one level rounds
the same way everywhere, and int8 weights shift a layer's mean; the layers after carry and amplify the shift.

The model is built here so that the shift is large: the first convolution's input channels sit just off a level
of their grid, and its weights sum to the same sign. The oracle is the float model run in onnxruntime: on the
calibration samples that the correction measured, every corrected layer's per-channel mean is within half a step
of its int32 bias (x_scale * w_scale) of float's, where without the correction it is many steps away."""

from __future__ import annotations

import json

import numpy as np
import pytest

from qlinear.cli import main

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

C, H = 8, 10  # more than 4 input channels: not an image, so the first convolution is quantized too


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    inits = [
        numpy_helper.from_array(np.abs(rng.normal(0.5, 0.2, (8, C, 3, 3))).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(0, 0.1, 8).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.normal(0, 0.3, (6, 8, 3, 3)).astype(np.float32), "w2"),
        numpy_helper.from_array(rng.normal(0, 0.1, 6).astype(np.float32), "b2"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Relu", ["c2"], ["y"], name="relu2"),
    ]
    graph = helper.make_graph(nodes, "two_convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, C, H, H])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 6, H, H])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _samples(count: int) -> np.ndarray:
    """Each input channel near a constant of its own, a third of a level (of a 0..2 range in uint8) off the grid,
    and one sample spanning the range so that the grid is that coarse."""
    rng = np.random.default_rng(5)
    step = 2.0 / 255
    centres = (np.arange(C) * 37 % 200 + 20 + 1 / 3) * step
    x = centres[None, :, None, None] + rng.normal(0, step / 20, (count, C, H, H))
    x[0, :, 0, 0], x[0, :, 0, 1] = 0.0, 2.0
    return x.astype(np.float32)


def _channel_means(model, x: np.ndarray, names: list[str]) -> dict[str, np.ndarray]:
    for name in names:
        if name not in {o.name for o in model.graph.output}:
            model.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    values = session.run(names, {"x": x})
    return {name: np.asarray(v, np.float64).mean(axis=(0, 2, 3)) for name, v in zip(names, values)}


def _conv_outputs(model) -> dict[str, str]:
    """Conv node name -> its output in the written model (T_float where a pair follows, else T)."""
    return {node.name: node.output[0] for node in model.graph.node if node.op_type == "Conv"}


def _bias_steps(model) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Conv node name -> (int32 bias codes, their scale), read from the written graph."""
    graph = model.graph
    constants = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    producers = {o: node for node in graph.node for o in node.output}
    found = {}
    for node in graph.node:
        if node.op_type == "Conv":
            dq = producers[node.input[2]]
            assert dq.op_type == "DequantizeLinear"
            found[node.name] = (constants[dq.input[0]], constants[dq.input[1]])
    return found


def _quantize(tmp_path, name: str, *extra: str):
    out = tmp_path / f"{name}.onnx"
    code = main(["quantize", str(tmp_path / "model.onnx"), "--dtype", "int8", "--calibrate", str(tmp_path / "cal.npz"),
                 "-o", str(out), "--no-eval", "--no-latency", "--report-samples", "0", "--json", *extra])
    assert code == 0
    return onnx.load(str(out))


@pytest.mark.parametrize("target", ["onnxruntime", "qdq-portable"])
def test_each_layer_mean_is_float_s_within_half_a_bias_step(tmp_path, capsys, target):
    onnx.save(_model(), str(tmp_path / "model.onnx"))
    x = _samples(16)
    np.savez(tmp_path / "cal.npz", x=x)
    corrected = _quantize(tmp_path, "corrected", "--target", target)
    report = json.loads(capsys.readouterr().out)
    kept = _quantize(tmp_path, "kept", "--target", target, "--no-bias-correction")
    capsys.readouterr()
    entry = report["activations"]["bias_correction"]
    assert entry["samples"] == 16
    assert {row["node"] for row in entry["layers"]} == {"conv1", "conv2"}
    reference = _channel_means(_model(), x, ["c1", "c2"])
    after, before = (_channel_means(model, x, list(_conv_outputs(model).values())) for model in (corrected, kept))
    steps_after, steps_before = _bias_steps(corrected), _bias_steps(kept)
    for node, float_name in (("conv1", "c1"), ("conv2", "c2")):
        codes, scale = steps_after[node]
        codes_before, scale_before = steps_before[node]
        assert codes.dtype == np.int32 and np.array_equal(scale, scale_before)  # moved by whole steps, same scale
        # The real channels (onnxruntime's target gives conv1 zero channels after its 8: `onnx_channel_padding`).
        real = len(reference[float_name])
        error_after = np.abs(after[_conv_outputs(corrected)[node]][:real] - reference[float_name])
        error_before = np.abs(before[_conv_outputs(kept)[node]][:real] - reference[float_name])
        scale = scale[:real] if scale.ndim else scale
        assert np.all(error_after <= 0.5 * scale + 1e-5 * np.abs(reference[float_name]).max()), (node, error_after, scale)
        assert np.max(error_before / scale) > 3, (node, error_before / scale)  # the test model has a shift to fix
        assert not np.array_equal(codes, codes_before)


def test_the_report_says_what_was_moved(tmp_path, capsys):
    onnx.save(_model(), str(tmp_path / "model.onnx"))
    np.savez(tmp_path / "cal.npz", x=_samples(8))
    code = main(["quantize", str(tmp_path / "model.onnx"), "--dtype", "int8", "--calibrate", str(tmp_path / "cal.npz"),
                 "-o", str(tmp_path / "q.onnx"), "--no-eval", "--no-latency", "--report-samples", "0"])
    assert code == 0
    assert "bias correction: 2 layers' biases moved to the float model's output means on 8 samples" in \
        capsys.readouterr().out
    code = main(["quantize", str(tmp_path / "model.onnx"), "--dtype", "int8", "--calibrate", str(tmp_path / "cal.npz"),
                 "-o", str(tmp_path / "q.onnx"), "--force", "--no-eval", "--no-latency", "--report-samples", "0",
                 "--no-bias-correction"])
    assert code == 0
    assert "bias correction: not run (--no-bias-correction)" in capsys.readouterr().out


def test_no_bias_correction_without_calibrate_is_refused(tmp_path, capsys):
    onnx.save(_model(), str(tmp_path / "model.onnx"))
    code = main(["quantize", str(tmp_path / "model.onnx"), "--dtype", "int8", "-o", str(tmp_path / "q.onnx"),
                 "--no-bias-correction"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--no-bias-correction applies to static quantization" in err[0]


def test_the_samples_are_capped_by_what_the_waiting_runs_hold(tmp_path, capsys, monkeypatch):
    """Every sample's run waits at each layer until all samples' means are in: where their held tensors would pass
    `bias_correction.HELD_BYTES`, fewer samples are used (at least one), and the report says how many."""
    from qlinear.io import bias_correction

    onnx.save(_model(), str(tmp_path / "model.onnx"))
    np.savez(tmp_path / "cal.npz", x=_samples(8))
    _quantize(tmp_path, "all")
    assert json.loads(capsys.readouterr().out)["activations"]["bias_correction"]["samples"] == 8
    # a sample holds its input (8 x 10 x 10 float32) and a layer's outputs of twice as many values (the first
    # convolution's 8 channels get 8 zero ones for onnxruntime: `onnx_channel_padding`)
    monkeypatch.setattr(bias_correction, "HELD_BYTES", 3 * 3 * 4 * C * H * H)
    _quantize(tmp_path, "capped")
    assert 1 < json.loads(capsys.readouterr().out)["activations"]["bias_correction"]["samples"] <= 3
    monkeypatch.setattr(bias_correction, "HELD_BYTES", 1)
    _quantize(tmp_path, "one")
    assert json.loads(capsys.readouterr().out)["activations"]["bias_correction"]["samples"] == 1


def _weights_only(tmp_path, name: str, *extra: str):
    out = tmp_path / f"{name}.onnx"
    code = main(["quantize", str(tmp_path / "model.onnx"), "--dtype", "int4", "--rounding", "rtn", "--calibrate",
                 str(tmp_path / "cal.npz"), "--activations", "float", "-o", str(out), "--no-eval", "--json", *extra])
    assert code == 0
    return onnx.load(str(out))


def test_weights_only_biases_move_to_float_s_means(tmp_path, capsys):
    """With --activations float the biases stay float and move by the measured mean itself: after the correction
    each layer's per-channel mean on the samples is float's to float rounding, where int4 weights had moved it."""
    onnx.save(_model(), str(tmp_path / "model.onnx"))
    x = _samples(16)
    np.savez(tmp_path / "cal.npz", x=x)
    corrected = _weights_only(tmp_path, "corrected")
    entry = json.loads(capsys.readouterr().out)["bias_correction"]
    kept = _weights_only(tmp_path, "kept", "--no-bias-correction")
    assert json.loads(capsys.readouterr().out)["bias_correction"] == {"note": "--no-bias-correction"}
    assert entry["samples"] == 16 and {row["node"] for row in entry["layers"]} == {"conv1", "conv2"}
    reference = _channel_means(_model(), x, ["c1", "c2"])
    after, before = (_channel_means(model, x, ["c1", "c2"]) for model in (corrected, kept))
    for name in ("c1", "c2"):
        scale = np.abs(reference[name]).max()
        error_after, error_before = np.abs(after[name] - reference[name]), np.abs(before[name] - reference[name])
        assert error_after.max() <= 1e-5 * scale, (name, error_after)
        assert error_before.max() > 1e-3 * scale, (name, error_before)  # int4 moved the means: something to fix
    biases = {t.name: numpy_helper.to_array(t) for t in corrected.graph.initializer}
    assert biases["b1"].dtype == np.float32 and biases["b1"].shape == (8,)


def test_weights_only_report_line(tmp_path, capsys):
    onnx.save(_model(), str(tmp_path / "model.onnx"))
    np.savez(tmp_path / "cal.npz", x=_samples(8))
    code = main(["quantize", str(tmp_path / "model.onnx"), "--dtype", "int4", "--rounding", "rtn", "--calibrate",
                 str(tmp_path / "cal.npz"), "--activations", "float", "-o", str(tmp_path / "q.onnx"), "--no-eval"])
    assert code == 0
    assert "bias correction: 2 layers' biases moved to the float model's output means on 8 samples" in \
        capsys.readouterr().out


def _reference_means(model, x: np.ndarray, names: list[str]) -> dict[str, np.ndarray]:
    """The channel means of ``names`` as onnx's reference evaluator computes them: it runs the microscaling types'
    DequantizeLinear, which onnxruntime cannot."""
    from onnx.reference import ReferenceEvaluator

    for name in names:
        if name not in {o.name for o in model.graph.output}:
            model.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    values = ReferenceEvaluator(model).run(names, {"x": x})
    return {name: np.asarray(v, np.float64).mean(axis=(0, 2, 3)) for name, v in zip(names, values)}


@pytest.mark.parametrize("dtype, flags", [("nvfp4", ()), ("mxfp4", ("--bias-correction",))])
def test_microscaling_weights_only_biases_move_on_the_weights_qlinear_dequantizes(tmp_path, capsys, dtype, flags):
    """onnxruntime has no DequantizeLinear for float4 codes; the correction runs the model with qlinear's
    dequantized weights in their place, and the biases written move as they do for int4: each layer's mean on
    the samples is float's, by onnx's reference evaluator running the written model itself. (NVFP4 by default;
    the MX formats when asked.)"""
    onnx.save(_model(), str(tmp_path / "model.onnx"))
    x = _samples(16)
    np.savez(tmp_path / "cal.npz", x=x)
    corrected = _weights_only(tmp_path, "corrected", "--dtype", dtype, *flags)
    entry = json.loads(capsys.readouterr().out)["bias_correction"]
    kept = _weights_only(tmp_path, "kept", "--dtype", dtype, "--no-bias-correction")
    capsys.readouterr()
    assert {row["node"] for row in entry["layers"]} == {"conv1", "conv2"}, entry
    assert "computed by qlinear" in entry["note"]
    reference = _channel_means(_model(), x, ["c1", "c2"])
    after, before = (_reference_means(model, x, ["c1", "c2"]) for model in (corrected, kept))
    for name in ("c1", "c2"):
        scale = np.abs(reference[name]).max()
        assert np.abs(after[name] - reference[name]).max() <= 1e-5 * scale, name
        assert np.abs(before[name] - reference[name]).max() > 1e-3 * scale, name


def test_mx_formats_keep_their_biases_unless_asked(tmp_path, capsys):
    onnx.save(_model(), str(tmp_path / "model.onnx"))
    np.savez(tmp_path / "cal.npz", x=_samples(8))
    by_default = _weights_only(tmp_path, "default", "--dtype", "mxfp4")
    entry = json.loads(capsys.readouterr().out)["bias_correction"]
    kept = _weights_only(tmp_path, "kept", "--dtype", "mxfp4", "--no-bias-correction")
    capsys.readouterr()
    assert entry["note"].startswith("not by default for mxfp4") and "--bias-correction" in entry["note"]
    assert by_default.SerializeToString() == kept.SerializeToString()


def test_both_bias_correction_flags_are_refused(tmp_path, capsys):
    onnx.save(_model(), str(tmp_path / "model.onnx"))
    np.savez(tmp_path / "cal.npz", x=_samples(8))
    code = main(["quantize", str(tmp_path / "model.onnx"), "--dtype", "int4", "--calibrate", str(tmp_path / "cal.npz"),
                 "--activations", "float", "--bias-correction", "--no-bias-correction", "-o", str(tmp_path / "q.onnx")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--bias-correction and --no-bias-correction" in err
