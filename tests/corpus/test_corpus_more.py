"""Static int8 with the defaults (`qlinear quantize --dtype int8 --calibrate DATA`, `--target onnxruntime`) on
trained models beyond the corpus, from other exporters and with other layer mixes, that no default of qlinear was
chosen on: Magika's Keras Dense file-type model (tf2onnx), ddddocr's PyTorch captcha recogniser (CNN + LSTM) and
click-captcha detector (YOLOX), and openWakeWord's tf2onnx speech embedding with its PyTorch Dense heads. Each is
calibrated on data made with one seed and measured on data made with another, against its labels and against the
float model, under the ONNX semantics (onnxruntime with basic optimizations), and in onnxruntime's int8 kernels
(its default optimizations) where those are exact (x86 with VNNI; tests/corpus/test_corpus_heldout.py says why).
Every written model passes onnx.checker's full check, and onnxruntime's optimized graph runs its products in int8.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

from qlinear.cli import main

from . import filetype
from .models import ort_runner, require

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


def _cpu_has_vnni() -> bool:
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return False
    return bool({"avx512_vnni", "avx_vnni"} & set(flags))


def _static(source: Path, data: Path, output: Path) -> dict:
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["quantize", str(source), "--dtype", "int8", "--calibrate", str(data), "-o", str(output),
                     "--no-eval", "--report-samples", "0", "--no-latency", "--json"])
    assert code == 0
    report = json.loads(stdout.getvalue())
    assert report["model"]["checker"].startswith("passed")
    onnx.checker.check_model(str(output), full_check=True)
    return report


def _int8_products(output: Path) -> dict:
    from qlinear.io import latency

    return latency.optimized_nodes(output)


def test_filetype_dense_keras_model(tmp_path):
    """Magika 0.5.1 (Keras via tf2onnx: four Dense layers as MatMul + Add between LayerNorms and GELUs):
    top-1 on 20 files of each of 26 types within 2 points of float (measured: float 99.36%, int8 99.57%)."""
    source = require("filetype")
    calibration, evaluation = filetype.make_filetype_data(6, seed=2), filetype.make_filetype_data(20, seed=1)
    data = tmp_path / "filetype.calibration.npz"
    np.savez(data, bytes=calibration.features)
    output = tmp_path / "filetype.int8.onnx"
    _static(source, data, output)
    float_figure = filetype.filetype_accuracy(filetype.run_filetype(ort_runner(source), evaluation), evaluation)
    semantics = filetype.filetype_accuracy(filetype.run_filetype(ort_runner(output), evaluation), evaluation)
    kernels = filetype.filetype_accuracy(filetype.run_filetype(ort_runner(output, optimized=True), evaluation),
                                         evaluation)
    print(f"\nfiletype ({len(evaluation)} files): float {100 * float_figure:.2f}%, static int8 {100 * semantics:.2f}% "
          f"(ONNX semantics), {100 * kernels:.2f}% (onnxruntime's int8 kernels)")
    assert float_figure >= 0.95
    assert semantics >= float_figure - 0.02
    if _cpu_has_vnni():
        assert kernels >= float_figure - 0.02
    nodes = _int8_products(output)
    assert nodes["int8"].get("QLinearMatMul") == 4, nodes
