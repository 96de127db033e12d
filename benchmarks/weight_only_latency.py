"""Weights-only low-bit OCR models in onnxruntime (BENCHMARKS.md, "Weights only in onnxruntime"): the float model and
`qlinear quantize --dtype int4 --rounding rtn` (the rounding changes no latency), each with onnxruntime's default
session and with ``session.disable_quant_qdq=1`` (which lets its constant folding fold the DequantizeLinear of the
weights at load); 1 and 2 threads, median of --runs runs in turns after 3 warm-up runs; the inputs are 8 recogniser
lines, 8 classifier crops or one detector page. Also how many DequantizeLinear nodes onnxruntime's optimized graph
keeps, against what the report counts (`dequantized_per_run`).

    uv run python benchmarks/weight_only_latency.py [--models ocr_cls ocr_rec ocr_det] [--runs 15]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402

from corpus import ocr  # noqa: E402
from corpus.models import path  # noqa: E402
from qlinear.bench import cpu_model  # noqa: E402
from qlinear.cli import main as qlinear_main  # noqa: E402

OPTION = "session.disable_quant_qdq"


def inputs(name: str):
    if name == "ocr_rec":
        return ocr.make_rec_data(8, seed=3).images
    if name == "ocr_cls":
        return ocr.make_cls_data(8, seed=3).images
    return ocr.make_det_pages(1, seed=3)[0].x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["ocr_cls", "ocr_rec", "ocr_det"])
    parser.add_argument("--dtype", default="int4")
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    print(f"CPU: {cpu_model()}; onnxruntime {ort.__version__}; --dtype {args.dtype}, weights only\n")
    print("| model | threads | float, ms | quantized, ms | x float | float with the option | quantized with the option "
          "| x float (both with it) | DequantizeLinear kept (report) |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="qlinear-weight-only-") as temporary:
        folder = Path(temporary)
        for name in args.models:
            source = path(name)
            out = folder / f"{name}.onnx"
            buffer = io.StringIO()
            with contextlib.redirect_stdout(buffer):
                assert qlinear_main(["quantize", str(source), "--dtype", args.dtype, "--rounding", "rtn", "-o",
                                     str(out), "--force", "--no-eval", "--json"]) == 0
            counted = json.loads(buffer.getvalue())["model"]["dequantized_per_run"]
            x = inputs(name)
            for threads in (1, 2):
                sessions, kept = {}, None
                for option in (False, True):
                    for tag, model in (("float", source), ("quantized", out)):
                        options = ort.SessionOptions()
                        options.intra_op_num_threads = threads
                        optimized = folder / "optimized.onnx"
                        options.optimized_model_filepath = str(optimized)
                        if option:
                            options.add_session_config_entry(OPTION, "1")
                        sessions[(tag, option)] = ort.InferenceSession(str(model), options,
                                                                       providers=["CPUExecutionProvider"])
                        if tag == "quantized" and not option:
                            kept = [n.op_type for n in onnx.load(str(optimized)).graph.node].count("DequantizeLinear")
                feed = {sessions[("float", False)].get_inputs()[0].name: x}
                for s in sessions.values():
                    for _ in range(3):
                        s.run(None, feed)
                times = {key: [] for key in sessions}
                for _ in range(args.runs):
                    for key, s in sessions.items():
                        start = time.perf_counter()
                        s.run(None, feed)
                        times[key].append(1000 * (time.perf_counter() - start))
                ms = {key: statistics.median(t) for key, t in times.items()}
                print(f"| {name} | {threads} | {ms[('float', False)]:.2f} | {ms[('quantized', False)]:.2f} | "
                      f"{ms[('quantized', False)] / ms[('float', False)]:.2f} | {ms[('float', True)]:.2f} | "
                      f"{ms[('quantized', True)]:.2f} | {ms[('quantized', True)] / ms[('float', True)]:.2f} | "
                      f"{kept} ({counted}) |", flush=True)


if __name__ == "__main__":
    main()
