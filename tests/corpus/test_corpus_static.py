"""Static quantization of the PP-OCR models of the corpus: `qlinear quantize MODEL --dtype int8 --calibrate
DATA.npz` calibrates the activations on rendered text (other lines and pages than the ones measured), and the
int8 model is measured against the float one on the corpus' labelled data in onnxruntime. Goals: >= 90% of the
Conv/MatMul/Gemm data inputs quantized; classifier within 2 points of float, recogniser exact-match within 3
points, detector map IoU >= 0.90. The model passes onnx.checker's full check, onnxruntime turns its QDQ pairs into
its int8 kernels (QLinearConv and friends in the optimized graph), and `qlinear run` computes it as onnxruntime
does without those fusions."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

from qlinear.cli import main

from . import measure_float, ocr
from .models import ort_runner, require

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

CALIBRATION = {"ocr_cls": 32, "ocr_rec": 16, "ocr_det": 3}  # samples (lines, pages) to calibrate on


def _calibration_file(folder: Path, name: str) -> Path:
    """Calibration inputs made with other seeds than the labelled data the figures are measured on."""
    path = folder / f"{name}.calibration.npz"
    if not path.exists():
        count = CALIBRATION[name]
        if name == "ocr_cls":
            x = ocr.make_cls_data(count, seed=7).images
        elif name == "ocr_rec":
            x = ocr.make_rec_data(count, seed=7).images
        else:  # the detector's pages differ in size: one page per file, in a folder
            folder = folder / "det_calibration"
            folder.mkdir(exist_ok=True)
            for index, page in enumerate(ocr.make_det_pages(count, seed=7)):
                np.savez(folder / f"page{index}.npz", x=page.x)
            return folder
        np.savez(path, x=x)
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("static")


_RESULTS: dict = {}


def _static(folder: Path, name: str):
    if name not in _RESULTS:
        source = require(name)
        output = folder / f"{name}.static.onnx"
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            code = main(["quantize", str(source), "--dtype", "int8", "--calibrate", str(_calibration_file(folder, name)),
                         "-o", str(output), "--json", "--no-eval", "--report-samples", "4", "--no-latency"])
        assert code == 0
        _RESULTS[name] = (output, json.loads(stdout.getvalue()))
    return _RESULTS[name]


def _data_inputs_quantized(model) -> tuple[int, int]:
    """(quantized, all) data inputs of Conv/ConvTranspose/MatMul/Gemm: read from a DequantizeLinear."""
    produced_by = {o: n.op_type for n in model.graph.node for o in n.output}
    total = quantized = 0
    for node in model.graph.node:
        if node.op_type not in ("Conv", "ConvTranspose", "MatMul", "Gemm"):
            continue
        positions = (0,) if node.op_type.startswith("Conv") else (0, 1)
        for position in positions:  # MatMul/Gemm's second operand: a weight or an activation, both count
            total += 1
            quantized += produced_by.get(node.input[position]) == "DequantizeLinear"
    return quantized, total


GATES = {
    "ocr_cls": lambda f: f["quantized"] >= f["float"] - 0.02,
    "ocr_rec": lambda f: f["quantized"] >= f["float"] - 0.03,
    "ocr_det": lambda f: f["vs float"] >= 0.90,  # the map's IoU
}


@pytest.mark.parametrize("name", ["ocr_cls", "ocr_rec", "ocr_det"])
def test_static_int8_model(folder, name):
    output, report = _static(folder, name)
    model = onnx.load(str(output))
    onnx.checker.check_model(model, full_check=True)
    quantized, total = _data_inputs_quantized(model)
    assert quantized >= 0.9 * total, (quantized, total)
    assert report["activations"]["pairs"] > 0 and report["activations"]["calibration_samples"] == CALIBRATION[name]
    layers = report["activations"]["per_layer"]["layers"]
    sqnrs = [float("inf") if layer["sqnr_db"] is None else layer["sqnr_db"] for layer in layers]  # JSON: null = exact
    assert sqnrs == sorted(sqnrs)  # worst first
    data = measure_float.data(name)
    float_out = measure_float.float_outputs(name)
    quantized_out = measure_float.outputs(name, ort_runner(output), data)
    figures = measure_float.against_float(name, float_out, quantized_out, data)
    print(f"\n{name} static int8: {figures}; {quantized} of {total} data inputs quantized")
    assert GATES[name](figures), figures


@pytest.mark.parametrize("name", ["ocr_cls", "ocr_rec", "ocr_det"])
def test_onnxruntime_runs_the_static_model_with_its_int8_kernels(folder, tmp_path, name):
    """onnxruntime's optimized graph of each static model (the default --target onnxruntime) runs every
    convolution as QLinearConv and keeps few conversions: at most one QuantizeLinear or DequantizeLinear per
    eight int8 nodes (measured: 4 for 119, 22 for 201 (the recogniser's five LayerNorms and its head stay
    float), 5 for 174; the qdq-portable placement leaves 133, 389 and 270)."""
    from qlinear.io import latency

    output, _ = _static(folder, name)
    nodes = latency.optimized_nodes(output)
    graph = onnx.load(str(output)).graph
    inputs = {i.name for i in graph.input}
    # Every Conv but the first, which reads the 3-channel image and stays float (placement rule 4), and in the
    # recogniser and the detector (PP-LCNetV3) the depthwise one right after it (rule 5); the classifier's
    # next one is a dense 1x1.
    produced = {o: n for n in graph.node for o in n.output}
    stems = [n for n in graph.node if n.op_type == "Conv" and n.input[0] in inputs]
    after = [n for n in graph.node if n.op_type == "Conv" and produced.get(n.input[0]) in stems]
    assert len(stems) == 1 and len(after) == (0 if name == "ocr_cls" else 1)
    convs = sum(1 for n in graph.node if n.op_type == "Conv")
    assert nodes["int8"]["QLinearConv"] == convs - 1 - len(after)
    assert nodes["float"].get("Conv", 0) + nodes["float"].get("FusedConv", 0) == 1 + len(after), nodes
    assert sum(nodes["conversions"].values()) <= sum(nodes["int8"].values()) / 8, nodes


def test_qlinear_run_computes_the_static_model(folder):
    """`qlinear run` against onnxruntime without its QDQ fusions (basic optimizations: the ONNX semantics):
    the outputs agree to float rounding; a QuantizeLinear that a float rounding difference puts across a
    rounding boundary moves by one step, so the bound is a step of the output's scale, not zero."""
    import qlinear.onnx

    output, report = _static(folder, "ocr_cls")
    x = measure_float.data("ocr_cls").images[:4]
    ours = qlinear.onnx.run(output, {"x": x})
    theirs = ort_runner(output)({"x": x})
    for got, want in zip(ours.values(), theirs):
        assert np.max(np.abs(np.asarray(got, np.float64) - want)) <= 0.02, np.max(np.abs(got - want))


@pytest.mark.full  # about 27 s: the full suite's; the held-out test keeps a static recogniser in the default run
def test_recogniser_holds_on_a_calibration_set_that_broke_it(tmp_path):
    """100 lines of seed 7 gave the default static recogniser 87.33% exact match against float's 93.33% before
    placement rule 5 kept the depthwise convolution after the image's float convolution float: noise that
    enters there is amplified by the whole network (BENCHMARKS.md, "Placement rule 5"). Measured with the rule:
    97.33%. The goal: within 3 points of float."""
    data = tmp_path / "rec100.npz"
    np.savez(data, x=ocr.make_rec_data(100, seed=7).images)
    output = tmp_path / "rec100.int8.onnx"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["quantize", str(require("ocr_rec")), "--dtype", "int8", "--calibrate", str(data), "-o",
                     str(output), "--no-eval", "--report-samples", "0", "--no-latency", "--json"]) == 0
    lines = measure_float.data("ocr_rec")
    float_figure = ocr.exact_match(measure_float.float_outputs("ocr_rec").texts, lines.labels)
    figure = ocr.exact_match(ocr.run_rec(ort_runner(output), lines).texts, lines.labels)
    print(f"\nrecogniser calibrated on 100 lines of seed 7: float {100 * float_figure:.2f}%, static int8 "
          f"{100 * figure:.2f}%")
    assert figure >= float_figure - 0.03
