"""Empirical bias correction: the quantized model's layers shifted back to the float model's mean, layer by layer.

Quantization errors are not zero-mean per channel: a channel whose values sit near one level rounds the same way
everywhere, and a layer's int8 weights shift its outputs' mean. The network carries such shifts on and, through
its nonlinearities, makes more of them. In the PP-OCR recogniser (per-tensor uint8 activations) the channel means
of the convolutions' outputs hold 10-30% of their error power, and which way they lean depends on the calibration
set: one set's model matched float's text on 70% of held-out lines, another's on 88%.

The correction (Nagel et al. 2019, "Data-Free Quantization Through Weight Equalization and Bias Correction",
section 4.2, its empirical form): for each Conv, ConvTranspose and Gemm with a constant bias, in graph order, the
per-output-channel mean of (float output - quantized output) over the calibration samples is added to its bias;
each layer is measured with the corrections before it in place, since they change what it receives. An int32 bias
moves by whole steps of its own scale (x_scale * w_scale), so the stored codes stay exact integers of the same
scale; a float bias (a layer kept float) moves by the mean itself.

The quantized model runs once per sample in all, not once per layer: it is cut into one segment per layer
(`activation_calibration.Segments`), each ending at the layer's output before an ``Add`` of a delta model input
that the next segment runs; every sample's run waits at each cut until all samples' means are in and the delta
is set.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np

from . import report
from .formats.onnx_constants import producers_of, readers_of, stored_constants

LAYERS = ("Conv", "ConvTranspose", "Gemm")
DELTA = "__qlinear_bias_delta"
SAMPLES = 16  # calibration samples the output means are measured on, at most (fewer where their waiting runs
# would hold more than `HELD_BYTES`)


@dataclass
class Layer:
    node: object  # the NodeProto in the quantized model
    output: str  # its output there
    reference: str  # the same tensor's name in the float model
    bias: object  # the TensorProto stored: int32 codes, or the float bias itself
    scale: np.ndarray | None  # the int32 bias's scale per channel; None for a float bias
    rank: int  # the output's rank (the channels are axis 1)
    dtype: np.dtype  # the output's element type: the float bias's, or the int32 bias scale's

    @property
    def delta_shape(self) -> list[int]:
        return [self.bias.dims[0]] + [1] * (self.rank - 2)


def layers(quantized, reference) -> list[Layer]:
    """The layers of ``quantized`` (a QDQ ModelProto) whose bias this can move: a Conv, ConvTranspose or Gemm whose
    bias is a constant (int32 codes through a DequantizeLinear, or float) read by it alone, whose output the float
    model ``reference`` computes too (under its own name, or the name its pair's DequantizeLinear writes)."""
    from onnx import helper, numpy_helper

    graph = quantized.graph
    constants = {name: t for name, t in stored_constants(graph).items() if t is not None}
    producers, readers = producers_of(graph), readers_of(graph)
    made_by = {o: node.op_type for node in reference.graph.node for o in node.output if o}
    found = []
    for node in graph.node:
        if node.op_type not in LAYERS or len(node.input) < 3 or not node.input[2]:
            continue
        output = node.output[0]
        name = output
        if made_by.get(name) != node.op_type:  # a pair's producer writes T_float; the DequantizeLinear, T
            after = [r for r in readers.get(output, ()) if r.op_type == "QuantizeLinear"]
            codes = [d for q in after for d in readers.get(q.output[0], ()) if d.op_type == "DequantizeLinear"]
            name = next((d.output[0] for d in codes if made_by.get(d.output[0]) == node.op_type), None)
        if name is None:
            continue
        bias_name, scale = node.input[2], None
        if len(readers.get(bias_name, ())) != 1:
            continue
        dequantize = producers.get(bias_name)
        if dequantize is not None and dequantize.op_type == "DequantizeLinear":
            stored, scale_tensor = constants.get(dequantize.input[0]), constants.get(dequantize.input[1])
            if stored is None or scale_tensor is None or len(readers.get(dequantize.input[0], ())) != 1:
                continue
            scale = numpy_helper.to_array(scale_tensor)
            dtype, scale = scale.dtype, scale.astype(np.float64)
        else:
            stored = constants.get(bias_name)
            dtype = None if stored is None else helper.tensor_dtype_to_np_dtype(stored.data_type)
        if stored is None or len(stored.dims) != 1 or stored.dims[0] == 0:
            continue
        rank = 2 if node.op_type == "Gemm" else _weight_rank(node.input[1], constants, producers)
        if rank is None:
            continue
        found.append(Layer(node, output, name, stored, scale, rank, np.dtype(dtype)))
    return found


def _weight_rank(name: str, constants: dict, producers: dict) -> int | None:
    while name not in constants:  # through the weight's DequantizeLinear (or a Reshape of a blocked one: give up)
        node = producers.get(name)
        if node is None or node.op_type != "DequantizeLinear":
            return None
        name = node.input[0]
    return len(constants[name].dims) or None


def _delta(i: int) -> str:
    return f"{DELTA}{i}"


def _raw(layer: Layer) -> str:
    return f"{layer.output}{DELTA}_raw"


def _with_deltas(quantized, found: list[Layer]):
    """A copy of ``quantized`` where each layer writes `_raw` and ``Add(raw, delta input)`` writes its output."""
    from onnx import helper

    model = type(quantized)()
    model.CopyFrom(quantized)
    graph = model.graph
    by_output = {layer.output: (i, layer) for i, layer in enumerate(found)}
    nodes = []
    for node in graph.node:
        nodes.append(node)
        if node.op_type in LAYERS and node.output and node.output[0] in by_output:
            i, layer = by_output[node.output[0]]
            node.output[0] = _raw(layer)
            nodes.append(helper.make_node("Add", [_raw(layer), _delta(i)], [layer.output]))
            graph.input.append(helper.make_tensor_value_info(_delta(i), helper.np_dtype_to_tensor_dtype(layer.dtype),
                                                             layer.delta_shape))
    del graph.node[:]
    graph.node.extend(nodes)
    return model


def _channel_sum(values: np.ndarray) -> tuple[np.ndarray, int]:
    values = np.asarray(values, np.float64)
    axes = tuple(a for a in range(values.ndim) if a != 1)
    return values.sum(axis=axes), values.size // values.shape[1]


# What the waiting runs may hold at once, all samples together, by shape inference (4 bytes a value). The peak
# memory grows faster than that estimate: on the detector, +32 MB for 3 pages but +600 MB for 12 (about 30 MB
# estimated per page); this budget keeps it to about 4 pages.
HELD_BYTES = 128 << 20


def correct(quantized, reference, samples: list[dict], found: list[Layer], progress=None,
            folders=(None, None)) -> tuple[list[dict], int]:
    """Move the biases of ``found`` (`layers` of ``quantized``, a ModelProto changed in place) so that each
    layer's per-channel output mean over ``samples`` (feeds dicts; the first ones whose waiting runs hold at most
    `HELD_BYTES`, at least one) is the float model ``reference``'s. Returns one row per layer moved (the node,
    the mean |shift| and the largest, in the output's units) and the number of samples used. ``folders``: where
    the reference's and the quantized model's external data files are, if they have any (a moved bias is stored
    in the model itself)."""
    from onnx import numpy_helper

    from .activation_calibration import Segments, sizes

    if not found or not samples:
        return [], len(samples)
    deltas = {_delta(i): np.zeros(layer.delta_shape, layer.dtype) for i, layer in enumerate(found)}
    raws = [_raw(layer) for layer in found]
    # One segment per layer, ending at its output before the delta's Add, which the next segment runs: each
    # sample's run stops there until every sample's mean is in and the delta is set (in place: the runs hold
    # these very arrays). The model runs once per sample in all, rather than once per layer; each waiting run
    # holds what later segments read (a detector page's skip connections: about 50 MB).
    model = _with_deltas(quantized, found)
    segments = Segments(model, raws, {**samples[0], **deltas}, cut=[[raw] for raw in raws], folder=folders[1])
    held = [set(carried) | set(exposed) for carried, (_, exposed) in zip(segments.carried, segments.segments)]
    size = sizes(model, sorted(set().union(*held)), {**samples[0], **deltas})
    per_sample = max((sum(size[name] or 0 for name in names) for names in held), default=0) + sum(
        np.asarray(value).nbytes for value in samples[0].values())
    samples = samples[:max(1, min(len(samples), HELD_BYTES // max(per_sample, 1)))]
    names = list(dict.fromkeys(layer.reference for layer in found))
    target = _channel_means(Segments(reference, names, samples[0], folder=folders[0]), samples)
    runs = [_pulled(segments({**feeds, **deltas})) for feeds in samples]
    rows, moves = [], []
    for i, layer in enumerate(found):
        total, count = 0.0, 0
        for run in runs:
            part, n = _channel_sum(run(raws[i]))
            total, count = total + part, count + n
        if progress is not None:
            progress(1)
        shift = target[layer.reference] - total / count
        if shift.shape != (layer.bias.dims[0],) or not np.all(np.isfinite(shift)):
            continue
        stored = numpy_helper.to_array(layer.bias, base_dir=str(folders[1] or ""))
        if layer.scale is None:
            moved = (stored.astype(np.float64) + shift).astype(stored.dtype)
            applied = moved.astype(np.float64) - stored
        else:
            steps = np.rint(shift / layer.scale)
            if not np.all(np.isfinite(steps)):
                continue
            moved = stored.astype(np.int64) + steps.astype(np.int64)
            if np.any(np.abs(moved) > 2**31 - 1):
                continue
            moved = moved.astype(stored.dtype)
            applied = steps * layer.scale
        moves.append((layer, moved))
        deltas[_delta(i)][...] = applied.astype(layer.dtype).reshape(layer.delta_shape)
        rows.append({"node": layer.node.name or layer.output, "mean_abs_shift": float(np.mean(np.abs(applied))),
                     "max_abs_shift": float(np.max(np.abs(applied)))})
    for layer, moved in moves:  # the runs read the deltas, not these: written at the end, all or none
        layer.bias.CopyFrom(numpy_helper.from_array(moved, layer.bias.name))
    return rows, len(samples)


def _channel_means(segments, samples: list[dict]) -> dict[str, np.ndarray]:
    sums: dict = {}
    counts: dict = {}
    for feeds in samples:
        for part in segments(feeds):
            for name, values in part.items():
                total, count = _channel_sum(values)
                sums[name] = sums.get(name, 0.0) + total
                counts[name] = counts.get(name, 0) + count
    return {name: sums[name] / counts[name] for name in sums}


def _pulled(generator):
    """``take(name)``: the next segments of ``generator`` (a `Segments` run) run until one gives ``name``."""
    waiting: dict = {}

    def take(name):
        while name not in waiting:
            waiting.update(next(generator))
        return waiting.pop(name)

    return take


def weights_only_default(settings) -> str | None:
    """Why the biases are not corrected by default after weights-only quantization to ``settings``' type (None:
    they are). Not for the MX formats (power-of-two block scales): the recogniser at mxfp4 (gptq, 100 lines)
    read 96.67% of the lines with the biases as quantized and 78.67% corrected (its spaces between words
    lost), at mxfp8_e4m3 94.00% and 89.33%; NVFP4 (e4m3 block scales) gains (87.33% -> 92.67%, and on
    held-out lines too), as int4 does (BENCHMARKS.md)."""
    if settings.mx is not None and settings.mx.name != "nvfp4":
        return (f"not by default for {settings.mx.name}: it measured worse there (BENCHMARKS.md); "
                f"--bias-correction runs it")
    return None


def corrected(quantized, reference, data, folders=(None, None)) -> dict:
    """`correct` of the written model ``quantized`` against the float model ``reference`` on the first `SAMPLES`
    samples of ``data`` (an iterable of feeds dicts); the report's entry: the layers moved, or why none was.
    ``folders``: where each model's external data files are (the quantized one's written so far). A model whose
    weights onnxruntime cannot dequantize (the microscaling formats) runs as `onnx_dequantized.folded` computes
    it, and its float biases move in the model written."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return {"note": "onnxruntime is not installed (pip install onnxruntime)"}
    start = time.perf_counter()
    samples = list(itertools.islice(data, SAMPLES))
    found = layers(quantized, reference)
    entry = {}
    with report.progress(len(found), "correcting the biases", unit="layers") as advance:
        try:
            moved, used = correct(quantized, reference, samples, found, advance, folders)
        except Exception as error:  # noqa: BLE001 (onnxruntime's: an operator or type it lacks; nothing moved)
            failed = f"onnxruntime cannot run the quantized model ({str(error).splitlines()[0][:200]})"
            try:
                moved, used = _corrected_dequantized(quantized, reference, samples, advance, folders)
            except Exception:  # noqa: BLE001 (not for the weights' DequantizeLinear, then: nothing moved)
                return {"note": failed}
            entry["note"] = "run with the weights' DequantizeLinear computed by qlinear (onnxruntime cannot run them)"
    return {"samples": used, "layers": moved, "seconds": round(time.perf_counter() - start, 2), **entry}


def _corrected_dequantized(quantized, reference, samples: list[dict], progress, folders) -> tuple[list[dict], int]:
    """`correct` run on `onnx_dequantized.folded` of ``quantized``: the same outputs, the weights computed by
    qlinear. The float biases moved there are copied into ``quantized`` under their names."""
    import tempfile
    import uuid
    from pathlib import Path

    from .formats import onnx_dequantized

    # The dequantized tensors go to a data file (the copy would hold the float model's weights otherwise), beside
    # the quantized model's own data file if it has one, else in a folder of their own; removed afterwards.
    with tempfile.TemporaryDirectory(prefix="qlinear_dequantized_") as scratch:
        folder = Path(folders[1]) if folders[1] is not None else Path(scratch)
        data = folder / f"qlinear_dequantized_{uuid.uuid4().hex}.data"
        try:
            run_on = onnx_dequantized.folded(quantized, folders[1], data)
            stored = stored_constants(quantized.graph)
            found = [layer for layer in layers(run_on, reference)
                     if layer.scale is None and stored.get(layer.bias.name) is not None]
            moved, used = correct(run_on, reference, samples, found, progress, (folders[0], folder))
        finally:
            data.unlink(missing_ok=True)
    for layer in found:
        stored[layer.bias.name].CopyFrom(layer.bias)
    return moved, used
