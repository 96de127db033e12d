"""Static int8 with the defaults on trained models beyond the corpus (the models and data of
tests/corpus/test_corpus_more.py): each task figure for float, the int8 model under the ONNX semantics
(onnxruntime, basic optimizations), in onnxruntime's int8 kernels (its default optimizations), and in those
kernels with `session.x64quantprecision=1` (exact on CPUs without VNNI); the latency of float and int8 in
onnxruntime on 1 and 2 threads (`qlinear.io.latency`, as `qlinear quantize` reports it); file sizes; and what the
optimized graph runs in float.

    uv run python benchmarks/more_models.py
"""

from __future__ import annotations

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

from corpus import captcha, filetype, wakeword  # noqa: E402
from corpus.models import path  # noqa: E402


def runner(model, optimized: bool = False, x64: bool = False):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 2
    options.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimized
                                        else ort.GraphOptimizationLevel.ORT_ENABLE_BASIC)
    if x64:
        options.add_session_config_entry("session.x64quantprecision", "1")
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    return lambda feeds: session.run(None, feeds)


def quantize(source: Path, arrays: dict, folder: Path, stem: str) -> tuple[Path, dict]:
    from qlinear.cli import main

    data, output = folder / f"{stem}.calibration.npz", folder / f"{stem}.int8.onnx"
    np.savez(data, **arrays)
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["quantize", str(source), "--dtype", "int8", "--calibrate", str(data), "-o", str(output),
                     "--no-eval", "--report-samples", "0", "--json"])
    if code != 0:
        raise RuntimeError(f"{stem}: exit {code}")
    return output, json.loads(stdout.getvalue())


def figures(task, source: Path, output: Path) -> list[float]:
    return [task(runner(source, True)), task(runner(output)), task(runner(output, True)), task(runner(output, True, True))]


def main() -> int:
    print("```\n" + subprocess.run(["lscpu"], capture_output=True, text=True).stdout.split("Flags:")[0].strip() + "\n```\n")
    rows = []
    with tempfile.TemporaryDirectory(prefix="more_models_") as scratch:
        folder = Path(scratch)
        ev = filetype.make_filetype_data(20, seed=1)
        out, report = quantize(path("filetype"), {"bytes": filetype.make_filetype_data(6, seed=2).features}, folder, "ft")
        rows.append(("Magika standard_v1 (Keras, tf2onnx: Dense)", "filetype", f"top-1, {len(ev)} files of 26 types",
                     figures(lambda r: filetype.filetype_accuracy(filetype.run_filetype(r, ev), ev), path("filetype"), out),
                     report))
        ev = captcha.make_captcha_data(200)
        out, report = quantize(path("captcha_rec"), {"input1": captcha.make_captcha_data(64, seed=1).images}, folder, "cr")
        rows.append(("ddddocr recogniser (PyTorch: CNN + LSTM)", "captcha_rec", "exact match (case ignored), 200 captchas",
                     figures(lambda r: captcha.captcha_accuracy(captcha.run_captcha(r, ev), ev.labels), path("captcha_rec"),
                             out), report))
        pages = captcha.make_click_pages(50)
        out, report = quantize(path("captcha_det"), {"images": np.concatenate([p.x for p in captcha.make_click_pages(8, seed=1)])},
                               folder, "cd")
        rows.append(("ddddocr click detector (PyTorch: YOLOX)", "captcha_det", "box recall at IoU 0.5, 50 pages",
                     figures(lambda r: captcha.box_recall(captcha.run_click(r, pages), pages), path("captcha_det"), out),
                     report))
        for phrase in ("alexa", "hey jarvis"):
            head_name, head_input = wakeword.HEADS[phrase]
            calibration, ev = wakeword.make_wake_data(phrase, 10, 10, seed=1), wakeword.make_wake_data(phrase)
            floating = wakeword.wake_runners(phrase)
            specs = [wakeword.streaming_melspectrogram(floating.melspectrogram, wakeword.padded_clip(c))
                     for c in calibration.clips]
            emb, emb_report = quantize(path("wake_embedding"), {"input_1": np.concatenate(
                [wakeword.embedding_inputs(s) for s in specs])}, folder, f"emb{phrase}")
            feats = [wakeword.embeddings(floating.embedding, s) for s in specs]
            head, head_report = quantize(path(head_name), {head_input: np.concatenate(
                [wakeword.head_inputs(f) for f in feats])}, folder, f"head{phrase}")

            def task(emb_runner, head_runner, ev=ev, phrase=phrase):
                pipeline = wakeword.wake_runners(phrase, embedding=emb_runner, head=head_runner)
                return wakeword.wake_accuracy(wakeword.wake_scores(pipeline, ev.clips), ev.labels)

            found = [task(runner(path("wake_embedding"), True), runner(path(head_name), True)),
                     task(runner(emb), runner(head)), task(runner(emb, True), runner(head, True)),
                     task(runner(emb, True, True), runner(head, True, True))]
            rows.append((f"openWakeWord '{phrase}' (embedding: Keras via tf2onnx; head: PyTorch Dense)",
                         f"wake_embedding + {head_name}", f"clip decisions, {len(ev.labels)} clips", found,
                         emb_report, head_report))
    print("| model | data | float | int8 (ONNX semantics) | int8 (onnxruntime kernels) | kernels, x64quantprecision | "
          "1 thread int8/float | 2 threads int8/float | file MB | optimized graph in float |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|---|")
    for row in rows:
        label, _, data, found, *reports = row
        ratios = [" + ".join(f"{r['model']['latency']['threads'][t]['ratio']:.2f}" for r in reports) for t in ("1", "2")]
        sizes = " + ".join(f"{r['files']['before'] / 1e6:.2f} -> {r['files']['after'] / 1e6:.2f}" for r in reports)
        floats = "; ".join(", ".join(f"{op} {n}" for op, n in r["model"]["latency"]["nodes"]["float"].items()) or "none"
                           for r in reports)
        print(f"| {label} | {data} | " + " | ".join(f"{100 * v:.2f}%" for v in found)
              + f" | {ratios[0]} | {ratios[1]} | {sizes} | {floats} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
