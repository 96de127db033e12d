"""`qlinear conformance`: qlinear against the peers, on a user's machine, as a pass table per operator.

- ONNX: every official backend node case (``onnx.backend.test.case.node.collect_testcases()``) of the
  operators qlinear implements, run through the qlinear function and compared bit for bit with the
  expected outputs that onnx ships (dtype, shape and bytes; NaN equals NaN for float outputs).
- TensorFlow: QuantizeV2 and Dequantize run by tensorflow-cpu itself (its plain CPU kernels, oneDNN
  off) and by `qlinear.tf` on a fixed grid (every mode, round mode, narrow_range and type, per tensor
  and per axis, over several ranges, on inputs inside, at and beyond the range ends), compared bit
  for bit. TensorFlow's published test vectors are replayed by the test suite (tests/tf).

The peers come with ``pip install 'qlinear[conformance]'``; a missing peer is reported, not an error
for the other.
"""

from __future__ import annotations

import json
import os
import sys
import warnings

import numpy as np

from .io.errors import UserError

ONNX_OPERATORS = ("QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "ConvInteger",
                  "MatMulInteger", "DynamicQuantizeLinear")


def _same(actual, expected) -> bool:
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.dtype != expected.dtype or actual.size != expected.size:
        return False
    if actual.shape != expected.shape and not (actual.size == 1 and actual.ndim <= 1 and expected.ndim <= 1):
        return False
    a = np.ascontiguousarray(actual).reshape(-1)
    e = np.ascontiguousarray(expected).reshape(-1)
    if a.tobytes() == e.tobytes():
        return True
    if a.dtype.kind == "f":  # NaN payloads may differ
        return bool(np.array_equal(a, e, equal_nan=True))
    return False


def _onnx_function(op: str):
    import qlinear

    return {
        "QuantizeLinear": qlinear.quantize_linear, "DequantizeLinear": qlinear.dequantize_linear,
        "QLinearConv": qlinear.qlinear_conv, "QLinearMatMul": qlinear.qlinear_matmul,
        "ConvInteger": qlinear.conv_integer, "MatMulInteger": qlinear.matmul_integer,
        "DynamicQuantizeLinear": qlinear.dynamic_quantize_linear,
    }[op]


def run_onnx() -> dict[str, dict]:
    import onnx
    from onnx import helper, numpy_helper
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases()
    results = {op: {"cases": 0, "passed": 0, "failed": []} for op in ONNX_OPERATORS}
    for case in cases:
        if case.model is None:
            continue
        if case.name.startswith("test_dynamicquantizelinear"):
            op = "DynamicQuantizeLinear"  # includes the *_expanded models: same inputs and outputs
        elif len(case.model.graph.node) == 1 and case.model.graph.node[0].op_type in ONNX_OPERATORS:
            op = case.model.graph.node[0].op_type
        else:
            continue
        opset = next((o.version for o in case.model.opset_import if o.domain in ("", "ai.onnx")), None)
        function = _onnx_function(op)
        for inputs, expected in case.data_sets:
            inputs = [numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else np.asarray(v) for v in inputs]
            expected = [numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else np.asarray(v) for v in expected]
            results[op]["cases"] += 1
            try:
                if op == "DynamicQuantizeLinear":
                    outputs = list(function(inputs[0]))
                else:
                    node = case.model.graph.node[0]
                    feeds = dict(zip([i.name for i in case.model.graph.input], inputs))
                    args = [feeds[name] if name else None for name in node.input]
                    while args and args[-1] is None:
                        args.pop()
                    kwargs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
                    if op == "DequantizeLinear":
                        kwargs.pop("saturate", None)
                    if op in ("QuantizeLinear", "DequantizeLinear", "QLinearMatMul"):
                        kwargs["opset"] = opset
                    outputs = [function(*args, **kwargs)]
                ok = len(outputs) == len(expected) and all(_same(a, e) for a, e in zip(outputs, expected))
            except Exception as error:  # a crash on an official case is a failure to report, not to raise
                ok = False
                results[op].setdefault("errors", []).append(f"{case.name}: {type(error).__name__}: {error}")
            if ok:
                results[op]["passed"] += 1
            else:
                results[op]["failed"].append(case.name)
    return results


# ----------------------------------------------------------------------------------------------------
# TensorFlow

TF_TYPES = ("qint8", "quint8", "qint16", "quint16", "qint32")
TF_RANGES = ((-1.0, 1.0), (-2.5, 7.25), (0.3, 6.0), (-6.0, -0.3), (2.0, 2.0), (-1e-3, 4e-3))


def _tf_grid_input(lo: float, hi: float) -> np.ndarray:
    rng = np.random.default_rng(0)
    width = max(abs(lo), abs(hi))
    x = rng.uniform(-1.5 * width, 1.5 * width, 97)
    specials = [0.0, -0.0, lo, hi, (lo + hi) / 2, np.inf, -np.inf, 0.5, -0.5, 1.5, 2.5, 1e-40, -1e-40, 3e38, -3e38]
    x[: len(specials)] = specials
    return x.astype(np.float32)


def run_tensorflow() -> dict[str, dict]:
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"  # the plain CPU kernels (oneDNN computes other numbers)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from .tf import dequantize, quantize_v2

    # If TensorFlow was imported earlier in this process with oneDNN on, its _Mkl kernels answer; they
    # give SCALED quint8 Dequantize of 255 over [842297.8, 1451076.9] as about 2.1e8 instead of the max.
    probe = tf.raw_ops.Dequantize(input=tf.constant(np.array([255], np.uint8), dtype=tf.quint8),
                                  min_range=np.float32(842297.8), max_range=np.float32(1451076.9),
                                  mode="SCALED", narrow_range=True).numpy()
    if abs(float(probe[0]) - 1451076.9) >= 1.0:
        raise UserError("TensorFlow runs its oneDNN kernels here, not the plain CPU kernels qlinear.tf matches; "
                        "run with TF_ENABLE_ONEDNN_OPTS=0 in the environment")

    results = {op: {"cases": 0, "passed": 0, "failed": []} for op in ("QuantizeV2", "Dequantize")}
    combos = [(mode, round_mode, narrow, T)
              for mode in ("MIN_COMBINED", "MIN_FIRST", "SCALED")
              for round_mode in (("HALF_AWAY_FROM_ZERO", "HALF_TO_EVEN") if mode == "SCALED" else ("HALF_AWAY_FROM_ZERO",))
              for narrow in (False, True) for T in TF_TYPES]
    for mode, round_mode, narrow, T in combos:
        for lo, hi in TF_RANGES:
            for per_axis in (False, True):
                if per_axis and mode == "MIN_FIRST":
                    continue  # TensorFlow has no per-axis MIN_FIRST
                label = f"{mode}/{round_mode}/narrow_range={narrow}/{T}/[{lo}, {hi}]{'/axis=1' if per_axis else ''}"
                x = _tf_grid_input(lo, hi)
                attrs = dict(mode=mode, round_mode=round_mode, narrow_range=narrow)
                lows, highs = np.float32(lo), np.float32(hi)
                if per_axis:
                    x = x[:96].reshape(4, 3, 8)
                    lows = np.float32([lo, lo * 2, lo / 2])
                    highs = np.float32([hi, hi * 2, hi / 2])
                    attrs["axis"] = 1
                results["QuantizeV2"]["cases"] += 1
                try:
                    theirs = tf.raw_ops.QuantizeV2(input=x, min_range=lows, max_range=highs, T=tf.as_dtype(T), **attrs)
                    their_q = theirs.output.numpy()
                    ours = quantize_v2(x, lows, highs, T, **attrs)
                    ok = (_same(ours[0], their_q) and _same(np.asarray(ours[1], np.float32), theirs.output_min.numpy())
                          and _same(np.asarray(ours[2], np.float32), theirs.output_max.numpy()))
                except Exception:
                    ok, ours = False, None
                if not ok:
                    results["QuantizeV2"]["failed"].append(label)
                    continue
                results["QuantizeV2"]["passed"] += 1
                q, out_min, out_max = ours
                dequantize_attrs = {"mode": mode, "narrow_range": narrow}
                if per_axis:
                    dequantize_attrs["axis"] = 1
                results["Dequantize"]["cases"] += 1
                try:
                    theirs = tf.raw_ops.Dequantize(input=tf.constant(q, dtype=tf.as_dtype(T)), min_range=out_min,
                                                   max_range=out_max, **dequantize_attrs).numpy()
                    ok = _same(dequantize(q, out_min, out_max, **dequantize_attrs), theirs)
                except Exception:
                    ok = False
                if ok:
                    results["Dequantize"]["passed"] += 1
                else:
                    results["Dequantize"]["failed"].append(label)
    return results


# ----------------------------------------------------------------------------------------------------


def conformance_command(args) -> int:
    rows = []
    notes = []
    try:
        import onnx  # noqa: F401

        for op, result in run_onnx().items():
            rows.append({"suite": "onnx backend cases", "operator": op, **result})
    except ImportError:
        notes.append("onnx is not installed: the ONNX backend cases were not run (pip install 'qlinear[conformance]')")
    try:
        import importlib.util

        if importlib.util.find_spec("tensorflow") is None:
            raise ImportError
        for op, result in run_tensorflow().items():
            rows.append({"suite": "tensorflow-cpu grid", "operator": op, **result})
    except ImportError:
        notes.append("tensorflow is not installed: the TensorFlow comparison was not run (pip install 'qlinear[conformance]')")
    if not rows:
        raise UserError("neither onnx nor tensorflow is installed; pip install 'qlinear[conformance]'")
    all_passed = all(not r["failed"] for r in rows)
    if args.json:
        print(json.dumps({"rows": rows, "notes": notes, "passed": all_passed}, indent=2))
    else:
        from rich.console import Console
        from rich.table import Table

        console = Console(width=None if sys.stdout.isatty() else 140)
        table = Table(title="qlinear conformance", title_justify="left")
        for column, justify in (("suite", "left"), ("operator", "left"), ("cases", "right"), ("passed", "right"),
                                ("failed", "right"), ("first failures", "left")):
            table.add_column(column, justify=justify)
        for r in rows:
            table.add_row(r["suite"], r["operator"], str(r["cases"]), str(r["passed"]), str(len(r["failed"])),
                          ", ".join(r["failed"][:3]))
        console.print(table)
        for note in notes:
            console.print(note)
        console.print("all passed" if all_passed else "some cases FAILED")
    return 0 if all_passed else 1
