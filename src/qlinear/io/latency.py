"""What a static quantization buys in speed: the float and the quantized model's latency in onnxruntime, the
runtime people deploy them in, and which nodes onnxruntime runs on the codes and which in float.

Both models run with onnxruntime's default graph optimizations (the fusions that turn QDQ pairs into int8
kernels), on 1 and on 2 intra-op threads, on a batch taken from the calibration data (up to `BATCH` samples of
its first file where the model's batch axis is free; the first sample where it is fixed). The two models take
turns, each run timed on its own; a figure is the median of at least `MIN_RUNS` and at most `MAX_RUNS` runs,
as many as fit in `BUDGET_S` seconds per model and thread count, after warm-up runs.

On more than one thread only one session exists at a time: the models take turns in rounds of `ROUND_RUNS`
runs, each round in a session of its own. Onnxruntime's intra-op workers spin while they wait for work, and an
idle session's workers compete with the timed one's: with both 2-thread sessions alive, a classifier that takes
4.8 ms alone took 8-17 ms (2 vCPUs, 2026-12-04). A new thread pool's placement also varies (some pools ran
1.7x slower for their whole life), so each round's new session draws it again.

Which nodes ran in int8 is read off the graph onnxruntime optimized (``SessionOptions.optimized_model_filepath``):
a node computes on the codes when it is one of onnxruntime's int8 kernels (QLinearConv, QLinearAdd, QGemm, ...)
or when it only moves values and reads the codes (a MaxPool, Resize or Transpose after a QuantizeLinear or an
int8 kernel); every other node that reads float values computes in float, and each QuantizeLinear and
DequantizeLinear left is a conversion at the edge of a float island.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

BATCH = 8  # samples per timed run, where the model's batch axis is free
MIN_RUNS, MAX_RUNS = 5, 20
BUDGET_S = 1.5  # seconds of timed runs per model and thread count
ROUND_RUNS = 5  # timed runs of one model per session on more than one thread
WARM_UP = 2  # untimed runs of a new session: its allocations, the thread pool, first-run kernel choices
THREADS = (1, 2)
INT8_KERNELS = frozenset({"QLinearConv", "QLinearMatMul", "QLinearAdd", "QLinearMul", "QLinearSigmoid",
                          "QLinearLeakyRelu", "QLinearSoftmax", "QLinearConcat", "QLinearGlobalAveragePool",
                          "QLinearAveragePool", "QLinearReduceMean", "QLinearWhere", "QGemm", "MatMulInteger",
                          "ConvInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "QAttention",
                          "QLinearConvTranspose"})
CONVERSIONS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})
# Operators that only move values: on the codes when what they read is.
MOVES = frozenset({"MaxPool", "Resize", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Slice",
                   "Gather", "Split", "Concat", "Pad", "DepthToSpace", "SpaceToDepth", "Expand", "Tile", "Identity"})


def _batch_axis_free(model_proto, name: str) -> bool:
    for value in model_proto.graph.input:
        if value.name == name:
            dims = value.type.tensor_type.shape.dim
            return not dims or not dims[0].HasField("dim_value") or dims[0].dim_value <= 0  # Paddle writes -1
    return True


def batch_from(data, model_proto) -> dict:
    """The latency feeds: the first ``BATCH`` samples of the calibration data's first file where every input's
    batch axis is free, else its first sample."""
    from .activation_calibration import NpzReader

    reader = NpzReader(data.files[0])
    try:
        entries = {e.name: e for e in reader.entries}
        arrays = {name: reader.array(entries[name]) for name in data.inputs}
        count = min(len(a) for a in arrays.values())
        take = min(BATCH, count) if all(_batch_axis_free(model_proto, name) for name in data.inputs) else 1
        return {name: np.ascontiguousarray(array[:take]) for name, array in arrays.items()}
    finally:
        reader.close()


def session(model, threads: int, optimized: Path | None = None):
    """An onnxruntime CPU session of ``model`` (a Path or a ModelProto) as deployed: its default graph
    optimizations, ``threads`` intra-op threads; ``optimized``: where it writes the graph it optimized."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    if optimized is not None:
        options.optimized_model_filepath = str(optimized)
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def cpu() -> dict:
    """The CPU the figures were measured on: its model name and whether it has VNNI (onnxruntime's u8s8
    kernels add the products exactly with VPDPBUSD; without VNNI, VPMADDUBSW saturates pairs of them in int16)."""
    from ..kernels._vector_width import host_has

    name = ""
    try:
        with open("/proc/cpuinfo") as info:
            name = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "")
    except OSError:
        import platform

        name = platform.processor()
    return {"model": name, "vnni": host_has("avx512vnni") or host_has("avxvnni")}


def measure(float_model, quantized_model, feeds: dict) -> dict:
    """Median milliseconds of each model on 1 and 2 threads, and their ratio (quantized / float)."""
    import onnxruntime as ort

    result = {"runtime": f"onnxruntime {ort.__version__} (default graph optimizations)", "cpu": cpu(),
              "batch": {name: list(array.shape) for name, array in feeds.items()}, "threads": {}}
    for threads in THREADS:
        times = timed_in_turns([float_model, quantized_model], feeds, threads, MIN_RUNS, MAX_RUNS, 2 * BUDGET_S)
        float_ms, quantized_ms = (1e3 * statistics.median(t) for t in times)
        result["threads"][str(threads)] = {"float_ms": float_ms, "quantized_ms": quantized_ms,
                                           "ratio": quantized_ms / float_ms, "runs": len(times[1])}
    return result


def timed_in_turns(models: list, feeds: dict, threads: int, min_runs: int, max_runs: int,
                   budget_s: float) -> list[list[float]]:
    """Seconds of each run of each model (Paths or ModelProtos), the models taking turns: at least
    ``min_runs`` runs each, then more while ``budget_s`` lasts, up to ``max_runs``. On 1 thread every session
    stays open and the turns are single runs; on more, only one session exists at a time (module docstring)."""
    times: list[list[float]] = [[] for _ in models]
    started = time.perf_counter()

    def more() -> bool:
        done = min(len(t) for t in times)
        return done < max_runs and (done < min_runs or time.perf_counter() - started < budget_s)

    def run(made, kept: list[float], count: int) -> None:
        for _ in range(count):
            t0 = time.perf_counter()
            made.run(None, feeds)
            kept.append(time.perf_counter() - t0)

    if threads == 1:
        sessions = [session(m, threads) for m in models]
        for made in sessions:
            run(made, [], WARM_UP)
        while more():
            for made, kept in zip(sessions, times):
                run(made, kept, 1)
        return times
    while more():
        for model, kept in zip(models, times):
            made = session(model, threads)
            run(made, [], WARM_UP)
            run(made, kept, min(ROUND_RUNS, max_runs - len(kept)))
            del made  # its workers stop before the next session's runs
    return times


def optimized_nodes(quantized_model) -> dict:
    """Which nodes of onnxruntime's optimized graph (1 thread) run on the codes, which in float, and how many
    conversions are left."""
    import onnx

    with tempfile.TemporaryDirectory(prefix="qlinear_optimized_") as folder:
        path = Path(folder) / "optimized.onnx"
        session(quantized_model, 1, path)
        graph = onnx.load(str(path), load_external_data=False).graph
    return classify(graph)


_FLOAT_TYPES = {1, 10, 11, 16}  # TensorProto FLOAT, FLOAT16, DOUBLE, BFLOAT16
_CODE_TYPES = {2, 3, 4, 5, 17, 18, 19, 20, 21, 22, 23, 25, 26}  # 8/16/4/2-bit integers and small floats
_TO_FLOAT = frozenset({"DequantizeLinear", "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "GatherBlockQuantized"})
_TO_OTHER = frozenset({"Shape", "Size", "NonZero", "ArgMax", "ArgMin", "Equal", "Less", "Greater", "Not"})


def _kinds(graph) -> dict[str, str]:
    """What each tensor of onnxruntime's optimized graph holds: "codes", "float" or "other" (shapes, indices),
    by propagation from the inputs and initializers (its value_info is partial)."""
    kind = {}
    for tensor in list(graph.initializer):
        kind[tensor.name] = "float" if tensor.data_type in _FLOAT_TYPES else "codes" if tensor.data_type in (2, 3) else "other"
    for value in graph.input:
        if value.name not in kind:
            elem = value.type.tensor_type.elem_type
            kind[value.name] = "float" if elem in _FLOAT_TYPES else "other"
    for node in graph.node:
        op, first = node.op_type, kind.get(node.input[0], "other") if node.input and node.input[0] else "other"
        if op == "QuantizeLinear" or op in INT8_KERNELS and op not in _TO_FLOAT:
            out = "codes"
        elif op in _TO_FLOAT:
            out = "float"
        elif op in _TO_OTHER:
            out = "other"
        elif op == "Cast":
            to = next((a.i for a in node.attribute if a.name == "to"), 0)
            out = "float" if to in _FLOAT_TYPES else "codes" if to in (2, 3) else "other"
        elif op == "Constant":
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            out = "float" if value is not None and value.data_type in _FLOAT_TYPES else "other"
        elif op in MOVES:
            out = first
        else:
            out = "float" if any(kind.get(i) == "float" for i in node.input if i) else first
        for name in node.output:
            if name:
                kind[name] = out
    return kind


def classify(graph) -> dict:
    """``graph``: onnxruntime's optimized graph. Counts by operator type of the nodes that run on the codes (its
    int8 kernels, and value-moving nodes that read codes), of the nodes that compute in float (with their
    names), and of the conversions left."""
    kind = _kinds(graph)
    int8: dict[str, int] = {}
    floating: dict[str, int] = {}
    float_names: list[str] = []
    conversions: dict[str, int] = {}
    for node in graph.node:
        op = node.op_type
        first = kind.get(node.input[0]) if node.input and node.input[0] else None
        if op in CONVERSIONS:
            conversions[op] = conversions.get(op, 0) + 1
        elif op in INT8_KERNELS or (op in MOVES and first == "codes"):
            int8[op] = int8.get(op, 0) + 1
        elif any(kind.get(i) == "float" for i in node.input if i) and op != "Shape":
            floating[op] = floating.get(op, 0) + 1
            float_names.append(node.name or node.output[0])
    return {"int8": dict(sorted(int8.items())), "float": dict(sorted(floating.items())),
            "float_nodes": float_names, "conversions": dict(sorted(conversions.items()))}
