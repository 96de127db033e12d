"""Static int8 quantization of the PP-OCR corpus models, side by side: onnxruntime's
`onnxruntime.quantization.quantize_static` (QDQ, uint8 activations, int8 weights; MinMax, Percentile, Entropy;
per tensor and per channel; and the pre-processed variant onnxruntime's example recommends) against
`qlinear quantize --dtype int8 --calibrate` (minmax, percentile, entropy, mse), on the same calibration samples.

Per run (each in a subprocess under /usr/bin/time -v, watched so that none goes above --limit-gb): the wall
time and peak resident memory, whether onnxruntime loads the model, the task figure on the corpus' labelled
data (onnxruntime, basic graph optimizations) against the float model's, and the share of Conv/MatMul/Gemm
data inputs read from a DequantizeLinear. Then the latency of the float and the int8 models with
onnxruntime's default (all) graph optimizations on 1 and 2 threads, and how the peak memory of entropy
calibration grows with the number of samples (recogniser).

    uv run python benchmarks/static.py
    uv run python benchmarks/static.py --models ocr_cls --samples 32 --json static.json

The calibration samples are made with seed 7 (the labelled data uses the corpus' own seeds): --samples lines
for the classifier and the recogniser, --pages pages for the detector (one page per .npz in a folder, since
the pages differ in size). Needs the dev dependency group (the corpus wheels, onnxruntime, Pillow).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from corpus import measure_float, ocr  # noqa: E402
from corpus.models import ort_runner, path  # noqa: E402

MODELS = ("ocr_cls", "ocr_rec", "ocr_det")
ORT_METHODS = ("MinMax", "Percentile", "Entropy")
QLINEAR_METHODS = ("minmax", "percentile", "entropy", "mse")
QLINEAR_DEFAULT = "mse"  # `qlinear quantize --calibrate` without --method
SEED = 7  # calibration data; the labelled data of tests/corpus uses other seeds
SCALING_SAMPLES = (16, 128)  # memory scaling: recogniser lines
HISTOGRAM_METHODS = ("Percentile", "Entropy")  # onnxruntime keeps every sample's activations for these

RUNNER = r'''
"""onnxruntime's quantize_static on calibration samples (benchmarks/static.py writes and runs this)."""
import json, sys, time, traceback
from pathlib import Path

import numpy as np
from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                      quant_pre_process, quantize_static)


def samples(source, limit):
    source = Path(source)
    files = sorted(source.glob("*.npz")) if source.is_dir() else [source]
    feeds = []
    for file in files:
        with np.load(file) as archive:
            arrays = {name: archive[name] for name in archive.files}
        for index in range(len(next(iter(arrays.values())))):
            if limit is not None and len(feeds) >= limit:
                return feeds
            feeds.append({name: np.ascontiguousarray(a[index:index + 1]) for name, a in arrays.items()})
    return feeds


class Reader(CalibrationDataReader):
    """One sample per get_next (a batch of one, as qlinear calibrates)."""

    def __init__(self, feeds):
        self.feeds, self.position, self.end = feeds, 0, len(feeds)

    def get_next(self):
        if self.position >= self.end:
            return None
        self.position += 1
        return self.feeds[self.position - 1]

    def __len__(self):
        return len(self.feeds)

    def set_range(self, start_index, end_index):
        self.position, self.end = start_index, min(end_index, len(self.feeds))


spec = json.loads(Path(sys.argv[1]).read_text())
result = {"ok": False}
code = 1
try:
    feeds = samples(spec["data"], spec.get("limit"))
    result["samples"] = len(feeds)
    model = spec["model"]
    if spec.get("preprocess"):
        started = time.perf_counter()
        # skip_symbolic_shape: symbolic shape inference needs sympy (not installed; it is for transformers)
        quant_pre_process(model, spec["output"] + ".pre.onnx", skip_symbolic_shape=True)
        result["preprocess_s"] = time.perf_counter() - started
        model = spec["output"] + ".pre.onnx"
    started = time.perf_counter()
    quantize_static(model, spec["output"], Reader(feeds), quant_format=QuantFormat.QDQ,
                    per_channel=spec["per_channel"], activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    calibrate_method=getattr(CalibrationMethod, spec["method"]),
                    extra_options=spec.get("extra_options") or {})
    result["quantize_s"] = time.perf_counter() - started
    result["ok"] = True
    code = 0
except BaseException as error:  # MemoryError too
    text = str(error).strip()
    result["error"] = type(error).__name__ + (": " + text.splitlines()[0] if text else "")
    traceback.print_exc()
Path(spec["result"]).write_text(json.dumps(result))
sys.exit(code)
'''


# ------------------------------------------------------------------------------------------ subprocesses


def _group_rss(group: int) -> int:
    """Resident bytes of every process in process group ``group``."""
    total = 0
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            if int(stat.rpartition(")")[2].split()[2]) != group:
                continue
            total += int(Path(f"/proc/{entry}/statm").read_text().split()[1]) * page
        except (OSError, ValueError, IndexError):
            continue
    return total


def _time_v(text: str) -> dict:
    found = {}
    match = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    if match:
        found["peak_bytes"] = int(match.group(1)) * 1024
    match = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text)
    if match:
        seconds = 0.0
        for part in match.group(1).split(":"):
            seconds = seconds * 60 + float(part)
        found["wall_s"] = seconds
    match = re.search(r"Exit status: (\d+)", text)
    if match:
        found["exit"] = int(match.group(1))
    return found


def measured(command: list[str], log: Path, limit_bytes: int, timeout_s: float) -> dict:
    """Run ``command`` under /usr/bin/time -v in its own process group; kill the group when its resident
    memory goes above ``limit_bytes`` or it runs longer than ``timeout_s``. Wall time and peak RSS from
    time -v (the watcher's own figures when the run was killed)."""
    out, err = log.parent / (log.name + ".out"), log.parent / (log.name + ".err")
    started = time.perf_counter()
    with out.open("w") as stdout, err.open("w") as stderr:
        process = subprocess.Popen(["/usr/bin/time", "-v", *command], stdout=stdout, stderr=stderr, cwd=ROOT,
                                   start_new_session=True)
        seen, killed = 0, None
        while process.poll() is None:
            rss = _group_rss(process.pid)
            seen = max(seen, rss)
            if rss > limit_bytes:
                killed = f"killed by the benchmark: resident memory above {limit_bytes / 2**30:.0f} GiB"
            elif time.perf_counter() - started > timeout_s:
                killed = f"killed by the benchmark: longer than {timeout_s:.0f} s"
            if killed:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                break
            time.sleep(0.2)
    wall = time.perf_counter() - started
    result = {"command": command, "stdout": str(out), "stderr": str(err), "wall_s": wall, "peak_bytes": seen,
              "killed": killed}
    if killed is None:
        result.update(_time_v(err.read_text(errors="replace")))
    result["exit"] = result.get("exit", process.returncode)
    return result


def _last_error_line(stderr: Path) -> str:
    """The exception line of a traceback (or the last line before time -v's report)."""
    lines = stderr.read_text(errors="replace").split("\n\tCommand being timed")[0].strip().splitlines()
    for line in reversed(lines):
        if re.match(r"^[A-Za-z_.]*(Error|Exception|Fail)[A-Za-z_]*:", line.strip()):
            return line.strip()
    return lines[-1].strip() if lines else ""


def _cpu_ticks() -> dict[int, tuple[str, int]]:
    ticks = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                fields = stat.rpartition(")")[2].split()
                ticks[int(entry)] = (stat.partition("(")[2].rpartition(")")[0], int(fields[11]) + int(fields[12]))
            except (OSError, ValueError, IndexError):
                continue
    return ticks


def other_load(seconds: float = 2.0) -> list[str]:
    """Processes other than this one that used more than 20% of a core over ``seconds``."""
    before = _cpu_ticks()
    time.sleep(seconds)
    after = _cpu_ticks()
    hertz = os.sysconf("SC_CLK_TCK")
    busy = []
    for pid, (name, ticks) in after.items():
        if pid == os.getpid() or pid not in before:
            continue
        share = (ticks - before[pid][1]) / hertz / seconds
        if share > 0.2:
            busy.append(f"{name} (pid {pid}) {100 * share:.0f}% of a core")
    return busy


def wait_until_quiet(limit_s: float) -> str:
    """Wait (at most ``limit_s``) until no other process keeps a core busy; say what was seen."""
    started = time.perf_counter()
    busy = other_load()
    while busy and time.perf_counter() - started < limit_s:
        time.sleep(10)
        busy = other_load()
    waited = time.perf_counter() - started
    if busy:
        return f"other processes busy during the measurement (waited {waited:.0f} s): {'; '.join(busy)}"
    return f"no other busy process on the machine (checked over 2 s; waited {waited:.0f} s)"


# --------------------------------------------------------------------------------------------- the data


def calibration_data(folder: Path, name: str, count: int) -> Path:
    """``count`` calibration samples of model ``name`` (seed 7): an .npz, or for the detector a folder of
    one-page .npz files."""
    if name == "ocr_det":
        target = folder / f"det_pages_{count}"
        if not target.exists():
            target.mkdir()
            for index, page in enumerate(ocr.make_det_pages(count, seed=SEED)):
                np.savez(target / f"page{index:03}.npz", x=page.x)
        return target
    target = folder / f"{name}_{count}.npz"
    if not target.exists():
        maker = ocr.make_rec_data if name == "ocr_rec" else ocr.make_cls_data
        np.savez(target, x=maker(count, seed=SEED).images)
    return target


def representative_input(name: str) -> dict:
    data = measure_float.data(name)
    if name == "ocr_det":
        return {"x": data[0].x}
    return {"x": np.ascontiguousarray(data.images[:8])}


def describe_input(name: str, feeds: dict) -> str:
    shape = "x".join(map(str, feeds["x"].shape))
    return f"one page {shape}" if name == "ocr_det" else f"a batch of 8 lines {shape}"


# ------------------------------------------------------------------------------------------ measurements


def data_inputs_quantized(model_path: Path) -> tuple[int, int, dict]:
    """(quantized, all) data inputs of Conv/ConvTranspose/MatMul/Gemm: those read from a DequantizeLinear
    (as tests/corpus/test_corpus_static.py counts them); and how the Conv/ConvTranspose/Gemm weights are
    stored: int8 initializers per channel or per tensor, a QuantizeLinear of a float constant (quantized when
    the session is made), or float."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    producer = {o: n for n in model.graph.node for o in n.output}
    initializers = {i.name: i for i in model.graph.initializer}

    def constant(name: str):
        """The TensorProto behind ``name``: an initializer or a Constant node's value."""
        if name in initializers:
            return initializers[name]
        node = producer.get(name)
        if node is not None and node.op_type == "Constant":
            return next((a.t for a in node.attribute if a.name == "value"), None)
        return None

    total = quantized = 0
    weights: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type not in ("Conv", "ConvTranspose", "MatMul", "Gemm"):
            continue
        for position in (0,) if node.op_type.startswith("Conv") else (0, 1):
            total += 1
            quantized += getattr(producer.get(node.input[position]), "op_type", None) == "DequantizeLinear"
        if node.op_type == "MatMul":
            continue
        source = producer.get(node.input[1])
        if source is None or source.op_type != "DequantizeLinear":
            kind = "float"
        else:
            scale = constant(source.input[1])
            per = "channel" if scale is not None and len(scale.dims) and scale.dims[0] > 1 else "tensor"
            stored = constant(source.input[2]) if len(source.input) > 2 and source.input[2] else None
            stored = stored if stored is not None else constant(source.input[0])
            what = onnx.helper.tensor_dtype_to_np_dtype(stored.data_type).name if stored is not None else "int8?"
            if getattr(producer.get(source.input[0]), "op_type", None) == "QuantizeLinear":
                kind = f"float + QuantizeLinear to {what} per {per}"  # quantized when the session is made
            else:
                kind = f"{what} per {per}"
        weights[kind] = weights.get(kind, 0) + 1
    return quantized, total, weights


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return type(error).__name__ + (": " + text.splitlines()[0] if text else "")


def evaluate(name: str, model_path: Path) -> dict:
    """Load in onnxruntime (basic optimizations), run the labelled data, the task figure against float's."""
    data = measure_float.data(name)
    float_out = measure_float.float_outputs(name)
    before = measure_float.figures(name, float_out, data)
    key = next(iter(before))
    result = {"figure_name": key, "float": before[key]}
    try:
        result["quantized_inputs"], result["data_inputs"], result["weights"] = data_inputs_quantized(model_path)
    except Exception as error:  # noqa: BLE001
        result["inputs_error"] = first_line(error)
    try:
        run = ort_runner(model_path)
    except Exception as error:  # noqa: BLE001
        return {**result, "loads": False, "error": first_line(error)}
    result["loads"] = True
    try:
        out = measure_float.outputs(name, run, data)
    except Exception as error:  # noqa: BLE001
        return {**result, "runs": False, "error": first_line(error)}
    after = measure_float.figures(name, out, data)
    result.update(runs=True, figure=after[key], figures=after)
    if name == "ocr_det":
        result["map_iou_vs_float"] = ocr.det_iou(float_out, out)
    elif name == "ocr_rec":
        result["texts_equal_float"] = ocr.exact_match(out.texts, [t.strip(" ") for t in float_out.texts])
    else:
        result["predictions_equal_float"] = float((np.asarray(out).argmax(1) == np.asarray(float_out).argmax(1)).mean())
    return result


def session(model_path: Path, threads: int, optimized: Path | None = None):
    """An onnxruntime session with its default graph optimizations (ORT_ENABLE_ALL), as `qlinear quantize` times
    models."""
    from qlinear.io import latency

    return latency.session(Path(model_path), threads, optimized)


KERNELS = ("QLinearConv", "QLinearMatMul", "MatMulIntegerToFloat", "QLinearAdd", "QLinearMul", "QLinearSigmoid",
           "QLinearConcat", "QLinearGlobalAveragePool", "QLinearAveragePool", "QuantizeLinear", "DequantizeLinear",
           "Conv", "FusedConv", "MatMul", "FusedMatMul", "Gemm", "BatchNormalization")


def optimized_ops(model_path: Path) -> dict[str, int]:
    """The operators of interest in onnxruntime's optimized graph (1 thread) of ``model_path``."""
    import onnx

    folder = Path(tempfile.mkdtemp(prefix="static_bench_opt_", dir="/tmp"))
    try:
        session(model_path, 1, folder / "optimized.onnx")
        ops: dict[str, int] = {}
        for node in onnx.load(str(folder / "optimized.onnx"), load_external_data=False).graph.node:
            ops[node.op_type] = ops.get(node.op_type, 0) + 1
        return {k: v for k, v in sorted(ops.items()) if k in KERNELS}
    finally:
        for leftover in folder.iterdir():
            leftover.unlink()
        folder.rmdir()


def latency_rounds() -> int:
    from qlinear.io import latency

    return latency.ROUND_RUNS


def latencies(model_paths: list[Path], feeds: dict, threads: int, repeats: int) -> list[dict]:
    """Median seconds per run of each model that loads, the models taking turns as `qlinear quantize`'s report
    times them (`qlinear.io.latency.timed_in_turns`: on 1 thread every session open and one run per turn; on
    more, one session at a time, in rounds, so that no idle session's spinning workers compete)."""
    from qlinear.io import latency

    results, loaded = [], []
    for model_path in model_paths:
        try:
            session(model_path, threads).run(None, feeds)
            results.append({})
            loaded.append(model_path)
        except Exception as error:  # noqa: BLE001
            results.append({"error": first_line(error)})
    times = iter(latency.timed_in_turns(loaded, feeds, threads, repeats, repeats, float("inf")))
    for result in results:
        if "error" not in result:
            result["times"] = next(times)
            result["median_s"] = statistics.median(result["times"])
            result["runs"] = len(result["times"])
    return results


def latency_table(rows: list[dict], models: list[str], args) -> tuple[list[dict], str]:
    """The latency section: float, qlinear's default, onnxruntime's best (and its recommended variant)."""
    print("\n## Latency: onnxruntime, default graph optimizations (ORT_ENABLE_ALL), median of repeated runs\n")
    print("| model | input | model file | 1 thread ms | int8 / float | 2 threads ms | int8 / float | operators of the "
          "optimized graph (1 thread) |")
    print("|---|---|---|---:|---:|---:|---:|---|")
    quiet = wait_until_quiet(args.quiet_wait)
    before, began = _cpu_ticks(), time.perf_counter()
    entries = []
    for name in models:
        feeds = representative_input(name)
        chosen = [("float", str(path(name)))]
        ours = next((r for r in rows if r["tool"] == "qlinear" and r["model"] == name and r["method"] == QLINEAR_DEFAULT
                     and r.get("runs") and "--target" not in r["variant"] and "no per-layer" not in r["variant"]), None)
        if ours:
            chosen.append((f"qlinear {QLINEAR_DEFAULT} (default, --target onnxruntime)", ours["output"]))
        portable = next((r for r in rows if r["tool"] == "qlinear" and r["model"] == name
                         and "--target qdq-portable" in r["variant"] and r.get("runs")), None)
        if portable:
            chosen.append((f"qlinear {QLINEAR_DEFAULT} --target qdq-portable", portable["output"]))
        theirs = best_ort(rows, name)
        if theirs:
            chosen.append((f"onnxruntime best: {theirs['method']}, {theirs['variant']}", theirs["output"]))
        recommended = next((r for r in rows if r["tool"] == "onnxruntime" and r["model"] == name
                            and r["variant"].startswith("pre-processed") and r.get("runs")
                            and r["method"] == "MinMax"), None)
        if recommended and recommended is not theirs:
            chosen.append((f"onnxruntime MinMax, {recommended['variant']}", recommended["output"]))
        measured_ = {threads: latencies([Path(f) for _, f in chosen], feeds, threads, args.repeats)
                     for threads in (1, 2)}
        for index, (label, model_file) in enumerate(chosen):
            entry = {"model": name, "file": label, "path": model_file, "input": describe_input(name, feeds)}
            cells = []
            for threads in (1, 2):
                got, base = measured_[threads][index], measured_[threads][0]
                entry[threads] = {k: v for k, v in got.items() if k != "times"}
                if "error" in got:
                    cells += [got["error"], "-"]
                    continue
                ratio = got["median_s"] / base["median_s"] if "median_s" in base else None
                cells += [f"{1000 * got['median_s']:.1f}", "-" if index == 0 or ratio is None else f"{ratio:.2f}"]
            try:
                entry["optimized_ops"] = optimized_ops(Path(model_file))
            except Exception as error:  # noqa: BLE001
                entry["optimized_ops"] = {"error": first_line(error)}
            shown = ", ".join(f"{k} {v}" for k, v in entry["optimized_ops"].items()) or "-"
            entries.append(entry)
            print(f"| {name} | {entry['input']} | {label} | {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} | {shown} |")
    after, elapsed = _cpu_ticks(), time.perf_counter() - began
    hertz = os.sysconf("SC_CLK_TCK")
    others = sum(ticks - before[pid][1] for pid, (_, ticks) in after.items()
                 if pid != os.getpid() and pid in before) / hertz
    load = (f"{quiet}; during the latency runs ({elapsed:.0f} s) other processes used {others:.1f} CPU seconds "
            f"({100 * others / elapsed / (os.cpu_count() or 1):.0f}% of the machine)")
    print(f"\nLoad: {load}. Timed runs: {args.repeats} per model and thread count, the models of a row group "
          f"in turns (qlinear.io.latency.timed_in_turns: on 1 thread one run per turn, every session open; on 2, "
          f"rounds of {latency_rounds()} runs, one session at a time, each after 2 untimed runs); "
          f"intra_op_num_threads as shown, inter_op_num_threads 1.")
    return entries, load


# ----------------------------------------------------------------------------------------------- the runs


class Bench:
    def __init__(self, args, folder: Path):
        self.args, self.folder = args, folder
        self.limit = int(args.limit_gb * 2**30)
        self.runner = Path("/tmp/static_bench_runner.py")
        self.runner.write_text(RUNNER)
        self.rows: list[dict] = []
        self.notes: list[str] = []

    def ort(self, name: str, method: str, per_channel: bool, data: Path, *, limit: int | None = None,
            preprocess: bool = False, extra: dict | None = None, tag: str = "", evaluate_model: bool = True) -> dict:
        variant = ("pre-processed, " if preprocess else "") + ("per channel" if per_channel else "per tensor")
        if extra:
            variant += ", " + ", ".join(f"{k}={v}" for k, v in extra.items())
        stem = f"{name}.ort.{method}.{'pc' if per_channel else 'pt'}{'.pre' if preprocess else ''}{tag}"
        output = self.folder / f"{stem}.onnx"
        spec_path = self.folder / f"{stem}.spec.json"
        result_path = self.folder / f"{stem}.result.json"
        result_path.unlink(missing_ok=True)
        spec_path.write_text(json.dumps({"model": str(path(name)), "data": str(data), "limit": limit,
                                         "output": str(output), "method": method, "per_channel": per_channel,
                                         "preprocess": preprocess, "extra_options": extra or {},
                                         "result": str(result_path)}))
        run = measured([sys.executable, str(self.runner), str(spec_path)], self.folder / stem, self.limit,
                       self.args.timeout)
        row = {"tool": "onnxruntime", "model": name, "method": method, "variant": variant, **run}
        if result_path.exists():
            inner = json.loads(result_path.read_text())
            row["samples"] = inner.get("samples")
            row["quantize_s"] = inner.get("quantize_s")
            row["preprocess_s"] = inner.get("preprocess_s")
            if not inner["ok"]:
                row["error"] = inner.get("error") or _last_error_line(Path(run["stderr"]))
        else:
            row["samples"] = limit
            row["error"] = run["killed"] or _last_error_line(Path(run["stderr"]))
        return self._finish(row, name, output, evaluate_model)

    def qlinear(self, name: str, method: str, data: Path, count: int, tag: str = "",
                evaluate_model: bool = True, report: bool = True, target: str = "onnxruntime") -> dict:
        stem = f"{name}.qlinear.{method}{tag}{'' if report else '.noreport'}{'' if target == 'onnxruntime' else '.' + target}"
        output = self.folder / f"{stem}.onnx"
        command = [sys.executable, "-m", "qlinear", "quantize", str(path(name)), "--dtype", "int8", "--calibrate",
                   str(data), "--method", method, "-o", str(output), "--json", "--no-eval", "--force", "--no-latency",
                   "--target", target]
        if not report:
            command += ["--report-samples", "0"]
        variant = "per channel (always)" + ("" if report else ", no per-layer report") + (
            "" if target == "onnxruntime" else f", --target {target}")
        run = measured(command, self.folder / stem, self.limit, self.args.timeout)
        row = {"tool": "qlinear", "model": name, "method": method, "variant": variant, "samples": count,
               **run}
        if run["killed"] or run["exit"] != 0:
            row["error"] = run["killed"] or _last_error_line(Path(run["stderr"]))
        else:
            try:
                printed = json.loads(Path(run["stdout"]).read_text())
                activations = printed.get("activations", {})
                row["samples"] = activations.get("calibration_samples", count)
                row["pairs"] = activations.get("pairs")
            except (ValueError, OSError) as error:
                row["report_error"] = first_line(error)
        return self._finish(row, name, output, evaluate_model)

    def _finish(self, row: dict, name: str, output: Path, evaluate_model: bool) -> dict:
        """Whether the model was written, its figures (if asked), the log line."""
        row["written"] = "error" not in row and output.exists()
        if row["written"]:
            row["output"] = str(output)
            if evaluate_model:
                row.update(evaluate(name, output))
        self._log(row)
        return row

    def _log(self, row: dict) -> None:
        text = (f"  [{time.strftime('%H:%M:%S')}] {row['tool']:11} {row['model']:7} {row['method']:10} "
                f"{row['variant']:38} n={row.get('samples')}: {row['wall_s']:6.1f} s, "
                f"{row['peak_bytes'] / 1e6:7.0f} MB")
        if "error" in row:
            text += f"; FAILED: {row['error']}"
        elif "figure" in row:
            text += f"; {row['figure']:.4f} (float {row['float']:.4f})"
        elif row.get("loads") is False:
            text += f"; does not load: {row['error']}"
        print(text, file=sys.stderr, flush=True)


def predicted_peak(points: list[tuple[int, int]], count: int) -> float | None:
    """Linear fit of (samples, peak bytes) through the last two points, at ``count``."""
    if len(points) < 2:
        return None
    (n0, p0), (n1, p1) = points[-2], points[-1]
    return p1 + (p1 - p0) / (n1 - n0) * (count - n1)


def ort_histogram_cap(budget: float, rec_points: list[tuple[int, int]], wanted: int) -> int:
    """The most recogniser lines (of ``wanted``, 64, 48, 32, 16) that onnxruntime's Percentile/Entropy
    can calibrate on within ``budget`` bytes, by the measured growth of its memory."""
    for count in (wanted, 64, 48, 32, 16):
        if count > wanted:
            continue
        guess = predicted_peak(rec_points, count)
        if guess is None or guess <= budget:
            return count
    return 16


# ---------------------------------------------------------------------------------------------- printing


def _mb(row: dict) -> str:
    text = f"{row['peak_bytes'] / 1e6:,.0f}"
    return f">{text} (killed)" if row.get("killed") else text


def _figure(row: dict) -> str:
    if "figure" not in row:
        return "-"
    return f"{100 * row['figure']:.2f}%" if row["model"] != "ocr_det" else f"{row['figure']:.3f}"


def _versus(row: dict) -> str:
    if "figure" not in row:
        return "-"
    if row["model"] == "ocr_det":
        return f"map IoU {row['map_iou_vs_float']:.3f}"
    return f"{100 * (row['figure'] - row['float']):+.2f} pt"


def _inputs(row: dict) -> str:
    if "data_inputs" not in row:
        return "-"
    return f"{row['quantized_inputs']}/{row['data_inputs']} ({100 * row['quantized_inputs'] / max(row['data_inputs'], 1):.0f}%)"


def _weights(row: dict) -> str:
    return ", ".join(f"{v} {k}" for k, v in sorted(row.get("weights", {}).items())) or "-"


def _loads(row: dict) -> str:
    def short(text: str) -> str:
        text = text.replace("|", "\\|")
        return text if len(text) <= 140 else text[:137] + "..."

    if not row.get("written"):
        return f"not written: {short(row.get('error', '?'))}"
    if "loads" not in row:
        return "not loaded (timed for its calibration only)"
    if row["loads"]:
        return "yes" if row.get("runs", True) else f"loads, run fails: {short(row['error'])}"
    return f"no: {short(row.get('error', '?'))}"


def print_table(rows: list[dict], floats: dict) -> None:
    print("| tool | model | method | variant | samples | wall s | peak MB | figure | vs float | data inputs quantized "
          "| Conv/Gemm weights | loads in onnxruntime |")
    print("|---|---|---|---|---:|---:|---:|---:|---|---|---|---|")
    for name, f in floats.items():
        shown = f"{100 * f['figure']:.2f}%" if name != "ocr_det" else f"{f['figure']:.3f}"
        print(f"| float | {name} | - | - | - | - | - | {shown} | ({f['figure_name']}) | - | - | yes |")
    for row in rows:
        print(f"| {row['tool']} | {row['model']} | {row['method']} | {row['variant']} | {row.get('samples') or '-'} "
              f"| {row['wall_s']:.1f} | {_mb(row)} | {_figure(row)} | {_versus(row)} | {_inputs(row)} | {_weights(row)} "
              f"| {_loads(row)} |")


def print_times(rows: list[dict], models: list[str]) -> None:
    """Wall time of qlinear's default against onnxruntime's MinMax (its default, per tensor), as ratios."""
    def find(tool, name, method, variant):
        return next((r for r in rows if r["tool"] == tool and r["model"] == name and r["method"] == method
                     and r["variant"] == variant and not r.get("error")), None)

    lines = []
    for name in models:
        ort = find("onnxruntime", name, "MinMax", "per tensor")
        ours = find("qlinear", name, QLINEAR_DEFAULT, "per channel (always)")
        alone = find("qlinear", name, QLINEAR_DEFAULT, "per channel (always), no per-layer report")
        if ort is None or ours is None:
            continue
        cells = [name, f"{ort['wall_s']:.1f}", f"{ours['wall_s']:.1f} ({ours['wall_s'] / ort['wall_s']:.2f}x)"]
        cells.append(f"{alone['wall_s']:.1f} ({alone['wall_s'] / ort['wall_s']:.2f}x)" if alone else "-")
        lines.append("| " + " | ".join(cells) + " |")
    if lines:
        print(f"\n## Calibration time: qlinear --method {QLINEAR_DEFAULT} against onnxruntime MinMax\n")
        print("Wall seconds of the whole tool run (same data, same machine, one after the other); ratio against "
              "onnxruntime's, below 1 is faster.\n")
        print(f"| model | onnxruntime MinMax (per tensor) | qlinear {QLINEAR_DEFAULT} with its per-layer report | "
              f"qlinear {QLINEAR_DEFAULT}, --report-samples 0 |")
        print("|---|---:|---:|---:|")
        print("\n".join(lines))


def best_ort(rows: list[dict], name: str) -> dict | None:
    candidates = [r for r in rows if r["tool"] == "onnxruntime" and r["model"] == name and "figure" in r]
    if not candidates:
        return None
    key = (lambda r: r["map_iou_vs_float"]) if name == "ocr_det" else (lambda r: r["figure"])
    return max(candidates, key=key)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--samples", type=int, default=100, help="calibration lines (classifier, recogniser)")
    parser.add_argument("--pages", type=int, default=8, help="calibration pages (detector)")
    parser.add_argument("--limit-gb", type=float, default=16.0, help="kill a subprocess above this resident memory")
    parser.add_argument("--ort-budget-gb", type=float, default=8.0,
                        help="fewer recogniser lines for onnxruntime's Percentile/Entropy when the measured growth "
                        "predicts more than this (GB) for --samples")
    parser.add_argument("--timeout", type=float, default=900.0, help="kill a subprocess running longer (s)")
    parser.add_argument("--repeats", type=int, default=20, help="timed runs per latency figure")
    parser.add_argument("--quiet-wait", type=float, default=300.0,
                        help="seconds to wait for other busy processes to finish before the latency runs")
    parser.add_argument("--no-scaling", action="store_true", help="skip the memory-scaling runs")
    parser.add_argument("--ort-methods", nargs="+", default=list(ORT_METHODS), choices=ORT_METHODS)
    parser.add_argument("--qlinear-methods", nargs="+", default=list(QLINEAR_METHODS), choices=QLINEAR_METHODS)
    parser.add_argument("--no-preprocess", action="store_true", help="skip onnxruntime's pre-processed variant")
    parser.add_argument("--no-latency", action="store_true", help="skip the latency section")
    parser.add_argument("--folder", type=Path, help="where the data and models go (default: a new folder in /tmp)")
    parser.add_argument("--latency-only", type=Path, metavar="JSON",
                        help="only the latency section, for the models of an earlier run's --json output")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    begun = time.perf_counter()

    import onnx
    import onnxruntime

    import qlinear

    print("```")
    print(subprocess.run("lscpu | head -20", shell=True, capture_output=True, text=True).stdout.rstrip())
    print(f"MemTotal: {Path('/proc/meminfo').read_text().splitlines()[0].split(':')[1].strip()}")
    print(f"python {sys.version.split()[0]}, onnxruntime {onnxruntime.__version__}, onnx {onnx.__version__}, "
          f"numpy {np.__version__}, qlinear {getattr(qlinear, '__version__', '?')}")
    print("```\n")

    if args.latency_only:
        earlier = json.loads(args.latency_only.read_text())
        entries, load = latency_table(earlier["rows"], args.models, args)
        print(f"\nTotal run time of the benchmark: {(time.perf_counter() - begun) / 60:.1f} min")
        if args.json:
            args.json.write_text(json.dumps({"latency": entries, "load": load}, indent=2, default=str))
        return 0

    folder = args.folder or Path(tempfile.mkdtemp(prefix="static_bench_", dir="/tmp"))
    folder.mkdir(parents=True, exist_ok=True)
    bench = Bench(args, folder)
    print(f"work folder {folder}; runner {bench.runner}; subprocess limit {args.limit_gb:g} GiB resident\n",
          file=sys.stderr)

    # Calibration and labelled data, float outputs.
    started = time.perf_counter()
    counts = {"ocr_cls": args.samples, "ocr_rec": args.samples, "ocr_det": args.pages}
    calibration = {name: calibration_data(folder, name, counts[name]) for name in args.models}
    floats = {}
    for name in args.models:
        data = measure_float.data(name)
        out = measure_float.float_outputs(name)
        figures = measure_float.figures(name, out, data)
        key = next(iter(figures))
        floats[name] = {"figure_name": key, "figure": figures[key], "figures": figures}
    print(f"data made and float models run in {time.perf_counter() - started:.1f} s", file=sys.stderr)

    # Memory scaling of onnxruntime's Entropy on the recogniser first: it sizes what the main runs can afford.
    scaling: dict = {"qlinear": [], "onnxruntime": [], "notes": []}
    rec_points: list[tuple[int, int]] = []
    if "ocr_rec" in args.models and not args.no_scaling:
        largest = max(SCALING_SAMPLES)
        source = calibration_data(folder, "ocr_rec", largest)  # the first n lines of these are make_rec_data(n)
        for count in sorted({8, 16, 32, 64, largest}):
            guess = predicted_peak(rec_points, count)
            if guess is not None and guess > 0.8 * bench.limit:
                scaling["notes"].append(f"onnxruntime Entropy on {count} lines not run: a linear fit of the runs "
                                        f"before predicts {guess / 1e9:.1f} GB (above 80% of the "
                                        f"{args.limit_gb:g} GiB limit)")
                scaling["onnxruntime"].append({"samples": count, "predicted_bytes": guess, "run": False})
                continue
            row = bench.ort("ocr_rec", "Entropy", False, source, limit=count, tag=f".scaling{count}",
                            evaluate_model=False)
            entry = {"samples": count, "wall_s": row["wall_s"], "peak_bytes": row["peak_bytes"],
                     "killed": row.get("killed"), "error": row.get("error"), "run": True}
            scaling["onnxruntime"].append(entry)
            if "error" not in row:
                rec_points.append((count, row["peak_bytes"]))
        for count in SCALING_SAMPLES:
            source = calibration_data(folder, "ocr_rec", count)
            row = bench.qlinear("ocr_rec", "entropy", source, count, tag=f".scaling{count}", evaluate_model=False)
            scaling["qlinear"].append({"samples": count, "wall_s": row["wall_s"], "peak_bytes": row["peak_bytes"],
                                       "killed": row.get("killed"), "error": row.get("error"), "run": True})

    # The main runs.
    for name in args.models:
        data = calibration[name]
        for method in args.ort_methods:
            limit = None
            if name == "ocr_rec" and method in HISTOGRAM_METHODS and rec_points:
                cap = ort_histogram_cap(args.ort_budget_gb * 1e9, rec_points, counts[name])
                if cap < counts[name]:
                    limit = cap
                    bench.notes.append(
                        f"onnxruntime {method} on ocr_rec calibrated on the first {cap} of the {counts[name]} lines: "
                        f"by the measured growth of its memory ({_growth(rec_points)}) {counts[name]} lines would "
                        f"need about {predicted_peak(rec_points, counts[name]) / 1e9:.1f} GB, above the "
                        f"{args.ort_budget_gb:g} GB this benchmark allows them (--ort-budget-gb)")
            for per_channel in (False, True):
                row = bench.ort(name, method, per_channel, data, limit=limit)
                bench.rows.append(row)
                if row.get("error") and "inhomogeneous" in row["error"] and name == "ocr_det":
                    # The pages differ in size: onnxruntime stacks every sample's activations of a tensor into
                    # one array for the histogram methods. CalibStridedMinMax=1 feeds it one page at a time.
                    retry = bench.ort(name, method, per_channel, data, extra={"CalibStridedMinMax": 1},
                                      tag=".stride1")
                    bench.rows.append(retry)
            if limit is not None:
                # onnxruntime's own way of bounding the memory: calibrate in strides, merging the histograms.
                stride = max(d for d in range(1, limit + 1) if counts[name] % d == 0)
                row = bench.ort(name, method, False, data, extra={"CalibStridedMinMax": stride}, tag=".strided")
                bench.rows.append(row)
        for per_channel in (False, True) if not args.no_preprocess else ():  # onnxruntime's example: pre-processed first
            bench.rows.append(bench.ort(name, "MinMax", per_channel, data, preprocess=True))
        for method in args.qlinear_methods:
            bench.rows.append(bench.qlinear(name, method, data, counts[name]))
        if QLINEAR_DEFAULT in args.qlinear_methods:  # the calibration alone: what onnxruntime's tool does
            bench.rows.append(bench.qlinear(name, QLINEAR_DEFAULT, data, counts[name], report=False,
                                            evaluate_model=False))
            bench.rows.append(bench.qlinear(name, QLINEAR_DEFAULT, data, counts[name], target="qdq-portable"))

    print("## Static int8 quantization: onnxruntime quantize_static vs qlinear quantize --calibrate\n")
    print(f"Calibration: {args.samples} lines (classifier, recogniser), {args.pages} pages (detector), seed {SEED}; "
          f"evaluation: the corpus' labelled data ({', '.join(f'{n}: {measure_float.data_size(n, measure_float.data(n))}' for n in args.models)}) "
          f"in onnxruntime with basic graph optimizations. wall s and peak MB (10^6 bytes, maximum resident set "
          f"size) from /usr/bin/time -v around the whole tool run (a subprocess each). figure: classifier "
          f"accuracy, recogniser exact match, detector IoU of the map (p > 0.3) against the shrunk ground-truth "
          f"boxes; vs float: points against the float model's figure (classifier, recogniser), map IoU against "
          f"the float model's map (detector). data inputs quantized: Conv/ConvTranspose/MatMul/Gemm data inputs "
          f"read from a DequantizeLinear. onnxruntime: QDQ, activation_type QUInt8, weight_type QInt8, one sample "
          f"per get_next; pre-processed: `quant_pre_process(skip_symbolic_shape=True)` first (symbolic shape "
          f"inference needs sympy, which is not installed), as onnxruntime's example recommends; qlinear: weights "
          f"always int8 per channel, activations uint8. Conv/Gemm weights: how the model stores them.\n")
    print_table(bench.rows, floats)
    failures = [r for r in bench.rows if r.get("error")]
    if bench.notes or failures:
        print()
    for note in bench.notes:
        print(f"- {note}")
    for row in failures:
        print(f"- {row['tool']} {row['model']} {row['method']} ({row['variant']}): {row['error']}")

    print_times(bench.rows, args.models)
    latency_entries = [] if args.no_latency else latency_table(bench.rows, args.models, args)[0]

    if scaling["qlinear"] or scaling["onnxruntime"]:
        print("\n## Memory scaling: entropy calibration of the recogniser (peak RSS of the whole run)\n")
        print("| tool | lines | wall s | peak MB | note |")
        print("|---|---:|---:|---:|---|")
        for tool, entries in (("qlinear --method entropy", scaling["qlinear"]),
                              ("onnxruntime Entropy (per tensor)", scaling["onnxruntime"])):
            for e in entries:
                if not e["run"]:
                    print(f"| {tool} | {e['samples']} | - | ~{e['predicted_bytes'] / 1e6:,.0f} (predicted) | not run |")
                    continue
                note = e.get("killed") or e.get("error") or ""
                print(f"| {tool} | {e['samples']} | {e['wall_s']:.1f} | {e['peak_bytes'] / 1e6:,.0f} | {note} |")
        for tool, entries in (("qlinear", scaling["qlinear"]), ("onnxruntime", scaling["onnxruntime"])):
            done = {e["samples"]: e["peak_bytes"] for e in entries if e["run"] and not e.get("error")}
            if 16 in done and 128 in done:
                print(f"\n{tool}: 128 lines / 16 lines = {done[128] / done[16]:.2f}x the peak memory")
            elif 16 in done and len(done) > 1:
                points = sorted(done.items())
                print(f"\n{tool}: {_growth(points)} measured ({', '.join(f'{n} lines {p / 1e6:,.0f} MB' for n, p in points)})")
        for note in scaling["notes"]:
            print(f"\n- {note}")

    total = time.perf_counter() - begun
    print(f"\nTotal run time of the benchmark: {total / 60:.1f} min (work folder {folder})")
    if args.json:
        args.json.write_text(json.dumps({"rows": bench.rows, "floats": floats, "latency": latency_entries,
                                         "scaling": scaling, "notes": bench.notes, "total_s": total},
                                        indent=2, default=str))
    return 0


def _growth(points: list[tuple[int, int]]) -> str:
    (n0, p0), (n1, p1) = points[-2], points[-1]
    return f"{(p1 - p0) / (n1 - n0) / 1e6:,.0f} MB per extra line"


if __name__ == "__main__":
    sys.exit(main())
