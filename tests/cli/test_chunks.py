"""`qlinear quantize --chunks` and .zarr stores: the command (in this process; the errors as a subprocess), with chunks small enough
to split rows, blocks and zarr storage chunks, must give exactly what `qlinear.quantize_linear` gives
on the whole array (itself checked against the ONNX peers in tests/ops), and what the in-memory path
of the same command gives; `qlinear dequantize` restores a store; errors are one line, exit 2."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

import qlinear
from qlinear import calibrate
from qlinear.cli import main
from qlinear.dtypes import get
from qlinear.granularity import Granularity

from ._helpers import EXAMPLE, in_process, read_tensor_file, run

zarr = pytest.importorskip("zarr")
pytest.importorskip("dask.array")

RNG = np.random.default_rng(7)
MATRIX = (RNG.standard_normal((37, 51)) * np.linspace(0.1, 4, 51)).astype(np.float32)

# (dtype, command-line granularity, Granularity kind, axis, block size, zarr storage chunks, --chunks)
CASES = [
    ("int8", ["--granularity", "tensor", "--asymmetric"], "tensor", None, 0, (10, 7), "100"),
    ("uint8", ["--granularity", "axis", "--axis", "0", "--asymmetric"], "axis", 0, 0, (10, 7), "300B"),
    ("int16", ["--granularity", "axis", "--axis", "1"], "axis", 1, 0, (4, 51), "64"),  # symmetric: the default
    ("int4", ["--block-size", "4", "--axis", "1"], "block", 1, 4, (10, 7), "10"),  # chunks of 7 split blocks of 4
    ("uint2", ["--block-size", "5", "--axis", "0", "--symmetric"], "block", 0, 5, (3, 51), "1KiB"),
    ("float8e4m3fn", ["--granularity", "axis"], "axis", 0, 0, (16, 16), "50"),
    ("float4e2m1", ["--block-size", "16"], "block", 1, 16, (37, 5), "20"),
]
IDS = [f"{c[0]}-{c[2]}" for c in CASES]


def _expected(x, qtype_name, kind, axis, block_size, symmetric):
    """Whole-array calibration and `qlinear.quantize_linear` on the whole array: the in-memory result."""
    qtype = get(qtype_name)
    gran = Granularity(kind, x.shape, axis, block_size) if kind != "tensor" else Granularity("tensor", x.shape)
    scale, zero_point = calibrate.parameters(*calibrate.ranges(x, gran), qtype, symmetric)
    attrs = {} if kind == "tensor" else {"axis": axis, "block_size": block_size}
    x = x.astype(np.float32)  # calibrated on the source values, quantized from float32 (as the command does)
    if qtype.is_integer:
        q = qlinear.quantize_linear(x, scale, zero_point, **attrs)
        restored = qlinear.dequantize_linear(q, scale, zero_point, **attrs)
    else:
        q = qlinear.quantize_linear(x, scale, output_dtype=qtype_name, **attrs)
        restored = qlinear.dequantize_linear(q, scale, **attrs)
    return q, scale, zero_point, restored


def _symmetric(qtype: str, flags) -> bool:
    """The command's choice: --symmetric/--asymmetric, else symmetric for 8- and 16-bit types."""
    if "--symmetric" in flags or "--asymmetric" in flags:
        return "--symmetric" in flags
    return get(qtype).bits >= 8


def _as_codes(stored, q):
    """A stored one-element-per-byte array as the quantized type (int values or bit patterns)."""
    if np.dtype(q.dtype).kind in "iu" or q.dtype in (ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2, ml_dtypes.uint2):
        return stored.astype(q.dtype)
    return stored.view(q.dtype)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_zarr_round_trip_equals_whole_array(tmp_path, case):
    qtype, flags, kind, axis, block_size, storage_chunks, chunks = case
    source = tmp_path / "m.zarr"
    zarr.create_array(source, shape=MATRIX.shape, chunks=storage_chunks, dtype="float32")[...] = MATRIX
    out = tmp_path / "m-q.zarr"
    result = in_process("quantize", source, "--dtype", qtype, *flags, "--chunks", chunks, "-o", out, "--json")
    assert result.returncode == 0, result.stderr
    q, scale, zero_point, restored = _expected(MATRIX, qtype, kind, axis, block_size, _symmetric(qtype, flags))

    group = zarr.open_group(out, mode="r")
    meta = group.attrs["qlinear"]
    info = meta["tensors"]["m"]
    assert (info["dtype"], info["granularity"], info["packed"], meta["root_array"]) == (qtype, kind, False, True)
    stored = group["m"][...]
    assert stored.dtype.itemsize == q.dtype.itemsize and stored.shape == MATRIX.shape  # one element per byte
    assert np.array_equal(_as_codes(stored, q).view(np.uint8 if q.dtype.itemsize == 1 else np.uint16),
                          q.view(np.uint8 if q.dtype.itemsize == 1 else np.uint16))
    assert np.array_equal(group["m.scale"][...], scale)
    assert np.array_equal(_as_codes(group["m.zero_point"][...], zero_point).astype(np.float64),
                          zero_point.astype(np.float64))
    report = json.loads(result.stdout)
    row = report["tensors"][0]
    error = MATRIX.astype(np.float64) - restored.astype(np.float64)
    assert row["max_abs_error"] == pytest.approx(float(np.max(np.abs(error))), rel=1e-12)

    back = tmp_path / "m-restored.zarr"
    result = in_process("dequantize", out, "-o", back)
    assert result.returncode == 0, result.stderr
    restored_store = zarr.open(back, mode="r")
    assert isinstance(restored_store, zarr.Array)  # a one-array store comes back as one array
    assert restored_store.dtype == np.float32
    assert np.array_equal(restored_store[...], restored)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m-q.zarr", "m-restored.zarr", "m.zarr"]


def test_zarr_group_nested_and_copied_arrays(tmp_path):
    source = tmp_path / "g.zarr"
    group = zarr.open_group(source, mode="w")
    group.attrs["note"] = "kept"
    group.create_array("w", data=MATRIX, chunks=(8, 16))
    group.create_array("ids", data=np.arange(10, dtype=np.int64))
    nested = RNG.standard_normal((6, 9))
    group.create_array("bias", data=MATRIX[0])  # 1-D: kept by default
    group.create_array("layer/b", data=nested, chunks=(4, 4))
    out = tmp_path / "g-q.zarr"
    group.create_array("s", data=np.array(2.5, np.float32))
    result = in_process("quantize", source, "--dtype", "int8", "--granularity", "axis", "--chunks", "24", "--include", "*",
                 "-o", out)
    assert result.returncode == 2 and "tensor 's': a scalar (shape ()) cannot take per-axis" in result.stderr  # as for files
    result = in_process("quantize", source, "--dtype", "int8", "--chunks", "24", "-o", out)
    assert result.returncode == 0, result.stderr
    written = zarr.open_group(out, mode="r")
    assert written.attrs["note"] == "kept" and written.attrs["qlinear"]["copied"] == ["bias", "ids", "s"]
    for name, x in (("w", MATRIX), ("layer/b", nested)):
        q, scale, *_ = _expected(x, "int8", "axis", 0, 0, True)  # the defaults: per channel (axis 0), symmetric
        assert np.array_equal(written[name][...], q)
        assert np.array_equal(written[name + ".scale"][...], scale)
    back = tmp_path / "g-r.zarr"
    assert in_process("dequantize", out, "-o", back).returncode == 0
    restored = zarr.open_group(back, mode="r")
    assert sorted(restored.array_keys()) == ["bias", "ids", "s", "w"] and restored.attrs["note"] == "kept"
    assert restored["s"][...] == np.float32(2.5)
    assert restored["layer/b"].dtype == np.float64  # back to the source type
    assert np.array_equal(restored["ids"][...], np.arange(10))


@pytest.mark.parametrize("suffix, qtype, flags, chunks", [
    (".npy", "int4", ["--granularity", "axis"], "100"),  # 51-element rows: packed bytes straddle chunks
    (".npy", "uint2", ["--block-size", "3", "--axis", "0"], "2"),  # bands rounded up to whole blocks
    (".safetensors", "float6e2m3", ["--block-size", "8"], "1KiB"),
    (".safetensors", "int8", ["--symmetric"], "64B"),
])
def test_tensor_files_with_chunks_equal_the_in_memory_path(tmp_path, suffix, qtype, flags, chunks):
    source = tmp_path / f"m{suffix}"
    if suffix == ".npy":
        np.save(source, MATRIX)
    else:
        from safetensors.numpy import save_file

        save_file({"m": MATRIX, "v": MATRIX[0].astype(np.float64)}, str(source))
    out_suffix = ".npz" if suffix == ".npy" else suffix
    plain, streamed = tmp_path / f"plain{out_suffix}", tmp_path / f"dask{out_suffix}"
    assert in_process("quantize", source, "--dtype", qtype, *flags, "-o", plain).returncode == 0
    result = in_process("quantize", source, "--dtype", qtype, *flags, "--chunks", chunks, "-o", streamed)
    assert result.returncode == 0, result.stderr
    plain_arrays, plain_meta = read_tensor_file(plain)
    dask_arrays, dask_meta = read_tensor_file(streamed)
    assert plain_meta == dask_meta and plain_arrays.keys() == dask_arrays.keys()
    for name in plain_arrays:
        assert plain_arrays[name].dtype == dask_arrays[name].dtype
        assert np.array_equal(plain_arrays[name], dask_arrays[name]), name
    if qtype == "int4":  # and the in-memory path is the whole-array quantize_linear, packed
        q, *_ = _expected(MATRIX, qtype, "axis", 0, 0, _symmetric(qtype, flags))
        assert np.array_equal(dask_arrays["m"], qlinear.pack(q))


def test_tensors_above_the_threshold_go_through_dask(tmp_path, monkeypatch, capsys):
    from qlinear.io import streaming

    calls = []
    original = streaming.calibrate_dask
    monkeypatch.setattr(streaming, "AUTO_BYTES", 1000)
    monkeypatch.setattr(streaming, "calibrate_dask", lambda *a, **k: calls.append(a[0]) or original(*a, **k))
    source = tmp_path / "w.npz"
    np.savez(source, big=MATRIX, small=MATRIX[:2])
    assert main(["quantize", str(source), "--dtype", "int8", "-o", str(tmp_path / "q.npz")]) == 0
    assert calls == [f"{source}: tensor 'big'"]


def _one_line_failure(result, match):
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert match in lines[0], lines[0]


@pytest.mark.parametrize("value, match", [
    ("12xB", "--chunks '12xB': give an element count"),
    ("0", "--chunks '0': must be positive"),
    ("-5", "--chunks '-5': give an element count"),
    ("1.5GB", "--chunks '1.5GB': give an element count"),
])
def test_bad_chunks_value(tmp_path, value, match):
    np.save(tmp_path / "m.npy", MATRIX)
    result = in_process("quantize", tmp_path / "m.npy", "--dtype", "int8", f"--chunks={value}", "-o", tmp_path / "q.npz")
    _one_line_failure(result, match)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.npy"]


def test_store_errors(tmp_path):
    source = tmp_path / "m.zarr"
    zarr.create_array(source, shape=(4, 4), chunks=(2, 2), dtype="float32")[...] = np.nan
    _one_line_failure(run("quantize", source, "--dtype", "int8", "-o", tmp_path / "q.npz"),
                      "the output of a .zarr input is a .zarr store")
    _one_line_failure(run("quantize", source, "--dtype", "int8", "-o", tmp_path / "q.zarr"),
                      "holds NaN or infinite values")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.zarr"]  # no partial store left behind
    _one_line_failure(run("quantize", EXAMPLE, "--dtype", "int8", "--chunks", "1MiB", "-o", tmp_path / "q.onnx"),
                      "--chunks applies to tensor files and .zarr stores, not ONNX models")
    _one_line_failure(run("dequantize", source, "-o", tmp_path / "r.zarr"), "has no qlinear metadata")
    (tmp_path / "junk.zarr").mkdir()
    _one_line_failure(run("quantize", tmp_path / "junk.zarr", "--dtype", "int8", "-o", tmp_path / "q.zarr"),
                      "not a zarr store")


def test_existing_output_store_needs_force(tmp_path):
    source = tmp_path / "m.zarr"
    zarr.create_array(source, shape=MATRIX.shape, chunks=(10, 10), dtype="float32")[...] = MATRIX
    out = tmp_path / "q.zarr"
    out.mkdir()
    (out / "old").write_text("x")
    _one_line_failure(in_process("quantize", source, "--dtype", "int8", "-o", out), "already exists; pass --force")
    assert in_process("quantize", source, "--dtype", "int8", "-o", out, "--force").returncode == 0
    assert not (out / "old").exists() and "qlinear" in zarr.open_group(out, mode="r").attrs
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.zarr", "q.zarr"]
