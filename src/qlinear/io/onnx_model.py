"""ONNX models: float initializers become quantized initializers followed by DequantizeLinear (QDQ).

Chosen initializers: those feeding the weight input of MatMul (B), Gemm (B) or Conv (W) in the main
graph, or, with --include, every initializer the globs select; --exclude removes names either way.
Non-float initializers, float64 ones (DequantizeLinear cannot output double) and those below
--min-elements (default 1024) are left alone, and the report says why.

Each chosen initializer W is replaced by ``W_quantized`` (the quantized values; 2/4-bit types in the
packed raw_data layout), ``W_scale`` (the weight's float type), ``W_zero_point`` (integer types) and a
DequantizeLinear node whose output is named W, so every consumer reads the same name as before. The
model's opset is raised with onnx's version converter when the type or granularity needs a newer
DequantizeLinear (13 for per-axis, 19 for float8, 21 for int4/int16/blocked, 23 for float4, 25 for
int2, ...).

The default axis follows the consumer: per-axis uses the output-channel axis (MatMul/Gemm N, Conv M)
and blocks run along the reduction axis (MatMul/Gemm K, Conv input channels), as in onnxruntime's
blocked weight quantization.

When evaluation data is available (``--eval`` or ``<model>.eval.npz`` beside the model: one array per
graph input plus ``labels``), both models run on it with onnxruntime, or the onnx reference
evaluator when onnxruntime is missing, and the report gives the accuracies and how far the outputs
moved.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .. import dtypes, report
from ..granularity import Granularity
from . import tensors
from .atomic import atomic_output
from .errors import UserError

DEFAULT_MIN_ELEMENTS = 1024
_SCALE_TYPES = {"float": np.float32, "float16": np.float16, "bfloat16": None}


def _import_onnx():
    try:
        import onnx
    except ImportError:
        raise UserError("reading .onnx models needs the onnx package: pip install 'qlinear[onnx]'") from None
    return onnx


def _weight_axes(node, rank: int) -> tuple[int, int]:
    """(per-axis axis, blocked axis) for the weight input of ``node``."""
    if node.op_type == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return (0, 1) if trans_b else (1, 0)
    if node.op_type == "Conv":
        return 0, min(1, rank - 1)
    # MatMul: B is (..., K, N)
    return rank - 1, max(0, rank - 2)


def quantize_model(source: Path, output: Path, settings: tensors.Settings, args) -> dict:
    onnx = _import_onnx()
    from onnx import helper, numpy_helper

    try:
        model = onnx.load(str(source))
    except Exception as error:  # protobuf's DecodeError and friends: the file is not a model
        raise UserError(f"{source}: not a readable ONNX model ({str(error).splitlines()[0] if str(error) else type(error).__name__})") from None
    if not model.graph.node and not model.graph.initializer:
        raise UserError(f"{source}: not a readable ONNX model (no graph)")
    qtype = settings.qtype
    min_elements = DEFAULT_MIN_ELEMENTS if args.min_elements is None else args.min_elements
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}

    weight_axes: dict[str, tuple[int, int]] = {}
    for node in graph.node:
        if node.op_type in ("MatMul", "Gemm", "Conv") and len(node.input) > 1 and node.input[1] in initializers:
            rank = len(initializers[node.input[1]].dims)
            weight_axes.setdefault(node.input[1], _weight_axes(node, rank))
    from .commands import granularity_label, selection_reason

    if args.include:
        candidates = [name for name in initializers if selection_reason(name, args.include, []) is None]
    else:
        candidates = list(weight_axes)
    rows, jobs = [], []
    chosen = set()
    for name in candidates:
        init = initializers[name]
        type_name = helper.tensor_dtype_to_np_dtype(init.data_type).name if init.data_type else "undefined"
        element = dtypes.BY_TENSORPROTO.get(init.data_type)
        shape = tuple(init.dims)
        nbytes = _nbytes(init)
        reason = selection_reason(name, [], args.exclude)
        if reason is None and (element is None or element.onnx_name not in ("float", "float16", "bfloat16")):
            reason = ("float64 is not a DequantizeLinear output type" if element is not None and element.onnx_name == "double"
                      else f"{element.onnx_name if element else type_name} is not a float type")
        if reason is None and math.prod(shape) < max(min_elements, 1):
            reason = f"{math.prod(shape)} elements, below --min-elements {min_elements}"
        if reason is not None:
            rows.append(report.copied_row(name, shape, element.name if element else type_name, nbytes, reason))
            continue
        channel_axis, block_axis = weight_axes.get(name, (0, max(0, len(shape) - 1)))
        default_axis = channel_axis if settings.kind == "axis" else block_axis
        gran = tensors.resolve_granularity(f"{source}: initializer {name!r}", shape, settings, default_axis)
        jobs.append((name, element, gran))
        chosen.add(name)
    # Every float initializer not considered at all is reported too, so the table covers the model.
    for name, init in initializers.items():
        if name not in chosen and name not in candidates:
            element = dtypes.BY_TENSORPROTO.get(init.data_type)
            rows.append(report.copied_row(name, tuple(init.dims), element.name if element else str(init.data_type),
                                          _nbytes(init), "not a MatMul/Gemm/Conv weight"))

    opset_before = _default_opset(model)
    needed = max([tensors.min_opset(qtype, gran.kind, element.onnx_name) for _, element, gran in jobs], default=opset_before)
    if needed > opset_before:
        model = _raise_opset(onnx, model, needed, source)
        graph = model.graph
        initializers = {init.name: init for init in graph.initializer}
    opset_after = _default_opset(model)

    taken = {init.name for init in graph.initializer} | {v for n in graph.node for v in list(n.input) + list(n.output)}
    taken |= {i.name for i in graph.input} | {o.name for o in graph.output}
    new_nodes, quantized_rows = [], []
    for name, element, gran in jobs:
        init = initializers[name]
        weights = numpy_helper.to_array(init)
        if element.onnx_name == "bfloat16" and weights.dtype != element.dtype:
            weights = weights.view(element.dtype) if weights.dtype.itemsize == 2 else weights.astype(element.dtype)
        pieces = []
        result = tensors.quantize_tensor(f"{source}: initializer {name!r}", weights, gran, qtype, settings.symmetric,
                                         sink=pieces.append, scale_dtype=element.dtype, plot=bool(args.plot))
        q = pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=0)
        q_name, s_name, z_name = (_unique(f"{name}_{suffix}", taken) for suffix in ("quantized", "scale", "zero_point"))
        new_inits = [_tensor(helper, q_name, q, qtype), _tensor(helper, s_name, result.scale, element)]
        inputs = [q_name, s_name]
        if qtype.is_integer:
            new_inits.append(_tensor(helper, z_name, result.zero_point, qtype))
            inputs.append(z_name)
        attributes = {}
        if gran.kind != "tensor":
            attributes["axis"] = gran.axis
        if gran.kind == "block":
            attributes["block_size"] = gran.block_size
        new_nodes.append(helper.make_node("DequantizeLinear", inputs, [name], name=_unique(f"{name}_DequantizeLinear", taken),
                                          **attributes))
        graph.initializer.remove(init)
        graph.initializer.extend(new_inits)
        for graph_input in list(graph.input):
            if graph_input.name == name:  # old models list initializers as inputs too
                graph.input.remove(graph_input)
        after = sum(len(t.raw_data) for t in new_inits)
        quantized_rows.append(report.quantized_row(name, tuple(init.dims), element.name, qtype, granularity_label(gran),
                                                   _nbytes(init), after, result, gran, settings.symmetric))
    for position, node in enumerate(new_nodes):
        graph.node.insert(position, node)

    checker = "passed"
    try:
        onnx.checker.check_model(model)
    except Exception as error:
        checker = f"failed: {str(error).splitlines()[0]}"
    try:
        data = model.SerializeToString()
    except ValueError as error:  # protobuf refuses messages over 2 GB
        raise UserError(f"{source}: the quantized model cannot be serialized ({error})") from None

    summary = report.summary("quantize", source, output, quantized_rows + rows, qtype=qtype.onnx_name)
    summary["files"] = {"before": source.stat().st_size, "after": len(data)}
    summary["model"] = {"opset_before": opset_before, "opset_after": opset_after,
                        "dequantize_nodes": len(new_nodes), "checker": checker}
    # Evaluated before writing, so that a bad --eval file leaves no output behind.
    summary["model"].update(_evaluate(source, args, original=onnx.load(str(source)), quantized=model))
    with atomic_output(output) as f:
        f.write(data)
    return summary


def _nbytes(init) -> int:
    element = dtypes.BY_TENSORPROTO.get(init.data_type)
    count = math.prod(init.dims)
    if element is None:
        return len(init.raw_data)
    return -(-count * element.bits // 8)


def _default_opset(model) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def _raise_opset(onnx, model, target: int, source: Path):
    from onnx import version_converter

    try:
        converted = version_converter.convert_version(model, target)
    except Exception as error:
        raise UserError(f"{source}: the model is at opset {_default_opset(model)} and {target} is needed for this type "
                        f"and granularity, but onnx's version converter cannot raise it "
                        f"({str(error).splitlines()[0] if str(error) else type(error).__name__})") from None
    # The converter may leave the IR version below what the new opset needs.
    converted.ir_version = max(converted.ir_version, onnx.helper.find_min_ir_version_for(list(converted.opset_import)))
    return converted


def _unique(name: str, taken: set[str]) -> str:
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}_{n}"
    taken.add(candidate)
    return candidate


def _tensor(helper, name: str, array: np.ndarray, element):
    """A TensorProto with raw_data in ONNX's layout (2/4-bit types packed)."""
    array = np.asarray(array, dtype=element.dtype)
    raw = tensors.to_storage(array, element) if element.packs else np.ascontiguousarray(array)
    return helper.make_tensor(name, element.tensorproto, list(array.shape), raw.tobytes(), raw=True)


# ----------------------------------------------------------------------------------------------------
# Accuracy


def _evaluate(source: Path, args, original, quantized) -> dict:
    if args.no_eval:
        return {"accuracy": None, "accuracy_note": "--no-eval"}
    path = Path(args.eval_data) if args.eval_data else source.with_name(source.stem + ".eval.npz")
    if not path.exists():
        if args.eval_data:
            raise UserError(f"--eval {path}: no such file")
        return {"accuracy": None, "accuracy_note": f"no evaluation data (--eval, or {path.name} beside the model)"}
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except Exception as error:
        raise UserError(f"--eval {path}: not a readable .npz ({str(error).splitlines()[0]})") from None
    initializer_names = {i.name for i in original.graph.initializer}
    input_names = [i.name for i in original.graph.input if i.name not in initializer_names]
    missing = [n for n in input_names + ["labels"] if n not in arrays]
    if missing:
        raise UserError(f"--eval {path}: needs one array per model input ({', '.join(input_names)}) and 'labels'; "
                        f"missing {', '.join(missing)}")
    feeds = {n: arrays[n] for n in input_names}
    notes = []
    for runtime, run in _runners():
        try:
            before = np.asarray(run(original, feeds), np.float64)
            after = np.asarray(run(quantized, feeds), np.float64)
            break
        except Exception as error:  # e.g. onnxruntime lacks a kernel for this type: try the next runtime
            notes.append(f"{runtime} could not run the model: {str(error).splitlines()[0][:160]}")
    else:
        return {"accuracy": None, "accuracy_note": "; ".join(notes) or "neither onnxruntime nor onnx is importable"}
    labels = arrays["labels"].reshape(-1)
    predicted_before = before.reshape(len(labels), -1).argmax(axis=1)
    predicted_after = after.reshape(len(labels), -1).argmax(axis=1)
    accuracy = {
        "data": str(path), "runtime": runtime, "samples": int(len(labels)),
        "float": float(np.mean(predicted_before == labels)), "quantized": float(np.mean(predicted_after == labels)),
        "agreement": float(np.mean(predicted_before == predicted_after)),
        "max_output_difference": float(np.max(np.abs(before - after))),
    }
    if runtime.startswith("onnxruntime"):
        # The figures above use onnxruntime's basic graph optimizations, which keep DequantizeLinear and
        # MatMul apart (the ONNX semantics); its default level fuses them into MatMulNBits, which computes
        # differently (for int2/uint2 weights in onnxruntime 1.32: wrongly). Users run the default.
        try:
            fused = np.asarray(_run_onnxruntime(quantized, feeds, default_optimizations=True), np.float64)
            accuracy["quantized_default_optimizations"] = float(np.mean(fused.reshape(len(labels), -1).argmax(axis=1) == labels))
            accuracy["default_optimizations_max_difference"] = float(np.max(np.abs(fused - after)))
        except Exception:
            pass
    return {"accuracy": accuracy}


def _run_onnxruntime(model, feeds, default_optimizations: bool = False):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    if not default_optimizations:
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _runners():
    """(name, run(model, feeds) -> first output) for onnxruntime, then onnx's reference evaluator."""
    try:
        import onnxruntime

        yield f"onnxruntime {onnxruntime.__version__} (basic graph optimizations)", _run_onnxruntime
    except ImportError:
        pass
    try:
        from onnx.reference import ReferenceEvaluator
    except ImportError:
        return

    def run_reference(model, feeds):
        return ReferenceEvaluator(model).run(None, feeds)[0]

    yield "onnx.reference.ReferenceEvaluator", run_reference
