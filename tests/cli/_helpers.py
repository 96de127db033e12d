"""Running the qlinear command and checking its files with independent readers and onnx's reference
implementation (the oracle for the quantized values and the dequantized tensors)."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "digits_mlp.onnx"

TENSORPROTO = {  # onnx.TensorProto numbers, spelled out so that this table is not qlinear's own
    "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "uint4": 21, "int4": 22, "uint2": 25, "int2": 26,
    "float8e4m3fn": 17, "float8e4m3fnuz": 18, "float8e5m2": 19, "float8e5m2fnuz": 20, "float4e2m1": 23,
    "float6e2m3": 27, "float6e3m2": 28,
}
ML_DTYPES = {
    "uint8": np.uint8, "int8": np.int8, "uint16": np.uint16, "int16": np.int16, "uint4": ml_dtypes.uint4,
    "int4": ml_dtypes.int4, "uint2": ml_dtypes.uint2, "int2": ml_dtypes.int2,
    "float8e4m3fn": ml_dtypes.float8_e4m3fn, "float8e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "float8e5m2": ml_dtypes.float8_e5m2, "float8e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
    "float4e2m1": ml_dtypes.float4_e2m1fn, "float6e2m3": ml_dtypes.float6_e2m3fn, "float6e3m2": ml_dtypes.float6_e3m2fn,
}
BITS = {"uint4": 4, "int4": 4, "uint2": 2, "int2": 2, "float4e2m1": 4, "float6e2m3": 6, "float6e3m2": 6}
QUANTIZED_TYPES = list(TENSORPROTO)


def run(*args, cwd=None, timeout=600) -> subprocess.CompletedProcess:
    """The installed command, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "qlinear", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd or REPO, timeout=timeout)


def in_process(*args) -> subprocess.CompletedProcess:
    """`qlinear.cli.main` in this process, as `run` gives it (exit status, stdout, stderr): the same code
    without paying for a Python start and the imports each time."""
    import contextlib
    import io

    from qlinear.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as exit_:  # argparse's usage errors
            code = exit_.code if isinstance(exit_.code, int) else 2
    return subprocess.CompletedProcess(["qlinear", *map(str, args)], code, out.getvalue(), err.getvalue())


def read_tensor_file(path: Path) -> tuple[dict[str, np.ndarray], dict]:
    """All arrays and the qlinear metadata, read with numpy's and safetensors' own readers."""
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        meta = json.loads(str(arrays.pop("__qlinear__"))) if "__qlinear__" in arrays else {}
        return arrays, meta
    if path.suffix == ".npy":
        return {path.stem: np.load(path, allow_pickle=False)}, {}
    from safetensors import safe_open

    arrays = {}
    with safe_open(str(path), framework="np") as f:
        metadata = f.metadata() or {}
        for key in f.keys():
            arrays[key] = f.get_tensor(key)
    return arrays, json.loads(metadata["qlinear"]) if "qlinear" in metadata else {}


def stored_to_onnx_array(stored: np.ndarray, qtype: str, shape) -> np.ndarray:
    """onnx's own reading of the stored bytes (the packed raw_data layout for 2/4/6-bit types)."""
    from onnx import helper, numpy_helper

    tensor = helper.make_tensor("t", TENSORPROTO[qtype], list(shape), np.ascontiguousarray(stored).tobytes(), raw=True)
    return numpy_helper.to_array(tensor)


def onnx_node(op: str, opset: int, inputs: list[np.ndarray], elem_types: list[int], out_type: int, **attrs) -> np.ndarray:
    """Run one QuantizeLinear/DequantizeLinear node on onnx.reference.ReferenceEvaluator, every input
    an initializer given as raw bytes (so ml_dtypes arrays need no conversion)."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    names = ["x", "scale", "zero_point"][: len(inputs)]
    initializers = []
    for name, array, elem in zip(names, inputs, elem_types):
        array = np.asarray(array)
        raw = array.tobytes() if elem not in (21, 22, 23, 25, 26, 27, 28) else _pack(array, elem)
        initializers.append(helper.make_tensor(name, elem, list(array.shape), raw, raw=True))
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", out_type, None)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return ReferenceEvaluator(model).run(None, {})[0]


def _pack(array: np.ndarray, elem: int) -> bytes:
    bits = {21: 4, 22: 4, 23: 4, 25: 2, 26: 2, 27: 6, 28: 6}[elem]
    codes = np.ascontiguousarray(array).reshape(-1).view(np.uint8) & ((1 << bits) - 1)
    stream = np.unpackbits(codes[:, None], axis=1, bitorder="little")[:, :bits].reshape(-1)
    return np.packbits(stream, bitorder="little").tobytes()


def zip_members(path: Path) -> list[str]:
    with zipfile.ZipFile(path) as z:
        return z.namelist()
