"""`qlinear quantize --calibrate`: static quantization on the committed digits MLP (a model trained on scikit-
learn's digits, calibrated on training digits and measured on the held-out ones) and on small built models;
oracles are onnxruntime (the quantized model runs and is measured there), onnx's reference (through `qlinear
run`), and the float model. The PP-OCR models are in tests/corpus/test_corpus_static.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from qlinear.cli import main

from ._helpers import EXAMPLE, REPO

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import helper, numpy_helper  # noqa: E402

EVAL = REPO / "examples" / "digits_mlp.eval.npz"


@pytest.fixture(scope="module")
def calibration(tmp_path_factory):
    """200 training digits, scaled as the example's held-out ones (examples/train_digits_mlp.py)."""
    held_out = np.load(EVAL)["pixels"]
    sklearn = pytest.importorskip("sklearn.datasets")
    digits = sklearn.load_digits()
    pixels = (digits.data / 16.0).astype(np.float32)
    used = {row.tobytes() for row in held_out}
    training = np.array([row for row in pixels if row.tobytes() not in used][:200], np.float32)
    assert training.shape == (200, 64) and np.allclose(training.max(), held_out.max())
    path = tmp_path_factory.mktemp("calibration") / "digits.npz"
    np.savez(path, pixels=training)
    return path


def _quantize(capsys, *args):
    code = main(["quantize", *map(str, args), "--json"])
    captured = capsys.readouterr()
    return code, (json.loads(captured.out) if code == 0 else None), captured.err


def _session(path, optimized=False):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not optimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def test_static_int8_digits(tmp_path, capsys, calibration):
    output = tmp_path / "static.onnx"
    code, report, err = _quantize(capsys, EXAMPLE, "--dtype", "int8", "--calibrate", calibration, "-o", output,
                                  "--eval", EVAL)
    assert code == 0, err
    model = onnx.load(str(output))
    onnx.checker.check_model(model, full_check=True)
    produced = {o: n.op_type for n in model.graph.node for o in n.output}
    for node in model.graph.node:
        if node.op_type == "MatMul":
            assert produced[node.input[0]] == produced[node.input[1]] == "DequantizeLinear", node.name
    activations = report["activations"]
    assert activations["type"] == "uint8" and activations["method"] == "mse" and activations["calibration_samples"] == 200
    assert activations["pairs"] == len([n for n in model.graph.node if n.op_type == "QuantizeLinear"]) > 0
    accuracy = report["model"]["accuracy"]
    data = np.load(EVAL)
    logits = _session(output).run(None, {"pixels": data["pixels"]})[0]
    assert accuracy["quantized"] == pytest.approx(float(np.mean(logits.argmax(1) == data["labels"])))
    assert accuracy["quantized"] >= accuracy["float"] - 0.01
    # every activation's range holds what calibration saw (mse may clip), scale and zero point as stored
    stored = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for row in activations["tensors"]:
        low, high = row["range"]
        assert low <= 0 <= high and row["observed"][0] <= row["observed"][1]
        scale = stored[f"{row['name']}_scale"]
        assert float(scale) == pytest.approx(row["scale"], rel=1e-7)
    # the output SQNR the report gives is what onnxruntime measures on the calibration samples
    (sqnr,) = [o["sqnr_db"] for o in activations["per_layer"]["outputs"]]
    assert sqnr > 20
    assert activations["per_layer"]["samples"] == 16  # the default for a small model


def test_report_samples_default_to_16_within_a_memory_budget(tmp_path, capsys, calibration, monkeypatch):
    """Without --report-samples the report runs on up to 16 samples whose compared activations fit
    REPORT_BYTES (the OCR detector's pages hold 1.3 GB each); --report-samples overrides it."""
    from qlinear.io import static_quantization

    output = tmp_path / "static.onnx"
    base = [EXAMPLE, "--dtype", "int8", "--calibrate", calibration, "-o", output, "--no-eval", "--force"]
    # the MLP's compared activations: pixels' successors, 3 hidden tensors and logits, 4 bytes a value
    monkeypatch.setattr(static_quantization, "REPORT_BYTES", 5 * 64 * 4)
    code, report, err = _quantize(capsys, *base)
    assert code == 0, err
    layers = report["activations"]["per_layer"]
    assert 1 <= layers["samples"] < 16 and layers["layers"]
    monkeypatch.setattr(static_quantization, "REPORT_BYTES", 1)
    assert _quantize(capsys, *base)[1]["activations"]["per_layer"]["samples"] == 1  # at least one
    assert _quantize(capsys, *base, "--report-samples", "5")[1]["activations"]["per_layer"]["samples"] == 5
    assert _quantize(capsys, *base, "--report-samples", "500")[1]["activations"]["per_layer"]["samples"] == 200


def test_qlinear_run_and_onnxruntime_agree_on_the_static_model(tmp_path, capsys, calibration):
    """`qlinear run` (exact QuantizeLinear/DequantizeLinear, onnx's reference for the rest) against onnxruntime
    with basic optimizations (the same QDQ graph): equal to float rounding, a step where a rounding boundary
    falls between them; and against onnxruntime's fused int8 kernels, which `--compare` reports."""
    import qlinear.onnx

    output = tmp_path / "static.onnx"
    assert _quantize(capsys, EXAMPLE, "--dtype", "int8", "--calibrate", calibration, "-o", output, "--no-eval")[0] == 0
    pixels = np.load(EVAL)["pixels"][:32]
    ours = qlinear.onnx.run(output, {"pixels": pixels})["logits"]
    basic = _session(output).run(None, {"pixels": pixels})[0]
    fused = _session(output, optimized=True).run(None, {"pixels": pixels})[0]
    assert np.max(np.abs(ours - basic)) <= 0.05 * np.max(np.abs(basic))
    assert np.mean(ours.argmax(1) == basic.argmax(1)) >= 0.95 and np.mean(ours.argmax(1) == fused.argmax(1)) >= 0.9
    np.save(tmp_path / "x.npy", pixels)
    assert main(["run", str(output), "--input", f"pixels={tmp_path / 'x.npy'}", "--compare"]) == 0
    assert "logits" in capsys.readouterr().out


def test_keep_float_and_max_drop(tmp_path, capsys, calibration):
    # onnxruntime's placement has nothing left to run in int8: one line, nothing written
    code, report, err = _quantize(capsys, EXAMPLE, "--dtype", "int8", "--calibrate", calibration, "--keep-float",
                                  "MatMul", "-o", tmp_path / "none.onnx", "--no-eval")
    assert code == 2 and "nothing to calibrate" in err and not (tmp_path / "none.onnx").exists()
    code, report, err = _quantize(capsys, EXAMPLE, "--dtype", "int8", "--calibrate", calibration, "--keep-float",
                                  "MatMul", "--target", "qdq-portable", "-o", tmp_path / "kept.onnx", "--no-eval")
    assert code == 0, err
    model = onnx.load(str(tmp_path / "kept.onnx"))
    assert all(n.op_type != "QuantizeLinear" or not any(
        r.op_type == "MatMul" for r in model.graph.node if n.output[0] in r.input) for n in model.graph.node)
    assert not any(r["quantized"] for r in report["tensors"] if r["name"].endswith(".weight"))
    # --max-drop 0: layers are kept float, the costliest to the outputs first, until the held-out accuracy is
    # float's (or none is left); each layer's effect alone on the outputs is in the report
    code, report, err = _quantize(capsys, EXAMPLE, "--dtype", "int4", "--calibrate", calibration, "--eval", EVAL,
                                  "--max-drop", "0", "--activations", "int8", "-o", tmp_path / "budget.onnx")
    assert code == 0, err
    search = report["activations"]["max_drop"]
    accuracy = report["model"]["accuracy"]
    assert search["budget"] == 0 and search["history"][-1]["quantized"] == accuracy["quantized"]
    assert search["met"] == (accuracy["quantized"] >= accuracy["float"])
    assert [len(step["kept"]) for step in search["history"]] == list(range(len(search["history"])))
    layers = report["activations"]["per_layer"]["layers"]
    assert layers and all(isinstance(layer["output_sqnr_db"], float) for layer in layers)
    if search["kept"]:
        kept = onnx.load(str(tmp_path / "budget.onnx"))
        names = {n.name for n in kept.graph.node}
        assert set(search["kept"]) <= names


@pytest.mark.parametrize("activations, opset", [("int8", 13), ("int16", 21), ("float8e4m3fn", 19)])
def test_activation_types(tmp_path, capsys, calibration, activations, opset):
    output = tmp_path / f"{activations}.onnx"
    code, report, err = _quantize(capsys, EXAMPLE, "--dtype", "int8", "--calibrate", calibration, "--activations",
                                  activations, "--symmetric-activations", "-o", output, "--eval", EVAL)
    assert code == 0, err
    model = onnx.load(str(output))
    onnx.checker.check_model(model, full_check=True)
    assert report["model"]["opset_after"] == opset and report["activations"]["type"] == activations
    if activations != "float8e4m3fn":
        assert all(row["zero_point"] == 0 for row in report["activations"]["tensors"])
    assert report["model"]["accuracy"]["quantized"] >= report["model"]["accuracy"]["float"] - 0.02


def _conv_model(bias_value: float):
    """A Conv on an input of 8 channels (a 3-channel image's convolution stays float: placement rule 4)."""
    rng = np.random.default_rng(4)
    w = numpy_helper.from_array(rng.standard_normal((4, 8, 3, 3)).astype(np.float32) * 1e-3, "w")
    b = numpy_helper.from_array(np.full(4, bias_value, np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv"), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8, 8, 8])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 1, 1])], [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_conv_bias_int32_or_kept_where_it_would_overflow(tmp_path, capsys):
    x = np.random.default_rng(5).standard_normal((16, 8, 8, 8)).astype(np.float32) * 1e-3
    np.savez(tmp_path / "x.npz", x=x)
    for bias, quantized in ((0.01, True), (1e9, False)):
        source = tmp_path / f"conv{int(quantized)}.onnx"
        onnx.save(_conv_model(bias), str(source))
        code, report, err = _quantize(capsys, source, "--dtype", "int8", "--calibrate", tmp_path / "x.npz",
                                      "-o", tmp_path / f"q{int(quantized)}.onnx", "--no-eval",
                                      "--no-bias-correction")  # the bias as quantized (moved: test_bias_correction)
        assert code == 0, err
        row = next(r for r in report["tensors"] if r["name"] == "b")
        assert row["quantized"] == quantized, row
        model = onnx.load(str(tmp_path / f"q{int(quantized)}.onnx"))
        stored = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        if quantized:  # int32, scale = x_scale * w_scale per channel, the float bias back within half a step
            values, scale = stored["b_quantized"], stored["b_scale"]
            x_scale = next(float(stored[f"{t['name']}_scale"]) for t in report["activations"]["tensors"] if t["name"] == "x")
            w_scale = stored["w_scale"]
            assert values.dtype == np.int32 and np.array_equal(scale, (np.float64(x_scale) * w_scale.astype(np.float64)).astype(np.float32))
            assert np.all(np.abs(values * scale.astype(np.float64) - np.float32(bias)) <= scale / 2 * (1 + 1e-6))
        else:
            assert "leave int32" in row["note"]
        # the Relu after the Conv is folded by onnxruntime: its input is not quantized, its output is
        assert {t["name"] for t in report["activations"]["tensors"]} == {"x", "r"}


@pytest.mark.parametrize("args, match", [
    (["--calibrate", "missing.npz"], "missing.npz: no such file"),
    (["--calibrate", "{wrong}"], "has no array for the model input 'pixels'"),
    (["--method", "entropy"], "--method applies to static quantization"),
    (["--calibrate", "{calib}", "--max-drop", "1"], "--max-drop needs labelled data"),
    (["--calibrate", "{calib}", "--activations", "int4"], "--activations int4: activations are"),
])
def test_static_errors_are_one_line(tmp_path, capsys, calibration, args, match):
    np.savez(tmp_path / "wrong.npz", image=np.zeros((2, 64), np.float32))
    args = [a.format(wrong=tmp_path / "wrong.npz", calib=calibration) if a.startswith("{") else
            (str(tmp_path / a) if a.endswith(".npz") else a) for a in args]
    code = main(["quantize", str(EXAMPLE), "--dtype", "int8", *args, "-o", str(tmp_path / "q.onnx"), "--no-eval"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert match in err, err
    assert not (tmp_path / "q.onnx").exists()


def test_plot_draws_the_per_layer_sqnr(tmp_path, capsys, calibration):
    pytest.importorskip("matplotlib")
    code, report, err = _quantize(capsys, EXAMPLE, "--dtype", "int8", "--calibrate", calibration, "--no-eval",
                                  "-o", tmp_path / "q.onnx", "--plot", tmp_path / "plots")
    assert code == 0, err
    pngs = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert "activations-sqnr.png" in pngs and "fc1.weight.png" in pngs
    assert (tmp_path / "plots" / "activations-sqnr.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
