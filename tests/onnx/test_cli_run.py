"""`qlinear run`: outputs, the .npz file, --compare against onnxruntime, and one-line user errors (exit 2)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from _onnx_models import float_input, qoperator_chain, requantize_disagreement_model, run_onnxruntime

import qlinear.onnx as qonnx
from qlinear.cli import main

pytest.importorskip("onnxruntime")


def _qlinear(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qlinear", *map(str, args)], capture_output=True, text=True, cwd=cwd)


@pytest.fixture()
def chain(tmp_path):
    model = qoperator_chain(np.uint8, channels=(3, 8, 16), size=12)
    path = tmp_path / "chain.onnx"
    onnx.save(model, path)
    x = float_input(model, 0)["x"]
    np.save(tmp_path / "x.npy", x)
    return model, path, tmp_path / "x.npy", x


def test_run_writes_the_outputs_and_compares_with_onnxruntime(chain, tmp_path):
    model, path, x_file, x = chain
    out = _qlinear("run", path, "--input", f"x={x_file}", "-o", tmp_path / "out.npz", "--compare",
                   "--requantize", "float32")
    assert out.returncode == 0, out.stderr
    with np.load(tmp_path / "out.npz") as saved:
        assert list(saved) == ["y"]
        np.testing.assert_array_equal(saved["y"], qonnx.run(model, {"x": x}, requantize="float32")["y"], strict=True)
    assert "y: float32 (1, 16, 5, 5)" in out.stdout
    assert "vs onnxruntime: max |difference| 0, 0 of 400 elements differ" in out.stdout


def test_compare_reports_the_differing_elements(tmp_path, capsys):
    """The default float64 requantization differs from onnxruntime where their arithmetic does
    (docs/semantics.md conv row 1); the report counts those elements, computed here from both peers' outputs."""
    model = requantize_disagreement_model()
    onnx.save(model, tmp_path / "r.onnx")
    x = np.array([[[[0, 0], [1, 2]]]], np.uint8)
    np.save(tmp_path / "x.npy", x)
    ours, theirs = qonnx.run(model, {"x": x})["y"], run_onnxruntime(model, {"x": x})[0]
    differing = ours != theirs
    assert differing.any()
    assert main(["run", str(tmp_path / "r.onnx"), "--input", f"x={tmp_path / 'x.npy'}", "--compare", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["outputs"]
    assert row["differing_elements"] == int(differing.sum())
    assert row["max_abs_difference"] == float(np.abs(ours.astype(int) - theirs.astype(int)).max())
    main(["run", str(tmp_path / "r.onnx"), "--input", f"x={tmp_path / 'x.npy'}", "--compare", "--requantize", "float32"])
    assert f"0 of {x.size} elements differ" in capsys.readouterr().out
    # the TFLite modes reach the operators (the arithmetics themselves: tests/tflite/test_tflite_onnx_requantize.py)
    for mode in ("tflite", "tflite-single", "xnnpack"):
        assert main(["run", str(tmp_path / "r.onnx"), "--input", f"x={tmp_path / 'x.npy'}", "--requantize", mode,
                     "-o", str(tmp_path / f"{mode}.npz")]) == 0
        with np.load(tmp_path / f"{mode}.npz") as saved:
            np.testing.assert_array_equal(saved["y"], qonnx.run(model, {"x": x}, requantize=mode)["y"], strict=True)


@pytest.mark.parametrize(
    ("make_args", "message"),
    [
        (lambda p, x, t: ("run", p), r"missing input 'x'"),
        (lambda p, x, t: ("run", p, "--input", "=x.npy"), r"--input '=x.npy': expected NAME=FILE.npy, FILE.npy or FILE.npz"),
        (lambda p, x, t: ("run", p, "--input", f"x={t / 'x.npz'}"), r"NAME= takes a .npy file; a .npz feeds its arrays by their names"),
        (lambda p, x, t: ("run", t / "two.onnx", "--input", str(x)), r"without NAME= the model must have one input; it has \['a', 'b'\]"),
        (lambda p, x, t: ("run", p, "--input", str(x), "--input", f"x={x}"), r"input 'x' given twice"),
        (lambda p, x, t: ("run", p, "--input", f"x={x}", "--input", f"x={x}"), r"input 'x' given twice"),
        (lambda p, x, t: ("run", p, "--input", f"x={t / 'none.npy'}"), r"none.npy: no such file \(--input x=.*none.npy\)"),
        (lambda p, x, t: ("run", p, "--input", f"x={p}"), r"chain.onnx: not a .npy or .npz file"),
        (lambda p, x, t: ("run", t / "none.onnx", "--input", f"x={x}"), r"none.onnx: no such file"),
        (lambda p, x, t: ("run", x, "--input", f"x={x}"), r"x.npy: not an ONNX model"),
        (lambda p, x, t: ("run", p, "--input", f"q={x}"), r"unknown input 'q'; the model's inputs are \['x'\]"),
        (lambda p, x, t: ("run", p, "--input", f"x={t / 'x64.npy'}"), r"input 'x' must have the model's type float32, got float64"),
        (lambda p, x, t: ("run", p, "--input", f"x={x}", "-o", x), r"x.npy: already exists; pass --force"),
        (lambda p, x, t: ("run", p, "--input", f"x={x}", "-o", t / "o.npy"), r"o.npy: the outputs are written as .npz"),
    ],
)
def test_user_errors_are_one_line_with_exit_status_2(chain, tmp_path, make_args, message, capsys):
    # In-process through qlinear.cli.main (what `python -m qlinear` calls; a subprocess per case costs seconds).
    model, path, x_file, x = chain
    np.save(tmp_path / "x64.npy", x.astype(np.float64))
    np.savez(tmp_path / "x.npz", x=x)
    two = helper.make_model(helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b"], ["y"])], "two",
        [helper.make_tensor_value_info(n, TensorProto.UINT8, [2, 2]) for n in ("a", "b")],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [2, 2])]), opset_imports=[helper.make_opsetid("", 10)])
    onnx.save(two, tmp_path / "two.onnx")
    assert main([str(a) for a in make_args(path, x_file, tmp_path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("qlinear run: error: ")
    assert re.search(message, lines[0]), lines[0]
    assert not (tmp_path / "o.npy").exists()


def test_unsupported_operator_is_a_user_error(tmp_path, capsys):
    node = helper.make_node("QLinearAdd", ["a", "s", "z", "a", "s", "z", "s", "z"], ["y"], domain="com.microsoft")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.UINT8, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, [2])],
                              [onnx.numpy_helper.from_array(np.float32(1), "s"), onnx.numpy_helper.from_array(np.uint8(0), "z")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)]),
              tmp_path / "ms.onnx")
    np.save(tmp_path / "a.npy", np.zeros(2, np.uint8))
    assert main(["run", str(tmp_path / "ms.onnx"), "--input", str(tmp_path / "a.npy")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qlinear run: error: cannot run the model: Node type 'QLinearAdd' from domain 'com.microsoft'")
    assert err.count("\n") == 1


def test_input_file_forms(chain, tmp_path, capsys):
    """FILE.npy alone feeds a one-input model; FILE.npz feeds its arrays by name; both equal NAME=FILE.npy."""
    model, path, x_file, x = chain
    np.savez(tmp_path / "inputs.npz", x=x)
    outputs = []
    for spec in (f"x={x_file}", str(x_file), str(tmp_path / "inputs.npz")):
        out = tmp_path / f"out{len(outputs)}.npz"
        assert main(["run", str(path), "--input", spec, "-o", str(out)]) == 0
        with np.load(out) as saved:
            outputs.append(saved["y"])
    expected = qonnx.run(model, {"x": x})["y"]
    for value in outputs:
        np.testing.assert_array_equal(value, expected, strict=True)


def _main_without(module: str, args: list[str]) -> subprocess.CompletedProcess:
    code = (f"import sys\nsys.modules[{module!r}] = None\nfrom qlinear.cli import main\n"
            f"sys.exit(main({[str(a) for a in args]!r}))\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_missing_peers_are_user_errors(chain):
    model, path, x_file, x = chain
    out = _main_without("onnxruntime", ["run", path, "--input", f"x={x_file}", "--compare"])
    assert out.returncode == 2
    assert out.stderr.strip() == "qlinear run: error: --compare needs onnxruntime, which is not installed: pip install onnxruntime"
    out = _main_without("onnx", ["run", path, "--input", f"x={x_file}"])
    assert out.returncode == 2
    assert out.stderr.strip() == (
        "qlinear run: error: qlinear.onnx needs the onnx package, which is not installed: pip install 'qlinear[onnx]'"
    )


def test_json_report_is_strict_json_with_nan_outputs(tmp_path, capsys):
    """A NaN in an output (DequantizeLinear of a float8 NaN) makes its range null in the JSON report. The float8
    input comes from a .npy, which stores ml_dtypes types as raw bytes (|V1): read as the model's type."""
    import ml_dtypes

    node = helper.make_node("DequantizeLinear", ["x", "s"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT8E4M3FN, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
                              [onnx.numpy_helper.from_array(np.float32(2), "s")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), tmp_path / "f8.onnx")
    np.save(tmp_path / "x.npy", np.array([1, np.nan, -2], ml_dtypes.float8_e4m3fn))
    assert main(["run", str(tmp_path / "f8.onnx"), "--input", str(tmp_path / "x.npy"), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["outputs"]
    assert row["min"] is None and row["max"] is None
    assert main(["run", str(tmp_path / "f8.onnx"), "--input", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npz")]) == 0
    with np.load(tmp_path / "y.npz") as saved:
        np.testing.assert_array_equal(saved["y"], np.array([2, np.nan, -4], np.float32))
