"""Static int8 with the defaults (`qlinear quantize --dtype int8 --calibrate DATA`, `--target onnxruntime`) on
trained models beyond the corpus, from other exporters and with other layer mixes, that no default of qlinear was
chosen on: Magika's Keras Dense file-type model (tf2onnx), ddddocr's PyTorch captcha recogniser (CNN + LSTM) and
click-captcha detector (YOLOX) (openWakeWord's tf2onnx speech embedding with its PyTorch Dense heads: in
test_corpus_wakeword.py). Each is
calibrated on data made with one seed and measured on data made with another, against its labels and against the
float model, under the ONNX semantics (onnxruntime with basic optimizations), and in onnxruntime's int8 kernels
(its default optimizations) where those are exact (x86 with VNNI; tests/corpus/test_corpus_heldout.py says why).
Every written model passes onnx.checker's full check, and onnxruntime's optimized graph runs its products in int8.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from . import captcha, filetype
from .models import cpu_has_vnni, ort_runner, require, static_int8

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


def _int8_products(output: Path) -> dict:
    from qlinear.io import latency

    return latency.optimized_nodes(output)


@pytest.mark.full  # about 16 s: the full suite's (CI's 10 minutes); the captcha recogniser stays in the default run
def test_filetype_dense_keras_model(tmp_path):
    """Magika 0.5.1 (Keras via tf2onnx: four Dense layers as MatMul + Add between LayerNorms and GELUs):
    top-1 on 20 files of each of 26 types within 2 points of float (measured: float 99.36%, int8 99.57%)."""
    source = require("filetype")
    calibration, evaluation = filetype.make_filetype_data(6, seed=2), filetype.make_filetype_data(20, seed=1)
    data = tmp_path / "filetype.calibration.npz"
    np.savez(data, bytes=calibration.features)
    output = tmp_path / "filetype.int8.onnx"
    static_int8(source, data, output)
    float_figure = filetype.filetype_accuracy(filetype.run_filetype(ort_runner(source), evaluation), evaluation)
    semantics = filetype.filetype_accuracy(filetype.run_filetype(ort_runner(output), evaluation), evaluation)
    kernels = filetype.filetype_accuracy(filetype.run_filetype(ort_runner(output, optimized=True), evaluation),
                                         evaluation)
    print(f"\nfiletype ({len(evaluation)} files): float {100 * float_figure:.2f}%, static int8 {100 * semantics:.2f}% "
          f"(ONNX semantics), {100 * kernels:.2f}% (onnxruntime's int8 kernels)")
    assert float_figure >= 0.95
    assert semantics >= float_figure - 0.02
    if cpu_has_vnni():
        assert kernels >= float_figure - 0.02
    nodes = _int8_products(output)
    assert nodes["int8"].get("QLinearMatMul") == 4, nodes


def test_captcha_recogniser_pytorch_cnn_lstm(tmp_path):
    """ddddocr's recogniser (PyTorch 1.9, opset 12: CNN with SiLU, a bidirectional LSTM that stays float, the
    8210-class Gemm): exact match (ignoring case) on 200 rendered captchas within 3 points of float (measured:
    float 95.0%, int8 94.0%). Its opset-21 conversion needs the output-shape repair (test_valid_models)."""
    source = require("captcha_rec")
    calibration, evaluation = captcha.make_captcha_data(64, seed=1), captcha.make_captcha_data(200)
    data = tmp_path / "captcha.calibration.npz"
    np.savez(data, input1=calibration.images)
    output = tmp_path / "captcha.int8.onnx"
    static_int8(source, data, output)
    float_figure = captcha.captcha_accuracy(captcha.run_captcha(ort_runner(source), evaluation), evaluation.labels)
    semantics = captcha.captcha_accuracy(captcha.run_captcha(ort_runner(output), evaluation), evaluation.labels)
    print(f"\ncaptcha recogniser (200): float {100 * float_figure:.2f}%, static int8 {100 * semantics:.2f}% (ONNX "
          f"semantics)")
    assert float_figure >= 0.85
    assert semantics >= float_figure - 0.03
    if cpu_has_vnni():  # without VNNI onnxruntime's kernels are not exact: BENCHMARKS.md has what they score
        kernels = captcha.captcha_accuracy(captcha.run_captcha(ort_runner(output, optimized=True), evaluation),
                                           evaluation.labels)
        assert kernels >= float_figure - 0.03
    nodes = _int8_products(output)
    # 21 convolutions: the first reads the grayscale image and stays float (placement rule 4).
    assert nodes["int8"].get("QLinearConv") == 20 and nodes["int8"].get("QGemm") == 1, nodes
    assert nodes["float"].get("Conv", 0) + nodes["float"].get("FusedConv", 0) == 1, nodes


@pytest.mark.full  # about 14 s: the full suite's (CI's 10 minutes)
def test_click_detector_pytorch_yolox(tmp_path):
    """ddddocr's click-captcha detector (PyTorch 1.9, opset 11, YOLOX: 80 SiLU as QLinearSigmoid + QLinearMul,
    Concat, SPP MaxPool, Resize): box recall at IoU 0.5 on 50 rendered pages within 2 points of float and the
    float boxes found again (measured: recall 98.3% both, agreement 99.6%); the whole graph runs in int8."""
    source = require("captcha_det")
    calibration, evaluation = captcha.make_click_pages(8, seed=1), captcha.make_click_pages(50)
    data = tmp_path / "click.calibration.npz"
    np.savez(data, images=np.concatenate([page.x for page in calibration]))
    output = tmp_path / "click.int8.onnx"
    static_int8(source, data, output)
    float_boxes = captcha.run_click(ort_runner(source), evaluation)
    int8_boxes = captcha.run_click(ort_runner(output), evaluation)
    recall = captcha.box_recall(float_boxes, evaluation), captcha.box_recall(int8_boxes, evaluation)
    agreement = captcha.box_agreement(float_boxes, int8_boxes)
    print(f"\nclick detector (50 pages): recall float {recall[0]:.3f}, static int8 {recall[1]:.3f}; float boxes found "
          f"again {agreement:.3f} (ONNX semantics)")
    assert recall[0] >= 0.9
    assert recall[1] >= recall[0] - 0.02 and agreement >= 0.95
    if cpu_has_vnni():  # without VNNI onnxruntime's kernels are not exact: BENCHMARKS.md has what they score
        assert captcha.box_agreement(float_boxes, captcha.run_click(ort_runner(output, optimized=True), evaluation)) >= 0.95
    nodes = _int8_products(output)
    assert nodes["int8"].get("QLinearConv") == 83 and not nodes["float"], nodes
