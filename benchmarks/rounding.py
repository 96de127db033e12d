"""Low-bit rounding on the corpus (`qlinear quantize --rounding`, issue 31), for BENCHMARKS.md: per model, type
and method, the task figure against float on the corpus' labelled data, the time and the peak memory of the
command (each run its own process, under /usr/bin/time -v), with the weights only (--activations float).

The calibration samples (seed 7, `static.calibration_data`) are disjoint from the labelled data the figures
are measured on (the corpus' own seeds); no default of qlinear was chosen on the labelled data.

    uv run python benchmarks/rounding.py                                   # int4, all methods, 3 OCR models
    uv run python benchmarks/rounding.py --models ocr_rec --dtypes mxfp4 nvfp4 --methods rtn gptq
    uv run python benchmarks/rounding.py --samples 100 --json rounding.json

onnxruntime 1.32 cannot run the MX formats: their DequantizeLinear nodes are evaluated once by qlinear
(`corpus.fold_dequantize`) and the model runs on those float weights.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))  # first: its corpus package, not benchmarks/corpus.py

from corpus.models import path  # noqa: E402
from qlinear.bench import cpu_model  # noqa: E402
from static import calibration_data, evaluate, measured  # noqa: E402


def fold_dequantize(model_file: Path) -> bytes:
    """benchmarks/corpus.py's (whose module name the tests' corpus package shadows here)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("corpus_benchmark", ROOT / "benchmarks" / "corpus.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.fold_dequantize(model_file)

MX = ("mxfp4", "nvfp4", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp8_e4m3", "mxint8")
FIGURE = {"ocr_det": "map_iou_vs_float", "ocr_rec": "figure", "ocr_cls": "figure"}


def run(name: str, dtype: str, method: str, data: Path, folder: Path, timeout: float, static: bool = False) -> dict:
    output = folder / f"{name}.{dtype}.{method}.onnx"
    command = [sys.executable, "-m", "qlinear", "quantize", str(path(name)), "--dtype", dtype, "-o", str(output),
               "--force", "--json", "--no-eval", "--rounding", method]
    if static:  # the activations quantized too (uint8, the defaults), the Hessians from the same run
        command += ["--calibrate", str(data), "--no-latency", "--report-samples", "0"]
    elif method not in ("rtn", "hqq"):
        command += ["--calibrate", str(data), "--activations", "float"]
    result = measured(command, folder / f"{name}.{dtype}.{method}.log", 8 << 30, timeout)
    row = {"model": name, "dtype": dtype, "method": method + (" + uint8 activations" if static else ""),
           "wall_s": result.get("wall_s"),
           "peak_mib": result.get("peak_bytes", 0) / 2**20, "exit": result["exit"]}
    if result["exit"] != 0:
        row["error"] = Path(result["stderr"]).read_text(errors="replace").strip().splitlines()[-1:]
        return row
    report = json.loads(Path(result["stdout"]).read_text())
    gains = [r["output_sqnr_db"][method] - r["output_sqnr_db"]["rtn"] for r in report["tensors"]
             if r.get("output_sqnr_db") and method in r["output_sqnr_db"]]
    row["output_db_gain"] = sum(gains) / len(gains) if gains else None
    row["fallbacks"] = sum(1 for r in report["tensors"] if r.get("rounding") == "rtn" and method != "rtn")
    if dtype in MX:
        folded = output.with_suffix(".folded.onnx")
        folded.write_bytes(fold_dequantize(output))
        output = folded
    figures = evaluate(name, output)
    row.update(float=figures.get("float"), figure=figures.get("figure"), figure_name=figures.get("figure_name"),
               map_iou_vs_float=figures.get("map_iou_vs_float"), texts_equal_float=figures.get("texts_equal_float"))
    row["score"] = row.get(FIGURE[name])
    return row


def table(rows: list[dict]) -> str:
    lines = ["| model | type | method | figure | float | quantized | output SQNR gain (dB, mean) | time | peak |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["exit"] != 0:
            lines.append(f"| {r['model']} | {r['dtype']} | {r['method']} | failed: {' '.join(r.get('error', []))} |||||")
            continue
        name = "map IoU vs float" if r["model"] == "ocr_det" else r["figure_name"]
        base = 1.0 if r["model"] == "ocr_det" else r["float"]
        gain = f"{r['output_db_gain']:+.1f}" if r.get("output_db_gain") is not None else ""
        lines.append(f"| {r['model']} | {r['dtype']} | {r['method']} | {name} | {100 * base:.2f}% | "
                     f"{100 * r['score']:.2f}% | {gain} | {r['wall_s']:.0f} s | {r['peak_mib']:.0f} MiB |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["ocr_cls", "ocr_rec", "ocr_det"])
    parser.add_argument("--dtypes", nargs="+", default=["int4"])
    parser.add_argument("--methods", nargs="+", default=["rtn", "hqq", "gptq"])
    parser.add_argument("--samples", type=int, default=100, help="calibration samples (detector: pages)")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--static", action="store_true",
                        help="quantize the activations too (uint8, the static defaults) instead of --activations float")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="qlinear-rounding-") as temporary:
        folder = Path(temporary)
        for name in args.models:
            data = calibration_data(folder, name, args.samples)
            for dtype in args.dtypes:
                for method in args.methods:
                    row = run(name, dtype, method, data, folder, args.timeout, args.static)
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    what = "activations uint8 (static defaults)" if args.static else "weights only"
    print(f"\nCPU: {cpu_model()}; {args.samples} calibration samples (seed 7), {what}\n")
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu_model(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
