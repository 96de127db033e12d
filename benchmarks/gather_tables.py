"""The transformer's embedding tables at 4 bits in onnxruntime (BENCHMARKS.md, "4-bit Gather tables"): the float
model, `qlinear quantize --dtype int4` with the default --target onnxruntime (the tables read by
com.microsoft.GatherBlockQuantized), the same with --target qdq-portable (DequantizeLinear -> Gather, which
onnxruntime dequantizes whole on every run) and with the tables excluded; per model the file size, the latency of
one sentence (onnxruntime's default optimizations, 1 thread, median of --runs after 20 warm-up runs, the models in
turns) and the task figures of `tests/corpus/transformer.py` on its 512 evaluation sentences.

    uv run python benchmarks/gather_tables.py [--dtype int4] [--rounding rtn] [--runs 200]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402

from corpus import transformer  # noqa: E402
from corpus.models import path  # noqa: E402
from qlinear.bench import cpu_model  # noqa: E402
from qlinear.cli import main as qlinear_main  # noqa: E402


def session(model: Path, threads: int, optimized: Path):
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.optimized_model_filepath = str(optimized)
    return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="int4")
    parser.add_argument("--rounding", default="rtn", help="the weights' rounding (rtn: the fastest; the tables' "
                        "treatment does not depend on it)")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    source = path("minilm_l3")
    tables = [n.input[0] for n in onnx.load(str(source)).graph.node if n.op_type == "Gather"
              and n.input[0].endswith("embeddings.weight")]
    with tempfile.TemporaryDirectory(prefix="qlinear-gather-") as temporary:
        folder = Path(temporary)
        models = {"float": source}
        for tag, extra in (("target onnxruntime (default)", []), ("target qdq-portable", ["--target", "qdq-portable"]),
                           ("tables excluded", sum((["--exclude", t] for t in tables), []))):
            out = folder / f"{len(models)}.onnx"
            with contextlib.redirect_stdout(io.StringIO()):
                assert qlinear_main(["quantize", str(source), "--dtype", args.dtype, "--rounding", args.rounding,
                                     "-o", str(out), "--force", "--no-eval", *extra]) == 0
            models[tag] = out
        feeds = transformer.encode(["the cat sat on the mat by the door ."])
        sessions, graphs = {}, {}
        for index, (tag, model) in enumerate(models.items()):
            optimized = folder / f"optimized{index}.onnx"
            sessions[tag] = session(model, args.threads, optimized)
            counts: dict[str, int] = {}
            for node in onnx.load(str(optimized)).graph.node:
                counts[node.op_type] = counts.get(node.op_type, 0) + 1
            graphs[tag] = ", ".join(f"{op} {counts[op]}" for op in ("GatherBlockQuantized", "DequantizeLinear",
                                                                       "MatMulNBits") if op in counts)
        names = {tag: [i.name for i in s.get_inputs()] for tag, s in sessions.items()}
        times: dict[str, list[float]] = {tag: [] for tag in sessions}
        for tag, s in sessions.items():
            for _ in range(20):
                s.run(None, {k: feeds[k] for k in names[tag]})
        for _ in range(args.runs):
            for tag, s in sessions.items():
                start = time.perf_counter()
                s.run(None, {k: feeds[k] for k in names[tag]})
                times[tag].append(time.perf_counter() - start)
        pairs = transformer.make_pairs(256, "eval", seed=0)
        reference = None
        print(f"CPU: {cpu_model()}; onnxruntime {ort.__version__}, {args.threads} thread(s), --dtype {args.dtype} "
              f"--rounding {args.rounding}\n")
        print("| model | file | ms, 1 sentence | x float | retrieval | cos to float | onnxruntime's optimized graph |")
        print("|---|---|---|---|---|---|---|")
        base = statistics.median(times["float"])
        for tag, s in sessions.items():
            run = (lambda s, n: lambda feed: s.run(None, {k: v for k, v in feed.items() if k in n}))(s, names[tag])
            figures = transformer.evaluate(run, pairs, reference)
            if reference is None:
                reference = transformer.embeddings(run, pairs.texts)
            ms = 1000 * statistics.median(times[tag])
            cos = f"{figures['cos_to_float']:.5f}" if "cos_to_float" in figures else "1"
            print(f"| {tag} | {models[tag].stat().st_size / 2**20:.1f} MiB | {ms:.2f} | {ms / 1000 / base:.2f} | "
                  f"{figures['retrieval']:.4f} | {cos} | {graphs[tag]} |")


if __name__ == "__main__":
    main()
