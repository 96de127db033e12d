"""The real-model corpus (tests/corpus) through `qlinear quantize` with its defaults, for BENCHMARKS.md:
per model and type, the weight bytes found and quantized, the file sizes, the time, and the task figure
of the float and the quantized model on the corpus' labelled data; then, for int4, which layers cost the
most (each layer quantized alone, the others float, on a subset of the data).

    uv run python benchmarks/corpus.py                      # the table
    uv run python benchmarks/corpus.py --layers int4        # and the per-layer costs
    uv run python benchmarks/corpus.py --json corpus.json
    uv run python benchmarks/corpus.py --dtypes mxfp4 nvfp4 --models ocr_rec   # the microscaling formats
    uv run python benchmarks/corpus.py --dtypes nvfp4 --scale-rule modelopt     # NVFP4 as Model Optimizer rounds

onnxruntime 1.32 cannot run the microscaling formats (no CPU DequantizeLinear for float4 or e8m0 scales),
so for those the DequantizeLinear nodes of the written model are evaluated once with qlinear's
DequantizeLinear (the values onnx's reference computes: tests/cli/test_mx_command.py) and the model runs in
onnxruntime on those float weights.

Needs the dev dependency group (the corpus wheels, onnxruntime, Pillow) and espeak-ng for the VAD models.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from corpus import measure_float, ocr  # noqa: E402
from corpus.models import NAMES, ort_runner, path  # noqa: E402

from qlinear.cli import main as qlinear_main  # noqa: E402

DTYPES = ("int8", "int4", "float8e4m3fn")
MX_DTYPES = ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4", "mxint8", "nvfp4")
SUBSETS = {"ocr_rec": 50, "ocr_det": 3}  # items of the data used for the per-layer scan


def quantize(name: str, dtype: str, output: Path, *extra: str) -> tuple[dict, float]:
    stdout = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(stdout):
        code = qlinear_main(["quantize", str(path(name)), "--dtype", dtype, "-o", str(output), "--force", "--json",
                             "--no-eval", *extra])
    seconds = time.perf_counter() - started
    if code:
        raise SystemExit(f"qlinear quantize {name} {dtype} failed")
    return json.loads(stdout.getvalue()), seconds


def fold_dequantize(model_file: Path) -> bytes:
    """The model with every DequantizeLinear of constant inputs replaced by its output, computed by qlinear
    (in every graph, If branches included): what onnxruntime needs to run a microscaling model."""
    import onnx

    from qlinear.io.formats import onnx_dequantized

    return onnx_dequantized.folded(onnx.load(str(model_file))).SerializeToString()


def subset(name: str, data):
    count = SUBSETS.get(name)
    if count is None:
        return data
    if name == "ocr_rec":
        return ocr.RecData(data.images[:count], data.labels[:count], data.raw[:count])
    return data[:count]


def layer_costs(name: str, dtype: str, rows: list[dict], folder: Path) -> list[dict]:
    """Each quantized tensor of the default run quantized alone: the task figure's drop on a subset."""
    data = subset(name, measure_float.data(name))
    float_out = measure_float.outputs(name, ort_runner(path(name)), data)
    costs = []
    for row in rows:
        if not row["quantized"]:
            continue
        output = folder / f"{name}.{dtype}.layer.onnx"
        quantize(name, dtype, output, "--include", row["name"])
        figures = measure_float.against_float(name, float_out, measure_float.outputs(name, ort_runner(output), data), data)
        costs.append({"tensor": row["name"], "shape": row["shape"], "sqnr_db": row["sqnr_db"],
                      "drop": figures["float"] - figures["quantized"], "vs float": figures["vs float"]})
    return sorted(costs, key=lambda c: (c["vs float"], -c["drop"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(NAMES), choices=NAMES)
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES + MX_DTYPES)
    parser.add_argument("--scale-rule", choices=("floor", "ceil", "even", "modelopt"),
                        help="floor, ceil, even: for the MX formats; modelopt: for nvfp4")
    parser.add_argument("--layers", nargs="*", default=[], choices=DTYPES, help="per-layer costs for these types")
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        for name in args.models:
            data = measure_float.data(name)
            float_out = measure_float.float_outputs(name)
            for dtype in args.dtypes:
                output = folder / f"{name}.{dtype}.onnx"
                mx = dtype in MX_DTYPES
                takes = (args.scale_rule == "modelopt") == (dtype == "nvfp4")  # each rule to its formats
                extra = ("--scale-rule", args.scale_rule) if mx and args.scale_rule and takes else ()
                report, seconds = quantize(name, dtype, output, *extra)
                started = time.perf_counter()
                runner = ort_runner(fold_dequantize(output) if mx else output)
                quantized_out = measure_float.outputs(name, runner, data)
                run_seconds = time.perf_counter() - started
                figures = measure_float.against_float(name, float_out, quantized_out, data)
                weights = report["totals"]["weights"]
                entry = {"model": name, "dtype": dtype, "quantize_s": seconds, "run_s": run_seconds,
                         "weights_bytes": weights["bytes"], "quantized_bytes": weights["quantized_bytes"],
                         "places": list(weights["places"]), "file_before": report["files"]["before"],
                         "file_after": report["files"]["after"], "sqnr_db": report["totals"].get("sqnr_db"),
                         "opset": f"{report['model']['opset_before']} -> {report['model']['opset_after']}",
                         **figures}
                if dtype in args.layers:
                    entry["layers"] = layer_costs(name, dtype, report["tensors"], folder)[: args.top]
                results.append(entry)
                print(f"{name:9} {dtype:13} {100 * weights['share']:5.1f}% of {weights['bytes'] / 1e6:6.2f} MB "
                      f"({', '.join(weights['places'])}); file {entry['file_before'] / 1e6:.2f} -> "
                      f"{entry['file_after'] / 1e6:.2f} MB; opset {entry['opset']}; SQNR {entry['sqnr_db']:.1f} dB; "
                      f"{figures['figure']}: {100 * figures['float']:.2f}% -> {100 * figures['quantized']:.2f}%; "
                      f"{figures['vs float name']} {100 * figures['vs float']:.2f}%; quantize {seconds:.2f} s",
                      flush=True)
                for cost in entry.get("layers", []):
                    print(f"    {cost['tensor']:40} {'x'.join(map(str, cost['shape'])):14} SQNR {cost['sqnr_db']:5.1f} dB  "
                          f"alone: drop {100 * cost['drop']:+.2f} points, {figures['vs float name']} "
                          f"{100 * cost['vs float']:.2f}%", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
