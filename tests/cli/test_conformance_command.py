"""`qlinear conformance`: the pass table counts every official ONNX case and the TensorFlow grid, and
reports a wrong implementation as failures (exit status 1)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from qlinear import conformance
from qlinear.cli import main

pytest.importorskip("onnx")
pytest.importorskip("tensorflow")


@pytest.mark.full  # compiles every TensorFlow kernel variant cold (7 minutes of a 22-minute CI run); tests/tf has them
def test_everything_passes_and_is_counted(capsys):
    code = main(["conformance", "--json"])
    result = json.loads(capsys.readouterr().out)
    counts = {(r["suite"].split()[0], r["operator"]): (r["cases"], r["passed"], r["failed"]) for r in result["rows"]}
    assert code == 0 and result["passed"]
    # onnx 1.23.2 ships 27 Q/DQ cases and 18 of the conv/matmul family (as tests/conformance counts them)
    assert counts[("onnx", "QuantizeLinear")][0] + counts[("onnx", "DequantizeLinear")][0] == 27
    assert sum(counts[("onnx", op)][0] for op in ("QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger",
                                                   "DynamicQuantizeLinear")) == 18
    assert counts[("tensorflow-cpu", "QuantizeV2")][0] == 420 and counts[("tensorflow-cpu", "Dequantize")][0] == 420
    assert all(cases == passed and failed == [] for cases, passed, failed in counts.values())


def test_a_wrong_operator_is_reported(monkeypatch, capsys):
    import qlinear

    real = qlinear.quantize_linear

    def off_by_one_on_ties(x, *args, **kwargs):
        y = real(x, *args, **kwargs)
        return y if y.dtype != np.uint8 else (y.astype(np.int64) ^ 1).astype(np.uint8)

    monkeypatch.setattr(conformance, "run_tensorflow", lambda: {})
    monkeypatch.setattr(qlinear, "quantize_linear", off_by_one_on_ties)
    code = main(["conformance"])
    out = capsys.readouterr().out
    assert code == 1 and "some cases FAILED" in out
    assert "test_quantizelinear" in out
