"""`qlinear quantize` then `qlinear dequantize` on real files, for every quantized type and each file
format, checked against onnx's reference QuantizeLinear/DequantizeLinear and onnx's own reading of
the packed bytes.

Every type in every format, the granularities taking turns; one round trip per format runs the command
as a subprocess, the others call `qlinear.cli.main` in-process (the same code, without paying for a
Python start each time).
"""

from __future__ import annotations

import json
import math

import ml_dtypes
import numpy as np
import pytest

from qlinear.cli import main

from ._helpers import (BITS, QUANTIZED_TYPES, TENSORPROTO, read_tensor_file, run, stored_to_onnx_array,
                       onnx_node)

pytest.importorskip("onnx")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

FLOAT = 1  # TensorProto.FLOAT
GRANULARITIES = [
    ["--granularity", "tensor", "--asymmetric"],
    ["--granularity", "axis"],  # axis 0
    ["--block-size", "16"],  # blocks along the last axis
    [],  # the defaults: per channel (axis 0) for 8/16-bit types, blocks of 32 along the last axis below
    ["--granularity", "axis", "--axis", "-1", "--asymmetric"],
    ["--block-size", "8", "--axis", "0", "--symmetric"],
]
FORMATS = ["npz", "safetensors", "npy"]


def _inputs(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "layer.weight": (rng.standard_normal((24, 40)) * 0.3 + 0.05).astype(np.float32),
        "layer.bias": rng.uniform(-2, 3, size=40).astype(np.float32),
        "positions": np.arange(6, dtype=np.int32),
    }


def _write(tmp_path, fmt: str, arrays: dict):
    if fmt == "npy":
        path = tmp_path / "layer.weight.npy"
        np.save(path, arrays["layer.weight"])
        return path
    path = tmp_path / f"model.{fmt}"
    if fmt == "npz":
        np.savez(path, **arrays)
    else:
        safetensors_numpy.save_file(arrays, str(path), metadata={"format": "pt"})
    return path


def _in_process(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _expand(param: np.ndarray, shape, info) -> np.ndarray:
    if info["granularity"] == "tensor":
        return param.reshape(())
    axis = info["axis"]
    if info["granularity"] == "axis":
        return param.reshape([-1 if i == axis else 1 for i in range(len(shape))])
    return np.repeat(param, info["block_size"], axis=axis).take(np.arange(shape[axis]), axis=axis)


def _check_round_trip(tmp_path, fmt, qtype, granularity, invoke):
    original = _inputs(len(qtype) + len(fmt))
    source = _write(tmp_path, fmt, original)
    if fmt == "npy":
        original = {"layer.weight": original["layer.weight"]}
    out_suffix = "npz" if fmt == "npy" else fmt
    quantized = tmp_path / f"quantized.{out_suffix}"
    code, out, err = invoke("quantize", source, "--dtype", qtype, *granularity, "-o", quantized, "--json")
    assert code == 0, err
    report = json.loads(out)
    stored, meta = read_tensor_file(quantized)
    tp = TENSORPROTO[qtype]
    expected_restored = {}
    for name, x in original.items():
        if x.dtype != np.float32 or x.ndim < 2:  # 1-D tensors (biases) stay float by default
            assert np.array_equal(stored[name], x) and name in meta["copied"]
            expected_restored[name] = x
            continue
        info = meta["tensors"][name]
        if not granularity:
            bits = BITS.get(qtype, 8)
            assert (info["granularity"], info["axis"]) == (("axis", 0) if bits >= 8 else ("block", 1))
            assert info["block_size"] == (0 if bits >= 8 else 32)
            assert info["symmetric"] == (bits >= 8 or not qtype.startswith(("int", "uint")))
        assert info["dtype"] == qtype and tuple(info["shape"]) == x.shape
        if "--block-size" in granularity:
            assert info["granularity"] == "block" and info["block_size"] == int(granularity[granularity.index("--block-size") + 1])
        values = stored_to_onnx_array(stored[name], qtype, x.shape)
        scale = stored[name + ".scale"]
        zero_point = stored_to_onnx_array(stored[name + ".zero_point"], qtype, scale.shape)
        if qtype in BITS:
            assert stored[name].nbytes == math.ceil(x.size * BITS[qtype] / 8)  # packed
        assert np.all(scale > 0) and scale.dtype == np.float32
        attrs = {}
        if info["granularity"] != "tensor":
            attrs["axis"] = info["axis"]
        if info["granularity"] == "block":
            attrs["block_size"] = info["block_size"]
        if qtype.startswith("float6"):
            # onnx 1.23's reference stops at QuantizeLinear-25, before float6: the spec's formula in NumPy.
            restored = (values.astype(np.float32) * _expand(scale, x.shape, info)).astype(np.float32)
        else:
            reference_q = onnx_node("QuantizeLinear", 25, [x, scale, zero_point], [FLOAT, FLOAT, tp], tp, **attrs)
            assert np.array_equal(np.asarray(reference_q).view(np.uint8), values.view(np.uint8)), name
            restored = onnx_node("DequantizeLinear", 25, [values, scale, zero_point], [tp, FLOAT, tp], FLOAT, **attrs)
        expected_restored[name] = restored
        error = np.abs(x.astype(np.float64) - restored.astype(np.float64))
        row = next(r for r in report["tensors"] if r["name"] == name)
        assert row["max_abs_error"] == pytest.approx(float(error.max()), rel=1e-12, abs=0)
        noise = float(np.sum(error**2))
        if noise:
            assert row["sqnr_db"] == pytest.approx(10 * math.log10(float(np.sum(x.astype(np.float64) ** 2)) / noise), rel=1e-9)
        if qtype in ("int8", "uint8", "int16", "uint16", "int4", "uint4", "int2", "uint2"):
            # the calibrated range covers every value, so nothing saturates: at most half a step off, plus the
            # float32 rounding of x / scale and of the product (one ulp of x each)
            bound = _expand(scale, x.shape, info).astype(np.float64) / 2 + np.abs(x.astype(np.float64)) * 2.0**-22
            assert np.all(error <= bound)

    restored_path = tmp_path / f"restored.{out_suffix}"
    code, out, err = invoke("dequantize", quantized, "-o", restored_path)
    assert code == 0, err
    restored, meta = read_tensor_file(restored_path)
    assert meta == {} and sorted(restored) == sorted(original)
    for name, expected in expected_restored.items():
        assert restored[name].dtype == original[name].dtype
        assert np.array_equal(restored[name].view(np.uint8), np.asarray(expected).view(np.uint8)), name


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("qtype", QUANTIZED_TYPES)
def test_round_trip_every_type(tmp_path, capsys, qtype, fmt):
    i = QUANTIZED_TYPES.index(qtype) + FORMATS.index(fmt)
    _check_round_trip(tmp_path, fmt, qtype, GRANULARITIES[i % len(GRANULARITIES)], lambda *a: _in_process(capsys, *a))


@pytest.mark.parametrize("fmt, qtype, granularity", [
    ("npz", "int4", ["--block-size", "16"]),
    ("safetensors", "float8e4m3fn", ["--granularity", "axis"]),
    ("npy", "uint8", ["--symmetric"]),
])
def test_round_trip_as_subprocess(tmp_path, fmt, qtype, granularity):
    def invoke(*args):
        result = run(*args)
        return result.returncode, result.stdout, result.stderr

    _check_round_trip(tmp_path, fmt, qtype, granularity, invoke)


def test_safetensors_metadata_kept_and_other_types_copied(tmp_path, capsys):
    arrays = {"w": np.linspace(-1, 1, 64, dtype=np.float16).reshape(8, 8),
              "b": np.linspace(-1, 1, 8).astype(ml_dtypes.bfloat16), "step": np.array(7, np.int64)}
    source = tmp_path / "m.safetensors"
    safetensors_numpy.save_file({"w": arrays["w"], "step": arrays["step"]}, str(source), metadata={"format": "pt"})
    code, out, err = _in_process(capsys, "quantize", source, "--dtype", "int8", "-o", tmp_path / "q.safetensors")
    assert code == 0, err
    from safetensors import safe_open

    with safe_open(str(tmp_path / "q.safetensors"), framework="np") as f:
        assert f.metadata()["format"] == "pt"
        assert f.get_tensor("step") == 7 and f.get_tensor("w").dtype == np.int8
    code, out, err = _in_process(capsys, "dequantize", tmp_path / "q.safetensors", "-o", tmp_path / "r.safetensors")
    assert code == 0, err
    restored = safetensors_numpy.load_file(str(tmp_path / "r.safetensors"))
    assert restored["w"].dtype == np.float16 and restored["step"] == 7
    assert np.max(np.abs(restored["w"].astype(np.float32) - arrays["w"].astype(np.float32))) <= 1 / 127


def test_include_exclude_and_min_elements(tmp_path, capsys):
    arrays = {"enc.weight": np.ones((4, 64), np.float32), "enc.bias": np.ones(64, np.float32),
              "dec.weight": np.ones((4, 64), np.float32), "tiny": np.ones((1, 3), np.float32)}
    np.savez(tmp_path / "m.npz", **arrays)
    code, out, err = _in_process(capsys, "quantize", tmp_path / "m.npz", "--dtype", "int8", "--include", "*.weight",
                                 "--exclude", "dec.*", "-o", tmp_path / "q.npz", "--json")
    assert code == 0, err
    rows = {r["name"]: r for r in json.loads(out)["tensors"]}
    assert rows["enc.weight"]["quantized"] and not rows["dec.weight"]["quantized"]
    assert rows["dec.weight"]["note"] == "matched by --exclude" and rows["enc.bias"]["note"] == "not matched by --include"
    code, out, err = _in_process(capsys, "quantize", tmp_path / "m.npz", "--dtype", "int8", "--min-elements", "100",
                                 "-o", tmp_path / "q2.npz", "--json")
    rows = {r["name"]: r for r in json.loads(out)["tensors"]}
    assert [n for n, r in rows.items() if r["quantized"]] == ["enc.weight", "dec.weight"]
    assert "below --min-elements 100" in rows["tiny"]["note"]


def test_default_output_name_and_table(tmp_path):
    np.save(tmp_path / "w.npy", np.linspace(-1, 1, 100, dtype=np.float32).reshape(2, 50))
    result = run("quantize", tmp_path / "w.npy", "--dtype", "int4")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "w.int4.npz").exists()
    assert "float32 -> int4" in result.stdout and "smaller" in result.stdout


def test_plot_writes_a_png_per_tensor(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    np.savez(tmp_path / "m.npz", a=np.random.default_rng(1).standard_normal((16, 64)).astype(np.float32),
             b=np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32))
    code, out, err = _in_process(capsys, "quantize", tmp_path / "m.npz", "--dtype", "int4", "--block-size", "32",
                                 "-o", tmp_path / "q.npz", "--plot", tmp_path / "plots")
    assert code == 0, err
    pngs = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert pngs == ["a.png", "b.png"]
    assert (tmp_path / "plots" / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_dequantize_to_npy_and_onnx_include(tmp_path, capsys):
    x = np.linspace(-3, 5, 120, dtype=np.float32).reshape(10, 12)
    np.save(tmp_path / "x.npy", x)
    assert _in_process(capsys, "quantize", tmp_path / "x.npy", "--dtype", "uint8", "--granularity", "tensor",
                       "--asymmetric", "-o", tmp_path / "q.npz")[0] == 0
    code, out, err = _in_process(capsys, "dequantize", tmp_path / "q.npz", "-o", tmp_path / "x2.npy")
    assert code == 0, err
    restored = np.load(tmp_path / "x2.npy")
    assert restored.dtype == np.float32 and restored.shape == x.shape
    assert np.max(np.abs(restored - x)) <= (8 / 255) / 2 * (1 + 1e-6)


def test_onnx_include_selects_any_initializer(tmp_path, capsys):
    from ._helpers import EXAMPLE

    code, out, err = _in_process(capsys, "quantize", EXAMPLE, "--dtype", "int8", "--include", "*.bias",
                                 "--min-elements", "0", "-o", tmp_path / "b.onnx", "--json", "--no-eval")
    assert code == 0, err
    rows = {r["name"]: r for r in json.loads(out)["tensors"]}
    assert all(rows[f"fc{i}.bias"]["quantized"] for i in (1, 2, 3))
    assert not any(rows[f"fc{i}.weight"]["quantized"] for i in (1, 2, 3))
    import onnx

    model = onnx.load(str(tmp_path / "b.onnx"))
    onnx.checker.check_model(model, full_check=True)
    assert sorted(n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear") == ["fc1.bias", "fc2.bias", "fc3.bias"]


def test_compressed_npz_input(tmp_path, capsys):
    """np.savez_compressed members are read whole (np.savez ones are memory-mapped); both give the same."""
    x = np.random.default_rng(5).standard_normal((16, 48)).astype(np.float32)
    np.savez(tmp_path / "plain.npz", w=x)
    np.savez_compressed(tmp_path / "packed.npz", w=x)
    for name in ("plain", "packed"):
        code, out, err = _in_process(capsys, "quantize", tmp_path / f"{name}.npz", "--dtype", "int4", "--block-size", "16",
                                     "-o", tmp_path / f"{name}-q.npz")
        assert code == 0, err
    plain, _ = read_tensor_file(tmp_path / "plain-q.npz")
    packed, _ = read_tensor_file(tmp_path / "packed-q.npz")
    assert sorted(plain) == sorted(packed) and all(np.array_equal(plain[k], packed[k]) for k in plain)


def test_norm_scales_and_biases_of_a_checkpoint_stay_float(tmp_path, capsys):
    """A transformer checkpoint's names: the 1-D norm weights and biases are kept by default (they were
    quantized before), the matrices are quantized per output channel; --include names a 1-D tensor in."""
    rng = np.random.default_rng(2)
    arrays = {"model.embed_tokens.weight": rng.standard_normal((32, 16)).astype(np.float32),
              "model.layers.0.input_layernorm.weight": (1 + 0.1 * rng.standard_normal(16)).astype(np.float32),
              "model.layers.0.self_attn.q_proj.weight": rng.standard_normal((16, 16)).astype(np.float32),
              "model.layers.0.self_attn.q_proj.bias": rng.standard_normal(16).astype(np.float32),
              "model.norm.weight": np.ones(16, np.float32)}
    source = tmp_path / "model.safetensors"
    safetensors_numpy.save_file(arrays, str(source))
    code, out, err = _in_process(capsys, "quantize", source, "--dtype", "int8", "-o", tmp_path / "q.safetensors",
                                 "--json")
    assert code == 0, err
    rows = {r["name"]: r for r in json.loads(out)["tensors"]}
    for name, array in arrays.items():
        assert rows[name]["quantized"] == (array.ndim == 2), name
        if array.ndim == 2:
            assert rows[name]["granularity"] == "per-axis (axis 0)" and rows[name]["symmetric"]
        else:
            assert rows[name]["note"] == "1-D (a bias or norm scale); --include it to quantize it"
    code, out, err = _in_process(capsys, "quantize", source, "--dtype", "int8", "--include", "*norm*",
                                 "-o", tmp_path / "q2.safetensors", "--json")
    rows = {r["name"]: r for r in json.loads(out)["tensors"]}
    assert [n for n, r in rows.items() if r["quantized"]] == ["model.layers.0.input_layernorm.weight", "model.norm.weight"]
