"""Running ONNX models for the report: the task figure of the float and the quantized model on labelled
data, and the check that a model converted to a newer opset still computes what it did.

Models run in onnxruntime with its basic graph optimizations (the ONNX semantics: its default level
fuses DequantizeLinear+MatMul into MatMulNBits, which computes differently), or in `qlinear run` (onnx's
reference evaluator with qlinear's kernels) when onnxruntime is missing or cannot run the model.

Labelled data is a .npz with one array per model input, sample along the first axis, plus ``labels``:

- ``classify`` (the default): the first output's argmax per sample against integer labels;
- ``ctc``: text recognition; the first output (samples, steps, classes) decoded greedily (the best
  class per step, repeats merged, class 0 the blank) with the character list in the model's metadata
  (``character``: one per line; classes 1.. are its characters, and the last class a space when the
  list is one short), against string labels: the share of exact matches;
- ``threshold``: the first output above ``threshold`` against labels of its shape (0/1): the share of
  equal decisions, and the intersection over union of the two models' positive maps.

``recurrent`` pairs (OUTPUT, INPUT) make the samples a sequence: each step feeds the previous step's
OUTPUT to INPUT (a streaming model's state); the npz holds INPUT's first value without a sample axis.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import UserError

TASKS = ("classify", "ctc", "threshold")
BATCH = 32  # samples per run of a batched (non-recurrent) evaluation


@dataclass(frozen=True)
class Task:
    kind: str = "classify"
    threshold: float = 0.5
    recurrent: tuple[tuple[str, str], ...] = ()  # (output, input) pairs


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


class _OnnxRuntime:
    def __init__(self, default_optimizations: bool = False):
        import onnxruntime

        self.onnxruntime = onnxruntime
        self.default_optimizations = default_optimizations
        self.name = f"onnxruntime {onnxruntime.__version__} (basic graph optimizations)"

    def session(self, model):
        """``model``: a Path (external data beside it) or a ModelProto."""
        options = self.onnxruntime.SessionOptions()
        options.log_severity_level = 4  # its errors come back as exceptions, which the report words itself
        if not self.default_optimizations:
            options.graph_optimization_level = self.onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
        source = str(model) if isinstance(model, Path) else model.SerializeToString()
        session = self.onnxruntime.InferenceSession(source, options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        quiet = self.onnxruntime.RunOptions()
        quiet.log_severity_level = 4
        return lambda feeds: session.run(names, feeds, quiet)


class _QlinearRun:
    """`qlinear run`: onnx's reference evaluator with qlinear's kernels for the quantization operators
    (which the reference lacks before opset 19) and its peer fixes."""

    name = "qlinear run (onnx reference evaluator with qlinear's kernels)"

    def session(self, model):
        import qlinear.onnx

        evaluator = qlinear.onnx.evaluator(str(model) if isinstance(model, Path) else model)
        return lambda feeds: list(qlinear.onnx.run(evaluator, feeds).values())


def runtimes() -> list:
    found = []
    try:
        found.append(_OnnxRuntime())
    except ImportError:
        pass
    try:
        import onnx.reference  # noqa: F401

        found.append(_QlinearRun())
    except ImportError:
        pass
    return found


def run_both(first, second, feeds_list: list[dict]):
    """(runtime name, outputs of ``first``, outputs of ``second``) for each feeds of ``feeds_list``, in
    the first runtime that runs both; the failures of the others are in the UserError otherwise."""
    notes = []
    for runtime in runtimes():
        try:
            one, two = runtime.session(first), runtime.session(second)
            return runtime.name, [one(f) for f in feeds_list], [two(f) for f in feeds_list]
        except Exception as error:  # e.g. onnxruntime lacks a kernel for this type: try the next runtime
            notes.append(f"{runtime.name} could not run the model: {_first_line(error)[:160]}")
    raise RuntimeError("; ".join(notes) or "neither onnxruntime nor onnx is importable")


# ----------------------------------------------------------------------------------------------------
# The opset check


def check_conversion(original, converted, feeds: dict) -> dict:
    """Run both models on ``feeds``: the largest difference of any output, and where."""
    runtime, (before,), (after,) = run_both(original, converted, [feeds])
    worst, where, scale = 0.0, "", 0.0
    for index, (a, b) in enumerate(zip(before, after)):
        a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a64.shape != b64.shape:
            return {"runtime": runtime, "max_difference": float("inf"), "output": index, "scale": 0.0}
        if a64.size:
            difference = float(np.max(np.abs(a64 - b64)))
            scale = max(scale, float(np.max(np.abs(a64))))
            if difference > worst:
                worst, where = difference, index
    return {"runtime": runtime, "max_difference": worst, "output": where, "scale": scale}


# ----------------------------------------------------------------------------------------------------
# Task figures


def load_data(path: Path, input_names: list[str], task: Task) -> tuple[dict, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except Exception as error:
        raise UserError(f"--eval {path}: not a readable .npz ({_first_line(error)})") from None
    missing = [n for n in input_names + ["labels"] if n not in arrays]
    if missing:
        raise UserError(f"--eval {path}: needs one array per model input ({', '.join(input_names)}) and 'labels'; "
                        f"missing {', '.join(missing)}")
    labels = arrays["labels"]
    feeds = {n: arrays[n] for n in input_names}
    carried = {i for _, i in task.recurrent}
    counts = {n: len(a) for n, a in feeds.items() if n not in carried and a.ndim}
    if len(set(counts.values())) > 1:
        raise UserError(f"--eval {path}: the inputs have different sample counts ({counts})")
    return feeds, labels


def _samples(feeds: dict, task: Task) -> list[dict]:
    """The feeds of each run: batches of samples, or the steps of a recurrent sequence."""
    carried = {i for _, i in task.recurrent}
    stepped = [n for n, a in feeds.items() if n not in carried]
    count = len(feeds[stepped[0]]) if stepped else 1
    if task.recurrent:
        return [{n: np.asarray(feeds[n][i]) for n in stepped} for i in range(count)]
    return [{n: feeds[n][start:start + BATCH] for n in stepped} for start in range(0, count, BATCH)]


def _run(session, runs: list[dict], feeds: dict, task: Task) -> np.ndarray:
    """The first output of every run, joined along the sample axis."""
    outputs = []
    carried = {i: np.asarray(feeds[i]) for _, i in task.recurrent}
    for run in runs:
        result = session({**run, **carried})
        outputs.append(np.asarray(result[0]))
        for output, name in task.recurrent:
            carried[name] = result[output]
    if task.recurrent:
        return np.stack(outputs)
    return np.concatenate(outputs, axis=0)


def evaluate(original, quantized, data: Path, input_names: list[str], output_names: list[str], task: Task,
             characters: list[str] | None) -> dict:
    """The task figure of both models on the labelled data (see the module's docstring)."""
    feeds, labels = load_data(data, input_names, task)
    task = Task(task.kind, task.threshold, tuple((output_names.index(o) if o in output_names else _bad(o, output_names), i)
                                                 for o, i in task.recurrent))
    runs = _samples(feeds, task)
    notes = []
    for runtime in runtimes():
        try:
            before = _run(runtime.session(original), runs, feeds, task)
            after = _run(runtime.session(quantized), runs, feeds, task)
            break
        except UserError:
            raise
        except Exception as error:
            notes.append(f"{runtime.name} could not run the model: {_first_line(error)[:160]}")
    else:
        return {"accuracy": None, "accuracy_note": "; ".join(notes) or "neither onnxruntime nor onnx is importable"}
    figures = {"data": str(data), "runtime": runtime.name, "task": task.kind}
    figures.update(_score(task, before, after, labels, characters, data))
    figures["max_output_difference"] = float(np.max(np.abs(before.astype(np.float64) - after.astype(np.float64))))
    if isinstance(runtime, _OnnxRuntime):
        # Users run onnxruntime at its default level, which fuses DequantizeLinear+MatMul into
        # MatMulNBits and computes differently (for int2/uint2 weights in onnxruntime 1.32: wrongly).
        try:
            fused = _run(_OnnxRuntime(default_optimizations=True).session(quantized), runs, feeds, task)
            figures["quantized_default_optimizations"] = _score(task, before, fused, labels, characters, data)["quantized"]
            figures["default_optimizations_max_difference"] = float(np.max(np.abs(fused.astype(np.float64) - after.astype(np.float64))))
        except Exception:  # noqa: BLE001 (a second opinion only)
            pass
    return {"accuracy": figures}


def _bad(name, names):
    raise UserError(f"--recurrent: the model has no output {name!r} (its outputs: {', '.join(names)})")


def _score(task: Task, before: np.ndarray, after: np.ndarray, labels: np.ndarray, characters, data) -> dict:
    if task.kind == "classify":
        labels = labels.reshape(-1)
        if len(labels) != len(before):
            raise UserError(f"--eval {data}: {len(labels)} labels for {len(before)} samples")
        first = before.reshape(len(labels), -1).argmax(axis=1)
        second = after.reshape(len(labels), -1).argmax(axis=1)
        return {"samples": int(len(labels)), "float": float(np.mean(first == labels)),
                "quantized": float(np.mean(second == labels)), "agreement": float(np.mean(first == second))}
    if task.kind == "ctc":
        if characters is None:
            raise UserError("--task ctc needs the character list in the model's metadata (key 'character')")
        labels = [str(label) for label in labels.reshape(-1)]
        first = ctc_decode(before, characters)
        second = ctc_decode(after, characters)
        if len(labels) != len(first):
            raise UserError(f"--eval {data}: {len(labels)} labels for {len(first)} samples")
        return {"samples": len(labels), "float": float(np.mean([a.strip() == b.strip() for a, b in zip(first, labels)])),
                "quantized": float(np.mean([a.strip() == b.strip() for a, b in zip(second, labels)])),
                "agreement": float(np.mean([a == b for a, b in zip(first, second)]))}
    positive_before = before > task.threshold
    positive_after = after > task.threshold
    truth = labels.reshape(positive_before.shape) > 0.5 if labels.size == positive_before.size else None
    if truth is None:
        raise UserError(f"--eval {data}: labels of {labels.size} values for outputs of {positive_before.size}")
    union = np.count_nonzero(positive_before | positive_after)
    return {"samples": int(len(before)), "float": float(np.mean(positive_before == truth)),
            "quantized": float(np.mean(positive_after == truth)),
            "agreement": float(np.mean(positive_before == positive_after)),
            "iou": float(np.count_nonzero(positive_before & positive_after) / union) if union else 1.0,
            "threshold": task.threshold}


def ctc_decode(probabilities: np.ndarray, characters: list[str]) -> list[str]:
    """Greedy CTC: the best class per step, repeats merged, the blank (class 0) dropped."""
    classes = probabilities.shape[-1]
    table = [""] + list(characters)
    if len(table) == classes - 1:
        table.append(" ")
    if len(table) != classes:
        raise UserError(f"--task ctc: the model has {classes} classes and its character list {len(characters)} "
                        f"characters (expected {classes - 1} or {classes - 2})")
    best = probabilities.argmax(axis=-1)
    texts = []
    for row in best.reshape(-1, best.shape[-1]):
        keep = np.ones(len(row), bool)
        keep[1:] = row[1:] != row[:-1]
        texts.append("".join(table[i] for i in row[keep] if i != 0))
    return texts
