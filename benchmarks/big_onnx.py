"""A > 2 GB ONNX model with external data, quantized by `qlinear quantize` under /usr/bin/time -v: the peak
resident memory against the largest tensor (README and BENCHMARKS.md, "Large ONNX models").

    uv run python benchmarks/big_onnx.py /work/bigdata/big_onnx            # makes the model, then measures

The model is a chain of MatMul + Add layers whose weights are written straight into one external data file
(one weight at a time: the model is never whole in memory), at opset 21 so that no opset conversion runs.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def make(folder: Path, layers: int, size: int) -> Path:
    import onnx
    from onnx import helper

    folder.mkdir(parents=True, exist_ok=True)
    model_path, data_path = folder / "big.onnx", folder / "big.onnx.data"
    rng = np.random.default_rng(0)
    nodes, initializers, offset = [], [], 0
    with open(data_path, "wb") as data:
        for i in range(layers):
            for name, shape in ((f"w{i}", (size, size)), (f"b{i}", (size,))):
                tensor = onnx.TensorProto(name=name, data_type=onnx.TensorProto.FLOAT, dims=shape)
                length = int(np.prod(shape)) * 4
                for start in range(0, shape[0], 1024):  # a band of rows at a time
                    rows = min(1024, shape[0] - start)
                    band = rng.standard_normal((rows,) + shape[1:], dtype=np.float32) * np.float32(size ** -0.5)
                    data.write(band.tobytes())
                for key, value in (("location", data_path.name), ("offset", str(offset)), ("length", str(length))):
                    entry = tensor.external_data.add()
                    entry.key, entry.value = key, value
                tensor.data_location = onnx.TensorProto.EXTERNAL
                initializers.append(tensor)
                offset += length
            x = "x" if i == 0 else f"a{i - 1}"
            nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]), helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"])]
    graph = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [None, size])],
                              [helper.make_tensor_value_info(f"a{layers - 1}", onnx.TensorProto.FLOAT, [None, size])],
                              initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model_path.write_bytes(model.SerializeToString())
    return model_path


def measure(model: Path, dtype: str, extra: list[str]) -> dict:
    output = model.with_name(f"big-{dtype}.onnx")
    command = ["/usr/bin/time", "-v", sys.executable, "-m", "qlinear", "quantize", str(model), "--dtype", dtype,
               "-o", str(output), "--force", "--no-eval", *extra]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if result.returncode:
        raise SystemExit(result.stderr)
    peak_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", result.stderr).group(1))
    summary = [line for line in result.stdout.splitlines() if line.startswith(("total:", "file size:", "model:"))]
    return {"dtype": dtype, "seconds": seconds, "peak_mb": peak_kb / 1024, "summary": summary,
            "output_bytes": output.stat().st_size + output.with_name(output.name + ".data").stat().st_size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--layers", type=int, default=9)
    parser.add_argument("--size", type=int, default=8192)
    args = parser.parse_args()
    model = args.folder / "big.onnx"
    if not model.exists():
        started = time.perf_counter()
        make(args.folder, args.layers, args.size)
        print(f"made {model} in {time.perf_counter() - started:.0f} s")
    data_bytes = (args.folder / "big.onnx.data").stat().st_size
    largest = args.size * args.size * 4
    print(f"model: {args.layers} MatMul weights of {args.size}x{args.size} float32, {data_bytes / 1e9:.2f} GB of "
          f"external data; largest tensor {largest / 1e6:.0f} MB")
    for dtype, extra in (("int8", []), ("int4", [])):
        figures = measure(model, dtype, extra)
        print(f"{dtype}: {figures['seconds']:.0f} s, peak RSS {figures['peak_mb']:.0f} MiB, output "
              f"{figures['output_bytes'] / 1e9:.2f} GB")
        for line in figures["summary"]:
            print("   ", line)


if __name__ == "__main__":
    main()
