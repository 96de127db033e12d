"""What each rule of `--target onnxruntime`'s placement buys: the PP-OCR corpus models quantized to static int8
with the rule switched off one at a time, their latency in onnxruntime (default graph optimizations, 1 and 2
threads, each model timed in turns with the float one, median) and their task figure against float (ONNX
semantics, onnxruntime with basic optimizations), beside `--target qdq-portable` (a pair around every operator
a QDQ runtime may fuse: what qlinear wrote before) and the default.

    uv run python benchmarks/placement_rules.py                 # all three models, every variant
    uv run python benchmarks/placement_rules.py --models ocr_det --variants default no-operands

The rules are switched off by patching `qlinear.io.placement.onnxruntime` in this process (nothing in qlinear
exposes them: they are what the target is). Calibration: 64 lines (seed 7) for the classifier and the
recogniser, 3 pages for the detector, as benchmarks/static.py makes them.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from corpus import measure_float, ocr  # noqa: E402
from corpus.models import ort_runner, path  # noqa: E402

MODELS = ("ocr_cls", "ocr_rec", "ocr_det")
COUNTS = {"ocr_cls": 64, "ocr_rec": 64, "ocr_det": 3}
VARIANTS = ("qdq-portable", "default", "no-operands", "no-scale-folds", "no-onnxruntime-rewrites", "no-relu-clip-fold",
            "no-moves", "no-float-input-convs", "no-float-depthwise-after-input", "no-dense-padding")


def calibration(folder: Path, name: str) -> Path:
    if name == "ocr_det":
        target = folder / "det_pages"
        if not target.exists():
            target.mkdir()
            for index, page in enumerate(ocr.make_det_pages(COUNTS[name], seed=7)):
                np.savez(target / f"page{index:03}.npz", x=page.x)
        return target
    target = folder / f"{name}.npz"
    if not target.exists():
        maker = ocr.make_rec_data if name == "ocr_rec" else ocr.make_cls_data
        np.savez(target, x=maker(COUNTS[name], seed=7).images)
    return target


@contextlib.contextmanager
def variant(name: str):
    """Switch one rule off for the duration."""
    import qlinear.io.placement.onnxruntime as placement
    from qlinear.io.formats import onnx_channel_padding, onnx_model

    switches = ("SCALES", "FOLDED", "MOVES", "FEW_CHANNELS", "DEPTHWISE_AFTER_INPUT")
    saved = {key: getattr(placement, key) for key in switches}
    dense = onnx_channel_padding.DENSE_MINIMUM, onnx_channel_padding.DENSE_MULTIPLE
    kind, fold = placement._Graph._kind, onnx_model.OnnxModel.fold_for_static
    try:
        if name == "no-operands":
            def _kind(self, node):
                found = kind(self, node)
                return None if found == "binary" and self.operands.get(id(node)) else found
            placement._Graph._kind = _kind
        elif name == "no-scale-folds":
            placement.SCALES = frozenset()
        elif name == "no-onnxruntime-rewrites":
            onnx_model.OnnxModel.fold_for_static = lambda self, onnxruntime=False: fold(self, False)
        elif name == "no-relu-clip-fold":
            placement.FOLDED = frozenset()
        elif name == "no-moves":
            placement.MOVES = frozenset()
        elif name == "no-float-input-convs":
            placement.FEW_CHANNELS = 0
        elif name == "no-float-depthwise-after-input":
            placement.DEPTHWISE_AFTER_INPUT = False
        elif name == "no-dense-padding":  # only depthwise convolutions get zero channels
            onnx_channel_padding.DENSE_MINIMUM = onnx_channel_padding.DENSE_MULTIPLE = 1
        yield
    finally:
        for key, value in saved.items():
            setattr(placement, key, value)
        placement._Graph._kind, onnx_model.OnnxModel.fold_for_static = kind, fold
        onnx_channel_padding.DENSE_MINIMUM, onnx_channel_padding.DENSE_MULTIPLE = dense


def quantize(name: str, data: Path, output: Path, variant_name: str) -> dict:
    from qlinear.cli import main

    target = "qdq-portable" if variant_name == "qdq-portable" else "onnxruntime"
    stdout = io.StringIO()
    with variant(variant_name), contextlib.redirect_stdout(stdout):
        code = main(["quantize", str(path(name)), "--dtype", "int8", "--calibrate", str(data), "-o", str(output),
                     "--force", "--target", target, "--no-eval", "--report-samples", "0", "--no-latency", "--json"])
    if code != 0:
        raise RuntimeError(f"{name} {variant_name}: exit {code}")
    return json.loads(stdout.getvalue())


def feeds(name: str) -> dict:
    data = measure_float.data(name)
    return {"x": data[0].x} if name == "ocr_det" else {"x": np.ascontiguousarray(data.images[:8])}


def latencies(models: list[Path], inputs: dict, threads: int, repeats: int) -> list[float]:
    """Median ms of each model, timed in turns as benchmarks/static.py times them."""
    from static import latencies as timed

    return [1e3 * result["median_s"] for result in timed(models, inputs, threads, repeats)]


def optimized_counts(model: Path) -> dict:
    from qlinear.io import latency

    nodes = latency.optimized_nodes(model)
    return {"int8": sum(nodes["int8"].values()), "float": sum(nodes["float"].values()),
            "conversions": sum(nodes["conversions"].values())}


def figure(name: str, model: Path) -> float:
    data = measure_float.data(name)
    result = measure_float.against_float(name, measure_float.float_outputs(name),
                                         measure_float.outputs(name, ort_runner(model), data), data)
    return result["quantized"] if name != "ocr_det" else result["vs float"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--repeats", type=int, default=20, help="timed runs per model and thread count")
    parser.add_argument("--json", type=Path, help="write the rows here too")
    args = parser.parse_args()
    print("```\n" + subprocess.run(["lscpu"], capture_output=True, text=True).stdout.split("Flags:")[0].strip()
          + "\n```\n")
    rows = []
    with tempfile.TemporaryDirectory(prefix="placement_rules_") as scratch:
        folder = Path(scratch)
        for name in args.models:
            data = calibration(folder, name)
            outputs = {}
            for variant_name in args.variants:
                output = folder / f"{name}.{variant_name}.onnx"
                report = quantize(name, data, output, variant_name)
                outputs[variant_name] = (output, report["activations"]["pairs"])
            models = [path(name)] + [outputs[v][0] for v in args.variants]
            timed = {threads: latencies(models, feeds(name), threads, args.repeats) for threads in (1, 2)}
            for index, variant_name in enumerate(args.variants, start=1):
                output, pairs = outputs[variant_name]
                row = {"model": name, "variant": variant_name, "pairs": pairs,
                       **{f"ms_{t}": timed[t][index] for t in (1, 2)},
                       **{f"ratio_{t}": timed[t][index] / timed[t][0] for t in (1, 2)},
                       **optimized_counts(output), "figure": figure(name, output)}
                rows.append(row)
            float_figure = next(iter(measure_float.figures(name, measure_float.float_outputs(name),
                                                          measure_float.data(name)).values()))
            what = "map IoU against float" if name == "ocr_det" else f"float {float_figure:.4f}"
            print(f"\n{name}: float {timed[1][0]:.1f} ms (1 thread), {timed[2][0]:.1f} ms (2 threads); task figure: "
                  f"{what}\n")
            print("| variant | pairs | 1 thread ms | / float | 2 threads ms | / float | int8 nodes | float nodes | "
                  "Q/DQ left | task figure |")
            print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            for row in rows:
                if row["model"] == name:
                    print(f"| {row['variant']} | {row['pairs']} | {row['ms_1']:.1f} | {row['ratio_1']:.2f} | "
                          f"{row['ms_2']:.1f} | {row['ratio_2']:.2f} | {row['int8']} | {row['float']} | "
                          f"{row['conversions']} | {row['figure']:.4f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
