"""The real-model corpus through `qlinear quantize` with its defaults: five trained models that others
exported (Paddle's OCR detector, recogniser and direction classifier with Constant-node weights; silero's
VAD with its weights inside If branches, and its opset-15 export with an LSTM behind Slice/Concat chains),
each quantized to int8, int4 and float8e4m3fn.

For each: the report finds the float weight bytes an independent walk of the model counts and quantizes at
least 95% of them; the output passes onnx.checker's full check, runs in onnxruntime, in `qlinear run`, and in
onnx's reference evaluator where its opset has DequantizeLinear (19+); and the task figure on the labelled data
of `tests/corpus` (rendered text, synthesized speech) is measured against the float model's. The int8
figures are gated (classifier within 1 point, recogniser within 2, detector map IoU >= 0.95, VAD decisions
equal on >= 97% of frames); the others are reported (``-s`` prints them; benchmarks/corpus.py tabulates them).
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

from qlinear.cli import main

from . import measure_float, ocr, speech
from .models import ort_runner, require

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

NAMES = ("ocr_det", "ocr_rec", "ocr_cls", "vad", "vad_op15")
DTYPES = ("int8", "int4", "float8e4m3fn")
# Where each model keeps its weights, as the report must say.
PLACES = {"ocr_det": "Constant node", "ocr_rec": "Constant node", "ocr_cls": "Constant node",
          "vad": "subgraph Constant node", "vad_op15": "initializer"}
_CACHE: dict = {}


def _cached(key, make):
    if key not in _CACHE:
        _CACHE[key] = make()
    return _CACHE[key]


def _data(name):
    require(name)
    return measure_float.data(name)


def _float_outputs(name):
    require(name)
    return measure_float.float_outputs(name)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("corpus")


def _quantized(folder: Path, name: str, dtype: str):
    """(output path, report) of `qlinear quantize MODEL --dtype TYPE` with every other setting default."""
    def make():
        source = require(name)
        output = folder / f"{name}.{dtype}.onnx"
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            code = main(["quantize", str(source), "--dtype", dtype, "-o", str(output), "--json", "--no-eval"])
        assert code == 0
        return output, json.loads(stdout.getvalue())
    return _cached(("quantized", name, dtype), make)


def _float_constant_bytes(model) -> int:
    """Bytes of every float tensor of 2+ dimensions stored in the model (initializers and Constant node
    values, every graph), walked here independently of qlinear's search."""
    total = 0

    def visit(graph):
        nonlocal total
        tensors = list(graph.initializer)
        for node in graph.node:
            for attribute in node.attribute:
                if node.op_type == "Constant" and attribute.name == "value":
                    tensors.append(attribute.t)
                for sub in ([attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs)):
                    visit(sub)
        for tensor in tensors:
            if tensor.data_type in (1, 10, 16) and len(tensor.dims) >= 2:
                total += int(np.prod(tensor.dims)) * (4 if tensor.data_type == 1 else 2)
    visit(model.graph)
    return total


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", NAMES)
def test_defaults_find_the_weights_and_write_a_valid_model(folder, name, dtype):
    output, report = _quantized(folder, name, dtype)
    weights = report["totals"]["weights"]
    assert weights["bytes"] == _float_constant_bytes(onnx.load(str(require(name))))
    assert weights["share"] >= 0.95, weights
    assert list(weights["places"]) == [PLACES[name]]
    quantized = onnx.load(str(output))
    onnx.checker.check_model(quantized, full_check=True)
    assert report["model"]["checker"] == "passed"
    dequantize = []

    def visit(graph):
        for node in graph.node:
            if node.op_type == "DequantizeLinear":
                dequantize.append(node)
            for attribute in node.attribute:
                for sub in ([attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs)):
                    visit(sub)
    visit(quantized.graph)
    assert len(dequantize) == report["totals"]["quantized"] == report["model"]["dequantize_nodes"]
    rows = {row["name"]: row for row in report["tensors"]}
    if dtype == "int8":  # per output channel, symmetric
        assert all(row["granularity"].startswith("per-axis") and row["symmetric"] for row in rows.values() if row["quantized"])
    if dtype == "int4":  # blocks of 32 along the reduction axis, or per channel where that axis is shorter
        assert {row["granularity"].split(" (")[0] for row in rows.values() if row["quantized"]} <= {"blocked", "per-axis"}
        assert any(row["granularity"] == "blocked (axis 1, 32)" for row in rows.values())
    if name == "vad_op15":  # the LSTM's W and R reach it through Slice -> Concat -> Unsqueeze: per gate row
        for weight in ("model.decoder.rnn.weight_ih", "model.decoder.rnn.weight_hh"):
            assert rows[weight]["quantized"], rows[weight]
            if dtype == "int8":
                assert rows[weight]["granularity"] == "per-axis (axis 0)"
    if name.startswith("ocr"):  # biases and norm parameters stay float
        assert all(not row["quantized"] for row in rows.values() if len(row["shape"]) < 2)


GATES = {  # int8 with the defaults
    "ocr_cls": lambda f: f["quantized"] >= f["float"] - 0.01,
    "ocr_rec": lambda f: f["quantized"] >= f["float"] - 0.02,
    "ocr_det": lambda f: f["vs float"] >= 0.95,  # the map's IoU
    "vad": lambda f: f["vs float"] >= 0.97,  # the frame decisions equal to float's
    "vad_op15": lambda f: f["vs float"] >= 0.97,
}


@pytest.mark.parametrize("name", NAMES)
def test_task_figure_against_the_float_model(folder, name):
    """The int8 defaults' gates. (int4 and float8e4m3fn have no gate: `benchmarks/corpus.py` reports their
    figures, BENCHMARKS.md holds them; here they are checked to be valid and to run, below.)"""
    output, _ = _quantized(folder, name, "int8")
    data = _data(name)
    float_out = _float_outputs(name)
    quantized_out = measure_float.outputs(name, ort_runner(output), data)
    figures = measure_float.against_float(name, float_out, quantized_out, data)
    print(f"\n{name} int8: {figures}")
    assert GATES[name](figures), figures


def _one_input(name: str) -> dict:
    if name == "ocr_det":
        return {"x": _data(name)[0].x[:, :, :96, :128]}
    if name == "ocr_rec":
        return {"x": _data(name).images[:1]}
    if name == "ocr_cls":
        return {"x": _data(name).images[:1]}
    audio = _data(name).audio
    return {"input": np.concatenate([np.zeros(64, np.float32), audio[16000:16512]])[None, :],
            "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(16000, np.int64)}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", NAMES)
def test_runs_in_qlinear_run_and_the_onnx_reference(folder, name, dtype):
    import qlinear.onnx
    from onnx.reference import ReferenceEvaluator

    output, report = _quantized(folder, name, dtype)
    feeds = _one_input(name)
    expected = ort_runner(output)(feeds)
    ours = list(qlinear.onnx.run(output, feeds).values())
    runs = [("qlinear run", ours)]
    if report["model"]["opset_after"] >= 19:  # onnx's reference has no DequantizeLinear before 19
        runs.append(("onnx reference", ReferenceEvaluator(str(output)).run(None, feeds)))
    for label, outputs in runs:
        for got, want in zip(outputs, expected):
            scale = max(1.0, float(np.max(np.abs(want))))
            assert np.max(np.abs(np.asarray(got, np.float64) - want)) <= 1e-4 * scale, label


# ----------------------------------------------------------------------------------------------------
# The report's own task figure (--eval), one model per task kind, against the harness's figure


def _report_with_eval(folder: Path, name: str, arrays: dict, *args) -> dict:
    data_path = folder / f"{name}.eval.npz"
    np.savez(data_path, **arrays)
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["quantize", str(require(name)), "--dtype", "int8", "-o", str(folder / f"{name}.eval.onnx"),
                     "--force", "--json", "--eval", str(data_path), *args])
    assert code == 0
    return json.loads(stdout.getvalue())


def test_report_classifier_accuracy(folder):
    data = _data("ocr_cls")
    report = _report_with_eval(folder, "ocr_cls", {"x": data.images, "labels": data.labels})
    accuracy = report["model"]["accuracy"]
    output, _ = _quantized(folder, "ocr_cls", "int8")
    assert accuracy["task"] == "classify" and accuracy["samples"] == len(data)
    assert accuracy["float"] == pytest.approx(ocr.cls_accuracy(_float_outputs("ocr_cls"), data.labels), abs=1e-9)
    quantized = measure_float.outputs("ocr_cls", ort_runner(output), data)
    assert accuracy["quantized"] == pytest.approx(ocr.cls_accuracy(quantized, data.labels), abs=1e-9)


def test_report_recogniser_ctc_text_accuracy(folder):
    data = _data("ocr_rec")
    count = 16
    labels = np.array(data.labels[:count])
    report = _report_with_eval(folder, "ocr_rec", {"x": data.images[:count], "labels": labels}, "--task", "ctc")
    accuracy = report["model"]["accuracy"]
    assert accuracy["task"] == "ctc" and accuracy["samples"] == count
    assert accuracy["float"] == pytest.approx(ocr.exact_match(_float_outputs("ocr_rec").texts[:count], labels), abs=1e-9)


def test_report_detector_map(folder):
    page = _data("ocr_det")[0]
    truth = page.gt_mask(shrink=True)[None, None].astype(np.uint8)
    report = _report_with_eval(folder, "ocr_det", {"x": page.x, "labels": truth}, "--task", "threshold",
                               "--threshold", "0.3")
    accuracy = report["model"]["accuracy"]
    output, _ = _quantized(folder, "ocr_det", "int8")
    float_map = _float_outputs("ocr_det")[0]
    quantized_map = measure_float.outputs("ocr_det", ort_runner(output), [page])[0]
    assert accuracy["iou"] == pytest.approx(ocr.det_iou([float_map], [quantized_map]), abs=1e-6)
    assert accuracy["float"] == pytest.approx(float(np.mean((float_map > 0.3) == truth[0, 0].astype(bool))), abs=1e-9)


def test_report_vad_as_a_stream(folder):
    data = _data("vad")
    frames = len(data.audio) // 512
    chunks = data.audio[: frames * 512].reshape(frames, 512)
    context = np.concatenate([np.zeros((1, 64), np.float32), chunks[:-1, -64:]])
    steps = np.concatenate([context, chunks], axis=1)[:, None, :]
    arrays = {"input": steps, "state": np.zeros((2, 1, 128), np.float32), "sr": np.full(frames, 16000, np.int64),
              "labels": data.labels.astype(np.uint8)}
    report = _report_with_eval(folder, "vad", arrays, "--task", "threshold", "--recurrent", "stateN=state")
    accuracy = report["model"]["accuracy"]
    float_probabilities = _float_outputs("vad")
    assert accuracy["samples"] == frames
    assert accuracy["float"] == pytest.approx(speech.label_accuracy(float_probabilities, data.labels), abs=1e-9)
    output, _ = _quantized(folder, "vad", "int8")
    quantized = measure_float.outputs("vad", ort_runner(output), data)
    assert accuracy["agreement"] == pytest.approx(speech.decision_agreement(float_probabilities, quantized), abs=1e-9)


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_a_real_safetensors_checkpoint(tmp_path, dtype):
    """silero's own PyTorch checkpoint (`silero_vad_16k.safetensors`, in the same wheel): with the defaults
    every weight of 2+ dimensions is quantized (int8 per output channel, axis 0; int4 in blocks of 32 along
    the last axis, or per channel where it is shorter) and every bias stays float; `qlinear dequantize` gives
    each weight back within half a quantization step, checked with the stored scales and zero points."""
    import importlib.metadata

    from safetensors.numpy import load_file

    try:
        source = Path(importlib.metadata.distribution("silero-vad").locate_file("silero_vad/data/silero_vad_16k.safetensors"))
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("the silero-vad wheel is not installed")
    original = load_file(str(source))
    quantized, restored = tmp_path / "q.safetensors", tmp_path / "r.safetensors"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(["quantize", str(source), "--dtype", dtype, "-o", str(quantized), "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(stdout.getvalue())["tensors"]}
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["dequantize", str(quantized), "-o", str(restored)]) == 0
    stored, back = load_file(str(quantized)), load_file(str(restored))
    assert sorted(back) == sorted(original)
    for name, weight in original.items():
        if weight.ndim < 2:
            assert not rows[name]["quantized"] and "1-D" in rows[name]["note"]
            assert np.array_equal(back[name], weight) and name + ".scale" not in stored
            continue
        assert rows[name]["quantized"], name
        scale = stored[name + ".scale"].astype(np.float64)
        if dtype == "int8":
            assert rows[name]["granularity"] == "per-axis (axis 0)" and scale.shape == (weight.shape[0],)
            step = scale.reshape((-1,) + (1,) * (weight.ndim - 1))
        elif weight.shape[-1] >= 32:
            assert rows[name]["granularity"] == f"blocked (axis {weight.ndim - 1}, 32)"
            step = np.repeat(scale, 32, axis=-1)[..., : weight.shape[-1]]
        else:
            assert rows[name]["granularity"] == "per-axis (axis 0)"
            step = scale.reshape((-1,) + (1,) * (weight.ndim - 1))
        error = np.abs(back[name].astype(np.float64) - weight.astype(np.float64))
        assert np.all(error <= step / 2 + np.abs(weight) * 2.0**-22), name
