"""User errors: one line on stderr naming the file/tensor and the problem, exit status 2, no traceback,
nothing written; never overwriting; the atomic-write guarantee; help texts with examples."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from qlinear.cli import main

from ._helpers import EXAMPLE, run


@pytest.fixture
def weights(tmp_path):
    path = tmp_path / "w.npz"
    np.savez(path, w=np.linspace(-1, 1, 60, dtype=np.float32).reshape(6, 10), s=np.float32(2))
    return path


def _fails(capsys, *args, match: str):
    code = main([str(a) for a in args])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert match in err, err
    return err


def test_missing_file_as_subprocess(tmp_path):
    result = run("quantize", tmp_path / "nothing.npz", "--dtype", "int8", "-o", tmp_path / "out.npz")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip() == f"qlinear quantize: error: {tmp_path / 'nothing.npz'}: no such file"
    assert list(tmp_path.iterdir()) == []


def test_unknown_dtype_as_subprocess(weights, tmp_path):
    result = run("quantize", weights, "--dtype", "int3", "-o", tmp_path / "out.npz")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--dtype 'int3' is not a type name qlinear knows" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out.npz").exists()


@pytest.mark.parametrize("suffix, content, match", [
    (".safetensors", b"\x10\x00\x00\x00\x00\x00\x00\x00{not json", "not a readable safetensors file"),
    (".safetensors", b"\xff" * 32, "not a readable safetensors file (header length"),
    (".npz", b"PK\x03\x04garbage", "not a readable .npz file"),
    (".npy", b"\x93NUMPY\x01\x00garbage", "not a readable .npy file"),
    (".onnx", b"\x08\x07garbage\xff\xff", "not a readable ONNX model"),
])
def test_corrupt_files(tmp_path, capsys, suffix, content, match):
    source = tmp_path / f"bad{suffix}"
    source.write_bytes(content)
    out = tmp_path / ("out.npz" if suffix in (".npy", ".npz") else f"out{suffix}")
    err = _fails(capsys, "quantize", source, "--dtype", "int8", "-o", out, match=match)
    assert str(source) in err
    assert sorted(p.name for p in tmp_path.iterdir()) == [source.name]


def test_safetensors_byte_range_outside_the_file(tmp_path, capsys):
    import json
    import struct

    header = json.dumps({"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]}}).encode()
    source = tmp_path / "short.safetensors"
    source.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 10)
    _fails(capsys, "quantize", source, "--dtype", "int8", "-o", tmp_path / "o.safetensors",
           match="tensor 'w' has byte range [0, 64) outside the 10 data bytes")


@pytest.mark.parametrize("args, match", [
    (["--dtype", "float32"], "float is not a quantized type"),
    (["--block-size", "0"], "--block-size must be a positive integer"),
    (["--granularity", "axis", "--axis", "2", "--exclude", "s"], "tensor 'w' of shape (6, 10) cannot take per-axis quantization: axis=2 is out of range"),
    (["--granularity", "axis", "--include", "s"], "tensor 's': a scalar (shape ()) cannot take per-axis quantization"),
])
def test_bad_requests_name_the_problem(weights, tmp_path, capsys, args, match):
    dtype = [] if "--dtype" in args else ["--dtype", "int8"]
    _fails(capsys, "quantize", weights, *dtype, *args, "-o", tmp_path / "out.npz", match=match)
    assert not (tmp_path / "out.npz").exists()


def test_contradicting_flags_are_a_usage_error(weights, tmp_path):
    result = run("quantize", weights, "--dtype", "int8", "--symmetric", "--asymmetric", "-o", tmp_path / "o.npz")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "--asymmetric: not allowed with argument --symmetric" in result.stderr


def test_nan_tensor(tmp_path, capsys):
    np.savez(tmp_path / "n.npz", bad=np.array([[1.0, np.nan, 2.0]], np.float32))
    _fails(capsys, "quantize", tmp_path / "n.npz", "--dtype", "int8", "-o", tmp_path / "o.npz",
           match="tensor 'bad' holds NaN or infinite values")
    assert not (tmp_path / "o.npz").exists() and len(list(tmp_path.iterdir())) == 1


def test_unknown_format_and_wrong_output_format(weights, tmp_path, capsys):
    (tmp_path / "w.txt").write_text("1 2 3")
    _fails(capsys, "quantize", tmp_path / "w.txt", "--dtype", "int8", match="unknown format '.txt'")
    _fails(capsys, "quantize", weights, "--dtype", "int8", "-o", tmp_path / "o.safetensors",
           match="the output of a .npz input is a .npz file")
    _fails(capsys, "dequantize", weights, "-o", tmp_path / "o.npz", match="has no qlinear metadata")


def test_never_overwrites_input_or_existing_output(weights, tmp_path, capsys):
    before = weights.read_bytes()
    _fails(capsys, "quantize", weights, "--dtype", "int8", "--exclude", "s", "-o", weights, "--force",
           match="is the input file")
    assert weights.read_bytes() == before
    existing = tmp_path / "exists.npz"
    existing.write_bytes(b"keep me")
    _fails(capsys, "quantize", weights, "--dtype", "int8", "--exclude", "s", "-o", existing, match="already exists; pass --force")
    assert existing.read_bytes() == b"keep me"
    assert main(["quantize", str(weights), "--dtype", "int8", "--exclude", "s", "-o", str(existing), "--force"]) == 0
    assert existing.read_bytes()[:2] == b"PK"


def test_usage_errors_are_one_line(tmp_path):
    result = run("quantize", "--dtype", "int8")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "qlinear quantize: error: the following arguments are required: INPUT (see 'qlinear quantize --help')"]


def test_help_shows_examples(capsys):
    result = run("--help")
    assert result.returncode == 0 and "examples:" in result.stdout and "qlinear quantize" in result.stdout
    for command in ("quantize", "dequantize", "conformance"):
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--help"])
        assert exit_info.value.code == 0
        assert "examples:" in capsys.readouterr().out


def _big_input(tmp_path):
    path = tmp_path / "big.npy"
    np.save(path, np.random.default_rng(0).standard_normal((4096, 8192), dtype=np.float32))  # 128 MiB
    return path


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_killed_run_leaves_no_output(tmp_path, how):
    source = _big_input(tmp_path)
    output = tmp_path / "out.npz"
    process = subprocess.Popen([sys.executable, "-m", "qlinear", "quantize", str(source), "--dtype", "int8",
                                "--granularity", "axis", "-o", str(output)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    partial = []
    while time.monotonic() < deadline and process.poll() is None:
        partial = [p for p in tmp_path.iterdir() if p.name.endswith(".partial") and p.stat().st_size > 0]
        if partial:
            break
        time.sleep(0.01)
    assert partial and process.poll() is None, "the run finished before it could be interrupted"
    process.send_signal(how)
    process.wait(timeout=120)
    assert not output.exists()
    if how == signal.SIGTERM:  # a catchable signal also removes the temporary file
        assert process.returncode == 130
        assert sorted(p.name for p in tmp_path.iterdir()) == ["big.npy"]


def test_onnx_missing_eval_file(tmp_path, capsys):
    pytest.importorskip("onnx")
    _fails(capsys, "quantize", EXAMPLE, "--dtype", "int8", "--eval", tmp_path / "none.npz", "-o", tmp_path / "o.onnx",
           match="none.npz: no such file")
    assert not (tmp_path / "o.onnx").exists()
