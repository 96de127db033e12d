"""Static quantization of an ONNX model: the activations, calibrated on the user's sample inputs, on top of
the weights (`pipeline.quantize_onnx` runs these steps when ``--calibrate`` is given):

1. `plan`: which activations get a QuantizeLinear -> DequantizeLinear pair, for the target runtime
   (`placement`);
2. `calibrate`: the float model runs once over the samples with those tensors exposed, each feeding a
   streaming observer; each tensor's range by the chosen method becomes a scale and zero point;
3. `write_biases`, `write_operands` and `write_activations`: int32 biases (scale x_scale * w_scale) where both
   the input and the weight are quantized, the constant operands of Add/Mul that the target runs in int8, then
   the pairs;
3b. `correct_biases`: each layer's bias moved so that its outputs' per-channel mean is float's
   (`bias_correction`);
4. `per_layer`: the float and the quantized model run side by side on some samples, every quantized
   activation's SQNR and the outputs' (the report, worst first).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import calibrate as calibrate_math
from .. import dtypes
from ..granularity import Granularity
from ..ops.quantize_linear import dequantize_linear, quantize_linear
from . import activation_calibration, placement, report
from .activation_calibration import CalibrationData
from .errors import UserError
from .formats import onnx_activations
from .plan import Choice, Quantized, Stats, min_opset

METHODS = ("minmax", "percentile", "entropy", "mse")
# Finite values this large are sentinels, not signal: the float minimum (-3.4e38) that an exported transformer's
# attention mask adds to the scores of padding, so that Softmax gives them 0. A range that holds one quantizes
# everything else to a single level (paraphrase-MiniLM-L3: retrieval 0.98 -> 0.26); such a tensor stays float.
SENTINEL = 1e30


@dataclass(frozen=True)
class StaticSettings:
    """What `qlinear quantize --calibrate` asks for."""

    calibration: tuple[Path, ...]
    method: str = "mse"  # measured best on the corpus (benchmarks/static.py, BENCHMARKS.md)
    activation_type: object = None  # an ElementType; None: uint8
    symmetric: bool = False
    keep_float: tuple[str, ...] = ()
    report_samples: int | None = None  # samples the per-layer SQNR is measured on (None: `report_count`)
    max_drop: float | None = None  # points of the task figure: keep the costliest layers float until within
    target: str = placement.DEFAULT_TARGET  # the runtime the pairs are placed for (`placement.TARGETS`)
    latency: bool = True  # measure the float and the quantized model in onnxruntime (`latency`)
    bias_correction: bool = True  # move the biases to the float model's output means (`bias_correction`)
    # Calibration results by tensor name, shared by the runs of a --max-drop search (which only drop tensors).
    cache: dict = field(default_factory=dict, compare=False, hash=False)
    # Tensor name -> the outputs' SQNR with only that tensor quantized (`sensitivity`): --max-drop's order.
    sensitivity: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def qtype(self):
        return self.activation_type or dtypes.get("uint8")


@dataclass
class Plan:
    placed: placement.Placement
    data: CalibrationData
    parameters: dict = field(default_factory=dict)  # name -> (scale, zero point or None)
    ranges: dict = field(default_factory=dict)  # name -> (low, high)
    observed: dict = field(default_factory=dict)  # name -> (min, max)
    notes: list[str] = field(default_factory=list)
    folding: dict = field(default_factory=dict)  # what was folded into the convolutions first
    float_model: object = None  # the float ModelProto as quantized (opset raised, folded): the per-layer reference
    real_channels: dict = field(default_factory=dict)  # tensor -> its channels before zero ones were added to it
    tiled: set = field(default_factory=set)  # gates repeated over their maps for onnxruntime (`broadcast_gates`)

    @property
    def activations(self) -> list[placement.Activation]:
        return self.placed.activations

    @property
    def skipped(self) -> list[placement.Skipped]:
        return self.placed.skipped


def open_data(static: StaticSettings, input_names: list[str]) -> CalibrationData:
    return CalibrationData.open(list(static.calibration), input_names)


def first_sample(data: CalibrationData) -> dict:
    return next(iter(data))


def needed_opset(static: StaticSettings) -> int:
    return min_opset(static.qtype, "tensor")


def plan(model, static: StaticSettings, data: CalibrationData, float_weights=()) -> Plan:
    """Where the pairs go for ``static.target``; ``float_weights``: the weights that stay float."""
    placed = placement.place(model.model, static.target, static.keep_float, float_weights, model.constant_values())
    if not placed.activations:
        raise UserError("no activation feeds a Conv, ConvTranspose, MatMul or Gemm in the main graph: nothing to "
                        "calibrate (weight-only quantization needs no --calibrate)")
    return Plan(placed, data)


def calibrate(plan_: Plan, model_ref, static: StaticSettings, progress=None, also=None, folder=None) -> bool:
    """Observe every planned activation over the calibration data; fill ``plan_.parameters``. ``also`` and
    ``folder`` as `activation_calibration.collect` takes them; returns whether the samples were run (not all
    cached)."""
    names = [a.name for a in plan_.activations if a.tie is None]
    missing = [name for name in names if name not in static.cache]
    if missing:
        static.cache.update(activation_calibration.collect(model_ref, missing, plan_.data, progress, also=also,
                                                           folder=folder))
    observers = {name: static.cache[name] for name in names}
    qtype = static.qtype
    found = activation_calibration.ranges(observers, static.method)
    for name, observer in observers.items():
        if isinstance(found[name], ValueError):
            raise UserError(f"activation {name!r}: {found[name]}")
        low, high = found[name]
        scale, zero_point = calibrate_math.parameters(np.float64(min(low, 0.0)), np.float64(max(high, 0.0)), qtype,
                                                      static.symmetric or not qtype.is_integer)
        plan_.parameters[name] = (np.float32(scale), zero_point.astype(qtype.dtype) if qtype.is_integer else None)
        plan_.ranges[name] = (float(low), float(high))
        plan_.observed[name] = (float(observer.min), float(observer.max))
    for activation in plan_.activations:  # a value-moving operator's output shares its input's parameters
        if activation.tie is not None:
            for key in ("parameters", "ranges", "observed"):
                getattr(plan_, key)[activation.name] = getattr(plan_, key)[activation.tie]
    return bool(missing)


def sentinel_holders(plan_: Plan, model) -> dict[str, tuple[str, str]]:
    """Node key -> (the tensor, why it stays float): the producers of the calibrated tensors that held a value of magnitude
    `SENTINEL` or more (the readers, for a model input), so that a re-placement with them kept float leaves
    those tensors float."""
    from .placement.graph import node_key, readers_of

    graph = model.graph
    producers = {o: node for node in graph.node for o in node.output if o}
    readers = None
    found: dict[str, tuple[str, str]] = {}
    for name, (low, high) in plan_.observed.items():
        if max(abs(low), abs(high)) < SENTINEL:
            continue
        why = (f"{name!r} holds {low if abs(low) >= SENTINEL else high:.3g} (a sentinel such as an attention "
               f"mask's float minimum): no quantized range can hold it and the rest, so it stays float")
        if name in producers:
            found.setdefault(node_key(producers[name]), (name, why))
            continue
        readers = readers if readers is not None else readers_of(graph)
        for node in readers.get(name, ()):
            found.setdefault(node_key(node), (name, why))
    return found


def write_biases(model, writer, plan_: Plan, weight_scales: dict[str, np.ndarray]) -> list[dict]:
    """int32 biases for the Conv/ConvTranspose/Gemm nodes whose input and weight are both quantized; the
    report rows (quantized, or kept with the reason)."""
    int32 = dtypes.get("int32")
    main = {f.name: f for f in model.found if not f.in_subgraph}
    plans = onnx_activations.bias_plans(model.model, plan_.parameters, weight_scales, main)
    rows = []
    for entry in plans:
        found = main[entry["bias"]]
        bias = np.asarray(model.array(found), np.float64)
        result = onnx_activations.int32_bias(bias, entry["x_scale"], entry["w_scale"], found.name)
        if isinstance(result, str):
            rows.append(report.copied_row(found, f"bias kept float: {result}"))
            continue
        values, scale = result
        gran = Granularity("axis", tuple(found.shape), 0) if scale.ndim and found.shape else Granularity("tensor", found.shape)
        sink, finish = writer.sink(found, int32)
        sink(values)
        after = writer.replace(found, finish(), scale, np.zeros(scale.shape, np.int32), gran, int32)
        restored = values.astype(np.float64) * scale.astype(np.float64)
        error = np.abs(restored - bias)
        stats = Stats(signal=float(np.sum(bias * bias)), noise=float(np.sum(error * error)),
                             max_abs_error=float(np.max(error)) if error.size else 0.0)
        choice = Choice(found, gran, f"bias of {entry['node'].op_type} {entry['node'].name!r}: int32, scale "
                                            f"x_scale * w_scale", True)
        rows.append(report.quantized_row(choice, int32, after, Quantized(scale, np.zeros(scale.shape, np.int32),
                                                                                 stats)))
    return rows


def write_operands(model, plan_: Plan, static: StaticSettings, taken: set[str]) -> list[dict]:
    """The constant operands of the Add/Mul nodes the target runs in int8, each quantized per tensor to the
    activation type (its min/max with zero, as an activation's range) into a new DequantizeLinear that its node
    reads; the report's rows."""
    from .formats.onnx_model import _unique

    qtype, values_of = static.qtype, model.constant_values()
    rows = []
    for operand in plan_.placed.operands:
        values = values_of(operand.name)
        if values is None:
            raise UserError(f"operand {operand.name!r} of {operand.reader}: not a constant this can read")
        values = np.asarray(values, np.float32)
        low, high = min(float(values.min()), 0.0), max(float(values.max()), 0.0)
        scale, zero_point = calibrate_math.parameters(np.float64(low), np.float64(high), qtype,
                                                      static.symmetric or not qtype.is_integer)
        scale = np.float32(scale)
        zero_point = zero_point.astype(qtype.dtype) if qtype.is_integer else None
        q = quantize_linear(values, scale, zero_point, **({} if qtype.is_integer else {"output_dtype": qtype.onnx_name}))
        stored = onnx_activations.insert_operand(model.model, operand, q, scale, zero_point, qtype, taken, _unique)
        restored = np.asarray(dequantize_linear(q, scale, zero_point), np.float64)
        error = np.abs(restored - values)
        stats = Stats(signal=float(np.sum(np.float64(values) ** 2)), noise=float(np.sum(error * error)),
                      max_abs_error=float(np.max(error)) if error.size else 0.0)
        rows.append({"name": operand.name, "kind": "operand", "reader": operand.reader, "to": qtype.onnx_name,
                     "shape": list(values.shape), "scale": float(scale),
                     "zero_point": None if zero_point is None else int(zero_point), "bytes": stored,
                     "sqnr_db": stats.sqnr_db, "max_abs_error": stats.max_abs_error})
    return rows


def write_activations(model, writer, plan_: Plan, static: StaticSettings) -> int:
    from .formats.onnx_model import _unique

    return onnx_activations.insert_pairs(model.model, plan_.activations, plan_.parameters, static.qtype,
                                         writer.taken, _unique, plan_.placed.scale_folds)


def correct_biases(quantized, plan_: Plan, static: StaticSettings, folders=(None, None)) -> dict:
    """`bias_correction.corrected` of the written model against ``plan_.float_model`` on the calibration samples,
    unless --no-bias-correction."""
    from . import bias_correction

    if not static.bias_correction:
        return {"note": "--no-bias-correction"}
    return bias_correction.corrected(quantized, plan_.float_model, plan_.data, folders)


REPORT_SAMPLES = 16  # the per-layer report's samples at most, by default ...
REPORT_BYTES = 2 << 30  # ... and the activations they hold at most (the float and the quantized model run on each)


def report_count(float_ref, plan_: Plan, static: StaticSettings, output_names: list[str]) -> int:
    """How many samples the per-layer report runs on: ``--report-samples``, or up to `REPORT_SAMPLES` whose
    compared activations hold at most `REPORT_BYTES` (the recogniser, 157 MB a line: 13 lines; the detector,
    1.3 GB a page: 1 page). Never more than the calibration data has."""
    if static.report_samples is not None:
        return min(static.report_samples, plan_.data.samples)
    names = [a.compared for a in plan_.activations if a.producer] + output_names
    held = activation_calibration.sizes(float_ref, names,
                                        activation_calibration.first(plan_.data))
    per_sample = sum(size for size in held.values() if size is not None)
    fits = REPORT_BYTES // per_sample if per_sample else REPORT_SAMPLES
    return max(1, min(REPORT_SAMPLES, fits, plan_.data.samples))


def per_layer(float_ref, quantized_ref, plan_: Plan, output_names: list[str], count: int, progress=None,
              folders=(None, None)) -> dict:
    """SQNR of every quantized activation and every model output, quantized against float, on the first
    ``count`` samples (`report_count`); ``folders``: where each model's external data files are."""
    if count == 0:
        return {"samples": 0, "layers": [], "outputs": []}
    names = list(dict.fromkeys([a.compared for a in plan_.activations if a.producer] + output_names))
    agreements = activation_calibration.compare(float_ref, quantized_ref, names, plan_.data, limit=count,
                                                progress=progress, folders=folders, channels=plan_.real_channels,
                                                tiled=plan_.tiled)
    layers = sorted(({"tensor": a.compared, "producer": a.producer, "node": a.node, "readers": a.readers[:3],
                      "sqnr_db": agreements[a.compared].sqnr_db,
                      "max_abs_error": agreements[a.compared].max_abs_error}
                     for a in plan_.activations if a.producer), key=lambda row: row["sqnr_db"])
    outputs = [{"output": name, "sqnr_db": agreements[name].sqnr_db, "max_abs_error": agreements[name].max_abs_error}
               for name in output_names]
    return {"samples": count, "layers": layers, "outputs": outputs}


SENSITIVITY_SAMPLES = 8  # samples each tensor's solo effect on the outputs is measured on, at most


def output_sensitivity(float_model, plan_: Plan, static: StaticSettings, folder=None) -> dict[str, float | None]:
    """Each quantized activation's effect alone on the float model's outputs (`sensitivity.output_sqnr`), on the
    first `SENSITIVITY_SAMPLES` samples; cached in ``static.sensitivity`` for the runs of a --max-drop search
    (None for every tensor where onnxruntime cannot run the switched model: the order falls back to each
    tensor's own SQNR)."""
    if not static.sensitivity:
        import itertools

        from . import sensitivity

        names = [a.name for a in plan_.activations if a.producer]
        feeds = list(itertools.islice(plan_.data, SENSITIVITY_SAMPLES))
        try:
            found = sensitivity.output_sqnr(float_model, {n: plan_.parameters[n] for n in names}, feeds, folder)
        except Exception:  # noqa: BLE001 (onnxruntime's errors: e.g. a float16 tensor the switch cannot take)
            found = dict.fromkeys(names)
        static.sensitivity.update(found)
    return static.sensitivity


def activation_rows(plan_: Plan, static: StaticSettings) -> list[dict]:
    rows = []
    for activation in plan_.activations:
        scale, zero_point = plan_.parameters[activation.name]
        low, high = plan_.ranges[activation.name]
        seen = plan_.observed[activation.name]
        rows.append({
            "name": activation.name, "kind": "activation", "producer": activation.producer or "graph input",
            "readers": activation.readers, "to": static.qtype.onnx_name, "method": static.method,
            "range": [low, high], "observed": list(seen), "scale": float(scale),
            "zero_point": None if zero_point is None else int(zero_point),
            "clipped": bool(low > seen[0] or high < seen[1]),
        })
    return rows


def finite_or_none(value: float):
    return value if math.isfinite(value) else None
