"""The peer of 4-bit weight quantization on a trained transformer (issue 31): onnxruntime's own quantizer
(``onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer``) on sentence-transformers'
paraphrase-MiniLM-L3-v2 (``minilm_l3`` of tests/corpus/models.py), each configuration measured on the paraphrase
task of tests/corpus/transformer.py (evaluation split: 256 pairs, 512 sentences; calibration split for GPTQ: 64
other pairs, other frames and words):

- the task figures (``retrieval``: share of sentences whose nearest neighbour is their paraphrase; ``margin``;
  ``cos_to_float``: mean cosine of each sentence embedding to the float model's (float: basic optimizations)), as
  deployed (onnxruntime, ORT_ENABLE_ALL) and, in brackets, under basic optimizations (the graph as written: differs
  only where onnxruntime fuses DequantizeLinear -> MatMul into MatMulNBits, which by default quantizes the
  activations to int8 blockwise: ``session.qdq_matmulnbits_accuracy_level`` = 4);
- the time to quantize (wall clock of ``MatMulNBitsQuantizer(...).process()``, one run);
- the latency in onnxruntime, ORT_ENABLE_ALL, 1 intra-op thread, median (and minimum) of 100 runs for one sentence
  ([1, 16] tokens) and of 20 runs for a batch of 64 ([64, 16]), after 3 warm-up runs, the models taking turns;
- the model size and what the optimized graph runs (MatMulNBits and the MatMuls left float).

Every configuration quantizes the 18 MatMul weights (the 6 activation x activation MatMuls of attention have no
weight) to 4 bits in blocks of 32 along K; the word-embedding Gather (30522 x 384, 70% of the file) stays float.

    uv run python benchmarks/matmulnbits_fusion.py   # the DequantizeLinear -> MatMul fusion conditions
    uv run python benchmarks/transformer_peer.py [--json OUT.json] [--skip-gptq]

GPTQ note: onnxruntime 1.32's GPTQ (``onnxruntime/quantization/neural_compressor/weight_only.py``, vendored from
Intel Neural Compressor; it needs nothing beyond onnxruntime, numpy and onnx) writes the same weights as its RTN:
its ``gptq()`` takes ``np.linalg.cholesky(np.linalg.inv(H)).T`` (the upper factor) and then indexes it as the lower
one (``Hinv1[i:, i]``, ``Hinv[i2:, i1:i2]``: zeros below the diagonal), so no quantization error is ever
propagated to the columns not yet quantized. The row "GPTQ, factor fixed here" reruns it with the ``.T`` removed
(patched in this process only) to show what the algorithm would give; it still re-derives each block's scale from
the GPTQ-rounded values (``quant_tensor`` after ``gptq``) and takes group scales from the not-updated weights.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from corpus import transformer  # noqa: E402
from corpus.models import ort_runner, path  # noqa: E402

BLOCK = 32
EVAL_PAIRS, EVAL_SEED = 256, 0
CAL_PAIRS, CAL_SEED, CAL_BATCH = 64, 1, 16
RUNS, RUNS_ONE = 20, 100  # latency runs for the batch of 64 and for one sentence (a few ms each: more runs)


def _session(model_bytes: bytes, threads: int = 1):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])


def latencies(models: dict[str, bytes], batch: int, runs: int = 20, warmup: int = 3) -> dict[str, tuple[float, float]]:
    """(median, minimum) milliseconds of one run on [batch, LENGTH] tokens for each model, 1 thread, ORT_ENABLE_ALL.
    The models take turns (run r of every model, then run r + 1), so load from elsewhere on the machine falls on all
    alike."""
    sessions = {name: _session(model_bytes) for name, model_bytes in models.items()}
    encoded = transformer.encode(transformer.make_pairs(batch // 2 + 1, "eval", 5).texts[:batch])
    feeds = {name: encoded[name] for name in transformer.INPUTS}
    times: dict[str, list[float]] = {name: [] for name in models}
    for round_ in range(warmup + runs):
        for name, session in sessions.items():
            start = time.perf_counter()
            session.run(None, feeds)
            if round_ >= warmup:
                times[name].append(time.perf_counter() - start)
    return {name: (1000 * statistics.median(values), 1000 * min(values)) for name, values in times.items()}


def optimized_ops(model_bytes: bytes) -> dict[str, int]:
    """Counts of MatMul-like ops in onnxruntime's optimized graph (ORT_ENABLE_ALL)."""
    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as folder:
        written = Path(folder) / "optimized.onnx"
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.optimized_model_filepath = str(written)
        ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
        counts: dict[str, int] = {}
        for node in onnx.load(str(written)).graph.node:
            if "MatMul" in node.op_type or node.op_type in ("Gemm", "DequantizeLinear", "Attention"):
                counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


class _Reader:
    """onnxruntime's CalibrationDataReader protocol over the calibration split (batches of CAL_BATCH sentences)."""

    def __init__(self):
        self.feeds = transformer.calibration_feeds(CAL_PAIRS, CAL_SEED, batch=CAL_BATCH)
        self.rewind()

    def get_next(self):
        return next(self.iterator, None)

    def rewind(self):
        self.iterator = iter(self.feeds)

    def __iter__(self):
        return self

    def __next__(self):
        item = self.get_next()
        if item is None:
            raise StopIteration
        return item


@contextlib.contextmanager
def _gptq_factor_fixed():
    """onnxruntime's vendored gptq() with the Cholesky factor not transposed (see the module docstring)."""
    import inspect

    from onnxruntime.quantization.neural_compressor import weight_only

    original = weight_only.gptq
    source = inspect.getsource(original)
    wrong = "H = np.linalg.cholesky(np.linalg.inv(H)).T"
    if wrong not in source:
        raise RuntimeError("onnxruntime's gptq() changed: the patch does not apply")
    namespace = dict(vars(weight_only))
    exec(source.replace(wrong, "H = np.linalg.cholesky(np.linalg.inv(H))"), namespace)  # noqa: S102
    weight_only.gptq = namespace["gptq"]
    try:
        yield
    finally:
        weight_only.gptq = original


def configurations(skip_gptq: bool) -> dict:
    """name -> (callable returning (MatMulNBitsQuantizer keyword arguments), context manager factory)."""
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization import matmul_nbits_quantizer as nbits

    found = {
        "DEFAULT asym (RTN, zero points)": lambda: {
            "algo_config": nbits.DefaultWeightOnlyQuantConfig(block_size=BLOCK, is_symmetric=False)},
        "DEFAULT sym (RTN, no zero points)": lambda: {
            "algo_config": nbits.DefaultWeightOnlyQuantConfig(block_size=BLOCK, is_symmetric=True)},
        "DEFAULT asym, accuracy_level 4 (int8 activations)": lambda: {
            "algo_config": nbits.DefaultWeightOnlyQuantConfig(block_size=BLOCK, is_symmetric=False,
                                                              accuracy_level=4)},
        "DEFAULT asym, QDQ format (DQ axis 0 -> MatMul)": lambda: {
            "algo_config": nbits.DefaultWeightOnlyQuantConfig(block_size=BLOCK, is_symmetric=False,
                                                              quant_format=QuantFormat.QDQ)},
        "RTN (INC's, asym)": lambda: {"block_size": BLOCK, "algo_config": nbits.RTNWeightOnlyQuantConfig()},
        "HQQ": lambda: {"algo_config": nbits.HQQWeightOnlyQuantConfig(block_size=BLOCK)},
    }
    if not skip_gptq:
        # MatMulNBitsQuantizer's block_size is GPTQ's group size (its weight_config); GPTQWeightOnlyQuantConfig's
        # block_size is GPTQ's column block (left at 128).
        found["GPTQ (asym, 128 sentences)"] = lambda: {
            "block_size": BLOCK, "algo_config": nbits.GPTQWeightOnlyQuantConfig(calibration_data_reader=_Reader())}
        found["GPTQ, factor fixed here (not onnxruntime's)"] = lambda: {
            "block_size": BLOCK, "algo_config": nbits.GPTQWeightOnlyQuantConfig(calibration_data_reader=_Reader()),
            "_context": _gptq_factor_fixed}
    return found


def quantize(source: Path, arguments: dict) -> tuple[bytes, float]:
    import onnx
    from onnxruntime.quantization import matmul_nbits_quantizer as nbits

    context = arguments.pop("_context", contextlib.nullcontext)
    model = onnx.load(str(source))
    with context(), contextlib.redirect_stdout(sys.stderr):  # GPTQ prints a progress bar
        start = time.perf_counter()
        quantizer = nbits.MatMulNBitsQuantizer(model, **arguments)
        quantizer.process()
        seconds = time.perf_counter() - start
    return quantizer.model.model.SerializeToString(), seconds


def quantize_qlinear(source: Path, method: str, calibration: Path, folder: Path) -> tuple[bytes, float]:
    """`qlinear quantize --dtype int4 --block-size 32 --rounding METHOD`, weights only (its own process, as a user
    runs it), on the calibration split that onnxruntime's GPTQ reads."""
    import subprocess

    output = folder / f"qlinear.{method}.onnx"
    # the MatMul weights only, as onnxruntime's quantizer: qlinear's defaults would take the embedding tables too
    command = [sys.executable, "-m", "qlinear", "quantize", str(source), "--dtype", "int4", "--block-size", str(BLOCK),
               "-o", str(output), "--force", "--no-eval", "--rounding", method, "--exclude", "*embeddings*"]
    if method not in ("rtn", "hqq"):
        command += ["--calibrate", str(calibration), "--activations", "float"]
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode:
        raise RuntimeError(result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "failed")
    return output.read_bytes(), seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--skip-gptq", action="store_true", help="leave out the two GPTQ rows (about a minute)")
    parser.add_argument("--qlinear", nargs="*", default=["rtn", "hqq", "gptq", "awq"],
                        help="qlinear's --rounding methods measured beside onnxruntime's (default: rtn hqq gptq awq)")
    args = parser.parse_args(argv)
    logging.getLogger("onnxruntime.quantization").setLevel(logging.WARNING)
    logging.disable(logging.INFO)

    import onnxruntime as ort

    source = path("minilm_l3")
    pairs = transformer.make_pairs(EVAL_PAIRS, "eval", EVAL_SEED)
    float_bytes = source.read_bytes()
    reference = transformer.embeddings(ort_runner(float_bytes), pairs.texts)
    models = {"float": float_bytes}
    rows = {"float": {"name": "float", "seconds": None}}
    for name, make in configurations(args.skip_gptq).items():
        try:
            models[name], seconds = quantize(source, make())
        except Exception as exc:  # noqa: BLE001 (a configuration that fails is a result too)
            rows[name] = {"name": name, "error": f"{type(exc).__name__}: {exc}"}
            print(f"{name}: failed: {exc}", file=sys.stderr)
            continue
        rows[name] = {"name": name, "seconds": seconds}
        print(f"{name}: quantized in {seconds:.2f} s", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="qlinear-transformer-") as folder:
        calibration = Path(folder) / "calibration.npz"
        transformer.write_calibration(calibration, CAL_PAIRS, CAL_SEED)  # the 128 sentences GPTQ's reader gives
        for method in args.qlinear:
            name = f"qlinear {method} (asym, zero points)"
            try:
                models[name], seconds = quantize_qlinear(source, method, calibration, Path(folder))
            except RuntimeError as exc:
                rows[name] = {"name": name, "error": str(exc)}
                continue
            rows[name] = {"name": name, "seconds": seconds}
            print(f"{name}: quantized in {seconds:.2f} s", file=sys.stderr)
    for name, model_bytes in models.items():
        # figures as deployed (ORT_ENABLE_ALL: a DequantizeLinear -> MatMul runs as MatMulNBits) and under the
        # ONNX semantics (basic optimizations: the graph as written)
        deployed = transformer.evaluate(ort_runner(model_bytes, optimized=True), pairs, reference)
        written = transformer.evaluate(ort_runner(model_bytes), pairs, reference)
        rows[name].update(deployed, cos_basic=written["cos_to_float"], retrieval_basic=written["retrieval"],
                          bytes=len(model_bytes), ops=optimized_ops(model_bytes))
    for batch, runs in ((1, RUNS_ONE), (64, RUNS)):
        for name, milliseconds in latencies(models, batch, runs).items():
            rows[name][f"ms_{batch}"], rows[name][f"ms_{batch}_min"] = milliseconds
    rows = list(rows.values())

    print(f"onnxruntime {ort.__version__}; paraphrase-MiniLM-L3-v2, evaluation {len(pairs.texts)} sentences; "
          f"4-bit, blocks of {BLOCK}; latency 1 thread, ORT_ENABLE_ALL\n")
    print("| configuration | retrieval | margin | cos to float | (basic: retrieval, cos) | quantize s | MB | "
          "ms [1,16] median (min) | ms [64,16] median (min) | optimized graph |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        if "error" in row:
            print(f"| {row['name']} | failed: {row['error'][:100]} | | | | | | | | |")
            continue
        seconds = "" if row["seconds"] is None else f"{row['seconds']:.2f}"
        ops = ", ".join(f"{op} {count}" for op, count in sorted(row["ops"].items()))
        print(f"| {row['name']} | {row['retrieval']:.4f} | {row['margin']:.4f} | {row['cos_to_float']:.5f} | "
              f"{row['retrieval_basic']:.4f}, {row['cos_basic']:.5f} | {seconds} | {row['bytes'] / 1e6:.1f} | "
              f"{row['ms_1']:.2f} ({row['ms_1_min']:.2f}) | {row['ms_64']:.1f} ({row['ms_64_min']:.1f}) | {ops} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
