"""The pipelines of `qlinear quantize` and `qlinear dequantize`, one per format:

    read (formats.*) -> select -> calibrate (calibration, or streaming for dask) -> quantize
    (quantization, or streaming) -> write (formats.*) -> report rows

Everything that can be checked before writing is checked first (the granularity of every tensor, name
clashes, the labelled data), so a user error leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from .. import dtypes, mx
from ..granularity import Granularity
from . import bias_correction, evaluation, latency, report, select, static_quantization, streaming, weight_rounding
from .atomic import atomic_files, atomic_output, atomic_store
from .calibration import calibrate_tensor
from .errors import UserError
from .extras import import_onnx
from . import mx_files
from .formats import onnx_model, tensor_files, zarr_store
from .formats.onnx_constants import prune_unused, stored_constants
from .placement import Skipped, broadcast_gates, gather_tables
from .placement import onnxruntime as placement_onnxruntime
from .placement.graph import image_stem
from .plan import Choice, Found, Quantized, Settings, min_opset
from .quantization import MXQuantized, dequantize_tensor, quantize_mx, quantize_tensor
from .storage import PackingSink, stored_size, to_storage

ONNX_MIN_ELEMENTS = 1
CONVERSION_TOLERANCE = 1e-4  # of the output's magnitude (at least 1): float rounding, not a change of meaning
# A fold rounds each folded weight once more (a few ulp) and reassociates, which a deep network amplifies: the PP-OCR
# recogniser's outputs moved by up to 2.9e-4 on held-out lines after folding 64 batch norms. Beyond the tolerance
# above, the fold is accepted within this many times what one ulp of noise on every weight moves the same outputs
# (`_ulp_yardstick`); a wrong fold moves them by their own magnitude.
FOLD_ULPS = 16
CHECK_LIMIT = 1 << 30  # bytes of model above which a raised opset is not checked by running the model


def _choices(found: list[Found], settings: Settings, rules: select.Rules, source: Path) -> list[Choice]:
    return [select.choose(f, settings, rules, f"{source}: tensor {f.name!r}") for f in found]


def _refuse_clashes(choices: list[Choice], names: set[str], source: Path, what: str) -> None:
    for choice in choices:
        if not choice.quantized:
            continue
        for suffix in (".scale", ".zero_point"):
            if choice.found.name + suffix in names:
                raise UserError(f"{source}: tensor {choice.found.name!r}: the {what} already has a tensor named "
                                f"{choice.found.name + suffix!r}, where the {suffix[1:]} would go")


# ----------------------------------------------------------------------------------------------------
# Tensor files


def quantize_file(source: Path, output: Path, kind: str, settings: Settings) -> dict:
    if settings.mx is not None:  # MXFP4 in gpt-oss's checkpoint layout, NVFP4 in Model Optimizer's
        return mx_files.quantize_file(source, output, kind, settings)
    reader = tensor_files.open_tensor_file(source)
    if "qlinear" in reader.metadata:
        raise UserError(f"{source}: was written by qlinear quantize; run qlinear dequantize on it first")
    rules = select.Rules(tensor_files.FLOAT_DTYPES)
    choices = _choices(reader.entries, settings, rules, source)
    _refuse_clashes(choices, {f.name for f in reader.entries}, source, "file")
    qtype = settings.qtype
    plan, meta, copied = [], {}, []
    for choice in choices:
        found = choice.found
        if not choice.quantized:
            plan.append(tensor_files.Planned(found.name, found.dtype, found.shape, found.nbytes, found.code))
            copied.append(found.name)
            continue
        gran = choice.granularity
        plan += tensor_files.quantized_plan(found.name, found.shape, qtype, gran)
        meta[found.name] = tensor_files.tensor_metadata(found, qtype, gran, choice.symmetric)
    metadata = tensor_files.file_metadata(reader.metadata, meta, copied)

    rows = []
    total = sum(c.found.nbytes for c in choices if c.quantized)
    with report.progress(total, f"quantizing {source.name}") as advance, atomic_output(output) as f:
        writer = tensor_files.WRITERS["npz" if kind == "npy" else kind](f, plan, metadata)
        with _aborting(writer):
            for choice in choices:
                rows.append(_quantize_into(source, reader, writer, choice, qtype, settings, advance))
            writer.close()
    reader.close()
    return report.summary("quantize", source, output, rows, qtype=qtype.onnx_name)


@contextlib.contextmanager
def _aborting(writer):
    try:
        yield
    except BaseException:
        if hasattr(writer, "abort"):
            writer.abort()
        raise


def _quantize_into(source, reader, writer, choice: Choice, qtype, settings: Settings, advance) -> dict:
    found = choice.found
    if not choice.quantized:
        tensor_files.copy_raw(reader, found, writer)
        return report.copied_row(found, choice.reason)
    where = f"{source}: tensor {found.name!r}"
    gran = choice.granularity
    x = reader.array(found)
    release = None if x.ndim == 0 else tensor_files.page_releaser(x, found)
    writer.begin(found.name)
    size = streaming.chunk_size_for(settings.chunks, found.nbytes, settings.plot) if x.ndim else None
    if size is not None:
        lazy = streaming.lazy_rows(x, gran, size, release)
        scale, zero_point = streaming.calibrate_dask(where, lazy, gran, qtype, choice.symmetric)
        advance(x.nbytes / 2)
        sink = PackingSink(writer.write, qtype) if qtype.packs else (lambda q: writer.write(to_storage(q, qtype)))
        stats = streaming.quantize_bands(lazy, gran, qtype, scale, zero_point, sink, progress=advance)
        if qtype.packs:
            sink.close()
    else:
        scale, zero_point = calibrate_tensor(where, x, gran, qtype, choice.symmetric, progress=advance, release=release)
        stats = quantize_tensor(x, gran, qtype, scale, zero_point, lambda q: writer.write(to_storage(q, qtype)),
                                plot=settings.plot, progress=advance, release=release)
    writer.end()
    del x
    writer.begin(found.name + ".scale")
    writer.write(scale)
    writer.end()
    writer.begin(found.name + ".zero_point")
    writer.write(to_storage(zero_point, qtype))
    writer.end()
    after = stored_size(qtype, found.shape) + scale.nbytes + stored_size(qtype, scale.shape)
    return report.quantized_row(choice, qtype, after, Quantized(scale, zero_point, stats), settings.plot)


def dequantize_file(source: Path, output: Path, out_kind: str) -> dict:
    reader = tensor_files.open_tensor_file(source)
    if mx_files.dequantizes(reader):  # gpt-oss MXFP4 pairs, Model Optimizer NVFP4 triples
        return mx_files.dequantize_file(source, reader, output, out_kind)
    quantized = tensor_files.read_metadata(source, reader.metadata).get("tensors")
    if not isinstance(quantized, dict):
        raise UserError(f"{source}: corrupt qlinear metadata (no tensors)")
    entries = {entry.name: entry for entry in reader.entries}
    auxiliary, jobs = set(), {}
    for name, info in quantized.items():
        try:
            qtype = dtypes.get(info["dtype"])
            shape = tuple(int(d) for d in info["shape"])
            out_dtype = dtypes.resolve_dtype(info["source_dtype"], "source_dtype", "dequantize").dtype
            values, scale, zero = (entries[name], entries[info["scale"]], entries[info["zero_point"]])
            gran_kind, axis, block_size = info["granularity"], info["axis"], int(info["block_size"])
        except (KeyError, ValueError, TypeError) as error:
            raise UserError(f"{source}: tensor {name!r}: corrupt qlinear metadata (missing {error})") from None
        auxiliary |= {info["scale"], info["zero_point"]}
        gran = Granularity(gran_kind, shape, axis, block_size) if shape else Granularity("tensor", ())
        if tuple(scale.shape) != gran.param_shape or values.nbytes != stored_size(qtype, shape):
            raise UserError(f"{source}: tensor {name!r}: its values or scale do not match the shape {list(shape)} "
                            f"and granularity in the metadata")
        jobs[name] = (qtype, shape, out_dtype, gran, values, scale, zero)
    plan, order = [], []
    for entry in reader.entries:
        if entry.name in auxiliary:
            continue
        if entry.name in jobs:
            _, shape, out_dtype, *_ = jobs[entry.name]
            plan.append(tensor_files.Planned(entry.name, out_dtype, shape, math.prod(shape) * out_dtype.itemsize))
        else:
            plan.append(tensor_files.Planned(entry.name, entry.dtype, entry.shape, entry.nbytes, entry.code))
        order.append(entry)
    if out_kind == "npy" and len(plan) != 1:
        raise UserError(f"{output}: a .npy file holds one array and {source} has {len(plan)} tensors; write a .npz")
    metadata = {k: v for k, v in reader.metadata.items() if k != "qlinear"}
    rows = []
    total = sum(p.nbytes for p in plan if p.name in jobs)
    with report.progress(total, f"dequantizing {source.name}") as advance, atomic_output(output) as f:
        writer = tensor_files.WRITERS[out_kind](f, plan, metadata)
        for entry in order:
            if entry.name not in jobs:
                tensor_files.copy_raw(reader, entry, writer)
                rows.append(report.restored_row(entry.name, entry.shape, entry.type_name, entry.type_name,
                                                entry.nbytes, entry.nbytes) | {"note": "copied"})
                continue
            qtype, shape, out_dtype, gran, values, scale, zero = jobs[entry.name]
            scale_array = np.asarray(reader.array(scale))
            zero_raw = np.asarray(reader.array(zero))
            if qtype.packs:
                from ..packing import unpack

                zero_array = unpack(zero_raw.reshape(-1), qtype.dtype, scale_array.shape)
            else:
                zero_array = zero_raw.view(qtype.dtype).reshape(scale_array.shape)
            writer.begin(entry.name)
            dequantize_tensor(reader.array(values), qtype, shape, scale_array, zero_array, gran, out_dtype,
                              sink=writer.write, progress=advance)
            writer.end()
            rows.append(report.restored_row(entry.name, shape, qtype.onnx_name, out_dtype.name,
                                            values.nbytes + scale.nbytes + zero.nbytes,
                                            math.prod(shape) * out_dtype.itemsize))
        writer.close()
    reader.close()
    return report.summary("dequantize", source, output, rows)


def measure_file(source: Path, settings: Settings) -> dict:
    """What `quantize_file` would report for a tensor file, written nowhere: the --dtype list's figures,
    and the MX formats' route into a tensor file other than MXFP4 safetensors (which `mx_files` writes)."""
    reader = tensor_files.open_tensor_file(source)
    if "qlinear" in reader.metadata:
        raise UserError(f"{source}: was written by qlinear quantize; run qlinear dequantize on it first")
    choices = _choices(reader.entries, settings, select.Rules(tensor_files.FLOAT_DTYPES), source)
    qtype, rows = settings.qtype, []
    total = sum(c.found.nbytes for c in choices if c.quantized)
    with report.progress(total, f"measuring {source.name} as {settings.dtype_name}") as advance:
        for choice in choices:
            found = choice.found
            if not choice.quantized:
                rows.append(report.copied_row(found, choice.reason))
                continue
            x = reader.array(found)
            if settings.mx is not None:
                result = quantize_mx(np.asarray(x), choice.granularity, settings.mx, settings.scale_rule,
                                     np.dtype(found.dtype))
                tensor_scale = 4 if result.global_scale is not None else 0  # NVFP4's float32
                after = stored_size(qtype, found.shape) + result.scales.nbytes + tensor_scale
                advance(found.nbytes)
                rows.append(report.quantized_row(choice, qtype, after, Quantized(result.scales, np.zeros((), np.int8),
                                                                                 result.stats), to=settings.mx.name))
                continue
            gran = choice.granularity if x.ndim else Granularity("tensor", ())
            where = f"{source}: tensor {found.name!r}"
            scale, zero_point = calibrate_tensor(where, x, gran, qtype, choice.symmetric, progress=advance)
            stats = quantize_tensor(x, gran, qtype, scale, zero_point, lambda q: None, progress=advance)
            after = stored_size(qtype, found.shape) + scale.nbytes + stored_size(qtype, scale.shape)
            rows.append(report.quantized_row(choice, qtype, after, Quantized(scale, zero_point, stats)))
    reader.close()
    return report.summary("quantize", source, None, rows, qtype=settings.dtype_name)


def compare(source: Path, kind: str, runs: list[Settings], measure: Evaluation) -> dict:
    """``--dtype A,B,...``: each type or format on the same weights, side by side, nothing written. An ONNX
    model is quantized once per entry into a temporary folder (so each figure, the task figure included, is
    the one a single --dtype reports) and removed; a tensor file is measured in memory (`measure_file`)."""
    summaries = []
    for settings in runs:
        if kind == "onnx":
            with tempfile.TemporaryDirectory(prefix="qlinear-compare-") as folder:
                summaries.append(quantize_onnx(source, Path(folder) / f"{source.stem}.{settings.dtype_name}.onnx",
                                               settings, measure))
        else:
            summaries.append(measure_file(source, settings))
    return report.comparison(source, [s.dtype_name for s in runs], summaries)


# ----------------------------------------------------------------------------------------------------
# zarr stores


def quantize_store(source: Path, output: Path, settings: Settings) -> dict:
    reader = zarr_store.StoreReader(source)
    if "qlinear" in reader.metadata:
        raise UserError(f"{source}: was written by qlinear quantize; run qlinear dequantize on it first")
    size = settings.chunks or streaming.ChunkSize(nbytes=streaming.DEFAULT_CHUNK_BYTES)
    rules = select.Rules(tensor_files.FLOAT_DTYPES)
    choices = _choices(reader.entries, settings, rules, source)
    _refuse_clashes(choices, set(reader.arrays), source, "store")
    qtype = settings.qtype
    meta, copied, rows = {}, [], []
    total = sum(c.found.nbytes for c in choices)
    with report.progress(total, f"quantizing {source.name}") as advance, atomic_store(output) as temporary:
        writer = zarr_store.StoreWriter(temporary)
        for choice in choices:
            found = choice.found
            array = reader.array(found)
            lazy = reader.lazy(found)
            if not choice.quantized:
                zarr_store.store(lazy, writer.create(found.name, array.shape, array.chunks, array.dtype, dict(array.attrs)))
                advance(array.nbytes)
                copied.append(found.name)
                rows.append(report.copied_row(found, choice.reason))
                continue
            where = f"{source}: tensor {found.name!r}"
            shape = tuple(array.shape)
            gran = choice.granularity if shape else Granularity("tensor", ())
            chunks = streaming.chunks_for(shape, array.dtype, size, gran, previous=array.chunks) if shape else ()
            lazy = lazy.rechunk(chunks) if shape else lazy
            scale, zero_point = streaming.calibrate_dask(where, lazy, gran, qtype, choice.symmetric)
            q, figures = streaming.quantize_graph(lazy, gran, qtype, scale, zero_point)
            stored = zarr_store.storage_dtype(qtype)
            target = writer.create(found.name, shape, zarr_store.regular(chunks), stored, dict(array.attrs))
            stats = streaming.stats_of(*zarr_store.store(zarr_store.to_storage(q, qtype), target, figures))
            advance(array.nbytes)
            writer.put(found.name + ".scale", np.asarray(scale, np.float32))
            writer.put(found.name + ".zero_point", np.asarray(zarr_store.to_storage(zero_point, qtype)))
            meta[found.name] = tensor_files.tensor_metadata(found, qtype, gran, choice.symmetric) | {"packed": False}
            after = math.prod(shape) * stored.itemsize + scale.nbytes + zero_point.size * stored.itemsize
            rows.append(report.quantized_row(choice, qtype, after, Quantized(scale, zero_point, stats), settings.plot))
        writer.attributes({**reader.metadata, "qlinear": {
            "format": tensor_files.FORMAT_VERSION, "tensors": meta, "copied": copied, "root_array": reader.root_array}})
    return report.summary("quantize", source, output, rows, qtype=qtype.onnx_name)


def dequantize_store(source: Path, output: Path) -> dict:
    from ..ops.quantize_linear import dequantize_linear

    reader = zarr_store.StoreReader(source)
    quantized = tensor_files.read_metadata(source, reader.metadata).get("tensors")
    if not isinstance(quantized, dict):
        raise UserError(f"{source}: corrupt qlinear metadata (no tensors)")
    auxiliary = set()
    for name, info in quantized.items():
        try:
            auxiliary |= {info["scale"], info["zero_point"]}
        except (KeyError, TypeError) as error:
            raise UserError(f"{source}: tensor {name!r}: corrupt qlinear metadata (missing {error})") from None
    names = [name for name in reader.arrays if name not in auxiliary]
    root_array = bool(reader.metadata["qlinear"].get("root_array")) and len(names) == 1
    outer = {k: v for k, v in reader.metadata.items() if k != "qlinear"}
    rows = []
    total = sum(reader.arrays[name].nbytes for name in names)
    with report.progress(total, f"dequantizing {source.name}") as advance, atomic_store(output) as temporary:
        writer = zarr_store.StoreWriter(temporary, root_array=root_array)
        if not root_array:
            writer.attributes(outer)
        for name in names:
            array = reader.arrays[name]
            attrs = dict(array.attrs) | (outer if root_array else {})
            lazy = reader.lazy(Found(name, None, (), 0))
            if name not in quantized:
                zarr_store.store(lazy, writer.create(name, array.shape, array.chunks, array.dtype, attrs))
                advance(array.nbytes)
                rows.append(report.restored_row(name, tuple(array.shape), str(array.dtype), str(array.dtype),
                                                array.nbytes, array.nbytes) | {"note": "copied"})
                continue
            info = quantized[name]
            try:
                qtype = dtypes.get(info["dtype"])
                shape = tuple(int(d) for d in info["shape"])
                out_dtype = dtypes.resolve_dtype(info["source_dtype"], "source_dtype", "dequantize").dtype
                gran = Granularity(info["granularity"], shape, info["axis"], int(info["block_size"])) if shape \
                    else Granularity("tensor", ())
                scale = np.asarray(reader.arrays[info["scale"]][...])
                zero_point = np.asarray(zarr_store.from_storage(np.asarray(reader.arrays[info["zero_point"]][...]), qtype))
            except (KeyError, ValueError, TypeError) as error:
                raise UserError(f"{source}: tensor {name!r}: corrupt qlinear metadata (missing {error})") from None
            if tuple(array.shape) != shape or tuple(scale.shape) != gran.param_shape \
                    or np.dtype(array.dtype) != zarr_store.storage_dtype(qtype):
                raise UserError(f"{source}: tensor {name!r}: its values or scale do not match the shape {list(shape)}, "
                                f"type and granularity in the metadata")
            q = zarr_store.from_storage(lazy, qtype)
            restored = dequantize_linear(q, scale, zero_point if qtype.is_integer else None, **gran.attributes())
            zarr_store.store(restored.astype(out_dtype), writer.create(name, array.shape, array.chunks, out_dtype, attrs))
            advance(array.nbytes)
            rows.append(report.restored_row(name, shape, qtype.onnx_name, out_dtype.name,
                                            array.nbytes + scale.nbytes + zero_point.nbytes,
                                            math.prod(shape) * out_dtype.itemsize))
    return report.summary("dequantize", source, output, rows)


# ----------------------------------------------------------------------------------------------------
# ONNX models


@dataclass(frozen=True)
class Evaluation:
    """What the report measures on an ONNX model: labelled data (None: none) and the task."""

    data: Path | None = None
    note: str = ""  # why there is no data
    task: evaluation.Task = evaluation.Task()


# The scale type of each weight type: its own, except bfloat16, whose DequantizeLinear onnxruntime 1.32
# cannot run; bfloat16 weights get float32 scales and a Cast (the same values: DequantizeLinear computes a
# bfloat16 output as the float32 product rounded to bfloat16).
_SCALE_TYPES = {"float32": "float", "float16": "float16", "bfloat16": "float"}


def quantize_onnx(source: Path, output: Path, settings: Settings, measure: Evaluation,
                  static: static_quantization.StaticSettings | None = None) -> dict:
    """Weight-only QDQ, or with ``static`` the activations too, calibrated on the user's samples."""
    model = onnx_model.OnnxModel(source)
    qtype = settings.qtype
    rules = select.Rules((np.dtype(np.float32), np.dtype(np.float16), np.dtype(dtypes.get("bfloat16").dtype)),
                         min_elements=ONNX_MIN_ELEMENTS,
                         refused_types={"float64": "float64 is not a DequantizeLinear output type"})
    choices = _kept_float(_choices(model.found, settings, rules, source), model, static, settings)
    chosen = [c for c in choices if c.quantized]
    if not chosen and static is None:
        raise UserError(f"{source}: {_nothing_to_quantize(model, choices)}")
    input_names = _input_names(model.model)
    feeds = None
    if measure.data is not None:  # checked before anything is written
        data_feeds, _ = evaluation.load_data(measure.data, input_names, measure.task)
        feeds = _first_run(data_feeds, measure.task)
    samples = None
    if static is not None:
        samples = static_quantization.open_data(static, input_names)
        feeds = feeds if feeds is not None else static_quantization.first_sample(samples)

    opset_before = model.opset
    needed = max([_needed_opset(settings, c) for c in chosen]
                 + ([static_quantization.needed_opset(static)] if static is not None else []))
    conversion = None
    if needed > opset_before:
        original = model.model
        model.raise_opset(needed)
        conversion = _check_conversion(source, model, original, feeds, opset_before, needed, output.parent)
        choices = _kept_float(_choices(model.found, settings, rules, source), model, static, settings)
        chosen = [c for c in choices if c.quantized]
    static_plan = weight_plan = None
    if static is not None:
        folding = _fold(source, model, feeds, static.target == "onnxruntime", output.parent)
        choices = _kept_float(_choices(model.found, settings, rules, source), model, static, settings)
        chosen = [c for c in choices if c.quantized]
        float_weights = {c.found.name for c in choices if not c.quantized}
        static_plan = static_quantization.plan(model, static, samples, float_weights)
        static_plan.folding = folding
        if settings.rounding != "rtn":
            levels = static.qtype.qmax - static.qtype.qmin if static.qtype.is_integer else 0
            weight_plan = weight_rounding.Rounding(model, choices, settings, levels, samples)
        with report.progress(samples.samples, f"calibrating on {samples.samples} samples", unit="samples") as advance:
            also = weight_plan.also(samples.samples) if weight_plan is not None else None
            ran = static_quantization.calibrate(static_plan, model.model, static, advance, also,
                                                folder=model.data_folder)
            if weight_plan is not None and not ran:
                weight_plan.collector = None  # every activation cached (a --max-drop rerun): a run of their own
        sentinels = static_quantization.sentinel_holders(static_plan, model.model)
        if sentinels:  # placed again with those nodes float; their statistics are cached
            static = replace(static, keep_float=static.keep_float + tuple(k for k in sentinels
                                                                          if k not in static.keep_float))
            static_plan = static_quantization.plan(model, static, samples, float_weights)
            static_plan.folding = folding
            with report.progress(samples.samples, "calibrating what the re-placement added", unit="samples") \
                    as advance:
                static_quantization.calibrate(static_plan, model.model, static, advance, folder=model.data_folder)
            reasons = dict(sentinels.values())
            skipped = [s for s in static_plan.placed.skipped if s.name not in reasons]
            static_plan.placed.skipped = [Skipped(name, why) for name, why in reasons.items()] + skipped
        if static.target == "onnxruntime" and weight_plan is None:
            # After calibrating: the statistics are the unpadded model's, the zero channels' never counted.
            static_plan.folding["padded"] = _pad_channels(source, model, feeds, static_plan, output.parent)
            if static_plan.folding["padded"]["layers"]:
                choices = _kept_float(_choices(model.found, settings, rules, source), model, static, settings)
                chosen = [c for c in choices if c.quantized]
        static_plan.float_model = import_onnx().ModelProto()
        static_plan.float_model.CopyFrom(model.model)
    outcomes, scaling = {}, None
    if settings.rounding != "rtn":
        rounding_data = samples
        if rounding_data is None and settings.weight_data:
            rounding_data = static_quantization.CalibrationData.open(list(settings.weight_data), input_names)
        if weight_plan is None:
            weight_plan = weight_rounding.Rounding(model, choices, settings, data=rounding_data)
        outcomes = weight_plan.run(model, rounding_data)
        scaling = _channel_scales(source, model, choices, outcomes, settings, feeds, rounding_data, output.parent)
        if scaling is not None:
            choices = _kept_float(_choices(model.found, settings, rules, source), model, static, settings)
            chosen = [c for c in choices if c.quantized]
            if static_plan is not None:
                static_plan = _recalibrated(model, static, static_plan, samples, float_weights, scaling["tensors"])

    # Weights only, with samples: the float model the biases are corrected against (`bias_correction`).
    weights_reference = None
    weights_skipped = None  # why the biases are not corrected, if they are not
    if static_plan is None and settings.weight_data:
        weights_skipped = ("--no-bias-correction" if settings.bias_correction is False
                           else None if settings.bias_correction else bias_correction.weights_only_default(settings))
        if weights_skipped is None:
            weights_reference = import_onnx().ModelProto()
            weights_reference.CopyFrom(model.model)
    data_path = output.with_name(output.name + ".data")
    outputs = [data_path, output] if model.external else [output]
    rows = []
    with atomic_files(outputs) as (files, temporaries):
        external = onnx_model.ExternalData(files[0], data_path.name) if model.external else None
        writer = onnx_model.QdqWriter(model, external)
        if external is not None:
            writer.move_kept([c.found for c in chosen])
        total = sum(c.found.nbytes for c in chosen)
        weight_scales: dict[str, np.ndarray] = {}
        with report.progress(total, f"quantizing {source.name}") as advance:
            for choice in choices:
                rows.append(_quantize_constant(source, model, writer, choice, qtype, settings, advance, weight_scales,
                                               outcomes.get(choice.found.name)))
        pairs = 0
        if static_plan is not None:
            bias_rows = static_quantization.write_biases(model, writer, static_plan, weight_scales)
            biases = {row["name"] for row in bias_rows}
            rows = [row for row in rows if row["name"] not in biases] + bias_rows
            operand_rows = static_quantization.write_operands(model, static_plan, static, writer.taken)
            pairs = static_quantization.write_activations(model, writer, static_plan, static)
            prune_unused(model.model.graph)  # operands and folded nodes no longer read
            gates = broadcast_gates.rewrite(model.model) if static.target == "onnxruntime" else []
            static_plan.tiled = {gate for _, gate in gates}
            if external is not None:
                files[0].flush()  # the correction's runs read the data written so far
            corrected = static_quantization.correct_biases(
                model.model, static_plan, static,
                (model.data_folder, temporaries[-1].parent if external is not None else None))
        weights_corrected = {"note": weights_skipped} if weights_skipped is not None else None
        if weights_reference is not None:
            if external is not None:
                files[0].flush()  # the correction's runs read the data written so far
            weights_corrected = bias_correction.corrected(
                model.model, weights_reference,
                static_quantization.CalibrationData.open(list(settings.weight_data), input_names),
                (model.data_folder, temporaries[-1].parent if external is not None else None))
        gathers = gather_tables.rewrite(model.model) if settings.target == "onnxruntime" else []
        writer.dequantize_nodes -= len(gathers)
        per_run = placement_onnxruntime.dequantized_per_run(model.model) if settings.target == "onnxruntime" else 0
        data = onnx_model.serialize(model.model, str(source))
        files[-1].write(data)
        for f in files:
            f.flush()
        # The temporary model loads from its folder with its data file beside it, as it will in place.
        quantized_ref = temporaries[-1] if external is not None else model.model
        original_ref = source if model.external else import_onnx().load(str(source))
        summary = report.summary("quantize", source, output, rows, qtype=settings.dtype_name)
        summary["files"] = {"before": model.stored_bytes, "after": sum(f.tell() for f in files)}
        summary["model"] = {"opset_before": opset_before, "opset_after": model.opset,
                            "dequantize_nodes": writer.dequantize_nodes,
                            "checker": _valid_or_refused(source, model, files, temporaries, external),
                            "external_data": data_path.name if external is not None else None,
                            "gather_block_quantized": gathers, "dequantized_per_run": per_run}
        if conversion is not None:
            summary["model"]["conversion"] = conversion
        if scaling is not None:
            summary["model"]["channel_scales"] = {k: v for k, v in scaling.items() if k != "tensors"}
        if weights_corrected is not None:
            summary["bias_correction"] = weights_corrected
        if static_plan is not None:
            output_names = [o.name for o in model.model.graph.output]
            # The float model as quantized (opset raised, batch norms folded): its tensors are the quantized one's.
            original_proto = static_plan.float_model
            count = static_quantization.report_count(original_proto, static_plan, static, output_names)
            with report.progress(count, "comparing layers", unit="samples") as advance:
                # With external data the float model reads the input's data file, the quantized one the
                # output's (written beside the temporary model).
                folders = (model.data_folder,
                           temporaries[-1].parent if external is not None else None)
                layers = static_quantization.per_layer(original_proto, model.model, static_plan, output_names, count,
                                                       advance, folders)
            if static.max_drop is not None:  # its order: each layer's effect alone on the outputs
                with report.progress(1, "measuring each layer's effect on the outputs", unit="models"):
                    solo = static_quantization.output_sensitivity(original_proto, static_plan, static,
                                                                  model.data_folder)
                named = {a.compared: a.name for a in static_plan.activations}
                for layer in layers["layers"]:
                    layer["output_sqnr_db"] = solo.get(named.get(layer["tensor"], layer["tensor"]))
            summary["activations"] = {
                "type": static.qtype.onnx_name, "method": static.method, "symmetric": static.symmetric,
                "folded": static_plan.folding,
                "calibration_samples": static_plan.data.samples, "pairs": pairs,
                "tensors": static_quantization.activation_rows(static_plan, static),
                "kept": [{"name": s.name, "reason": s.reason} for s in static_plan.skipped],
                "target": static.target, "operands": operand_rows, "bias_correction": corrected,
                "gates_tiled": [node for node, _ in gates],
                "per_layer": layers,
            }
        summary["model"].update(_measure(measure, original_ref, quantized_ref, input_names, model))
        if static_plan is not None and static.latency:
            summary["model"]["latency"] = _latency(original_ref, quantized_ref, static_plan.data)
    return summary


def _latency(original_ref, quantized_ref, data) -> dict:
    """The float and the quantized model's latency in onnxruntime, or why it was not measured."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return {"note": "onnxruntime is not installed: pip install onnxruntime"}
    proto = original_ref if not isinstance(original_ref, Path) else import_onnx().load(str(original_ref),
                                                                                        load_external_data=False)
    feeds = latency.batch_from(data, proto)
    try:
        with report.progress(1, "timing the float and the quantized model in onnxruntime", unit="models"):
            result = latency.measure(original_ref, quantized_ref, feeds)
            result["nodes"] = latency.optimized_nodes(quantized_ref)
    except Exception as error:  # noqa: BLE001 (onnxruntime's several error types: the report says why)
        return {"note": f"onnxruntime could not run the models on a batch of the calibration data: "
                        f"{str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__}"}
    return result


MAX_KEPT_LAYERS = 24  # layers a --max-drop search keeps float at most before it gives up


def quantize_onnx_within(source: Path, output: Path, settings: Settings, measure: Evaluation,
                         static: static_quantization.StaticSettings) -> dict:
    """Static quantization with ``static.max_drop``: while the task figure on the labelled data drops by
    more than that many points, keep float too (its activations and weight: NNCF's accuracy control, Neural
    Compressor's autotune) the layer whose quantized activation alone costs the model's outputs the most
    (`sensitivity`; each activation's own SQNR where that cannot be measured), and quantize again; the
    statistics are calibrated once."""
    if measure.data is None:
        raise UserError("--max-drop needs labelled data to measure the drop: --eval DATA.npz (with 'labels')")
    kept = list(static.keep_float)
    history = []
    while True:
        current = replace(static, keep_float=tuple(kept), latency=False)
        summary = quantize_onnx(source, output, settings, measure, current)
        accuracy = summary["model"].get("accuracy")
        if not accuracy:
            raise UserError(f"--max-drop: the task figure could not be measured "
                            f"({summary['model'].get('accuracy_note', 'no runtime')})")
        drop = 100.0 * (accuracy["float"] - accuracy["quantized"])
        history.append({"kept": kept[len(static.keep_float):], "quantized": accuracy["quantized"], "drop": drop})
        layers = summary["activations"]["per_layer"]["layers"]
        if any(layer.get("output_sqnr_db") is not None for layer in layers):
            # the layer that costs the outputs most alone first: a tensor's own SQNR does not say how much the
            # layers after it amplify its error (`sensitivity`); unmeasured ones after, by their own SQNR
            layers = sorted(layers, key=lambda layer: (layer.get("output_sqnr_db") is None,
                                                       layer.get("output_sqnr_db") or 0.0))
        candidates = [layer["node"] for layer in layers if layer["node"] and layer["node"] not in kept]
        if drop <= static.max_drop or not candidates or len(kept) - len(static.keep_float) >= MAX_KEPT_LAYERS:
            break
        kept.append(candidates[0])
    summary["activations"]["max_drop"] = {"budget": static.max_drop, "met": drop <= static.max_drop,
                                          "kept": kept[len(static.keep_float):], "history": history}
    if static.latency:  # once, on the model written last
        data = static_quantization.open_data(static, _input_names(import_onnx().load(str(source), load_external_data=False)))
        summary["model"]["latency"] = _latency(source, output, data)
    return summary


def _not_run(model) -> str:
    """Why a check that runs the model twice (`CHECK_LIMIT`) was skipped."""
    return (f"not run to check it: the model holds {model.stored_bytes / 1e9:.2f} GB, and running it twice would "
            f"take more memory than quantizing it")


def _fold(source: Path, model, feeds, onnxruntime: bool, folder: Path) -> dict:
    """Fold BatchNormalization (and Mul/Add by constants) into the Convs before them, then check that the
    float model still computes what it did (float rounding only), as after an opset conversion. A model with
    external data is run from a temporary folder in ``folder`` (`_materialized`)."""
    import onnx

    original = onnx.ModelProto()
    original.CopyFrom(model.model)
    folded = model.fold_for_static(onnxruntime)
    result = {"nodes": [f"{f.folded} into {f.conv}" for f in folded]}
    if folded:
        result.update(_still_computes(source, original, model, feeds, folder,
                                      f"folding {len(folded)} batch norms into their convolutions",
                                      "the model with its batch norms folded into its convolutions"))
    return result


def _channel_scales(source: Path, model, choices, outcomes: dict, settings: Settings, feeds, data,
                    folder: Path) -> dict | None:
    """AWQ's channel scales into the float model (`weight_rounding.write_channel_scales`), checked as `_fold`
    checks its rewrite (on ``feeds``, or the first of the rounding's samples ``data``); None without them."""
    import onnx

    original = onnx.ModelProto()
    original.CopyFrom(model.model)
    scaling = weight_rounding.write_channel_scales(model, choices, outcomes, settings)
    if scaling is not None:
        feeds = feeds if feeds is not None else static_quantization.first_sample(data)
        scaling.update(_still_computes(source, original, model, feeds, folder,
                                       f"dividing {len(scaling['folded']) + len(scaling['divided'])} layers' inputs "
                                       f"by their channel scales", "the model with its channel scales"))
    return scaling


def _recalibrated(model, static, plan_, samples, float_weights, changed: list[str]):
    """The static plan again after AWQ's channel scales went into the float model: the ``changed`` tensors (now
    divided by the scales) and the Div nodes' outputs calibrated anew, every other activation from the cache."""
    for name in changed:
        static.cache.pop(name, None)
    replanned = static_quantization.plan(model, static, samples, float_weights)
    replanned.folding = plan_.folding
    with report.progress(samples.samples, "calibrating the inputs divided by their channel scales",
                         unit="samples") as advance:
        static_quantization.calibrate(replanned, model.model, static, advance, folder=model.data_folder)
    replanned.float_model = import_onnx().ModelProto()
    replanned.float_model.CopyFrom(model.model)
    return replanned


def _pad_channels(source: Path, model, feeds, plan_, folder: Path) -> dict:
    """Zero channels for the convolutions placed in int8 (`onnx_channel_padding`), checked as `_fold` checks its
    rewrite."""
    import onnx

    original = onnx.ModelProto()
    original.CopyFrom(model.model)
    padded = model.pad_channels(plan_.placed.anchors)
    result = {"layers": [{"depthwise": p.depthwise, "dense": p.dense, "channels": p.channels, "to": p.to,
                          "tensors": len(p.tensors)} for p in padded]}
    plan_.real_channels = {name: p.channels for p in padded for name in p.tensors}
    if padded:
        result.update(_still_computes(source, original, model, feeds, folder,
                                      f"padding {len(padded)} regions of convolutions with zero channels",
                                      "the model with zero channels added to its convolutions"))
    return result


def _still_computes(source: Path, original, model, feeds, folder: Path, done: str, changed: str) -> dict:
    """Run the rewritten float model against ``original``: a UserError unless the outputs moved by float
    rounding only. Returns how far they moved (or why it was not run)."""
    if model.stored_bytes > CHECK_LIMIT:
        return {"note": _not_run(model)}
    try:
        with _materialized(model.model, model.base, folder) as after:
            check = evaluation.check_conversion(source if model.external else original, after, feeds)
    except (RuntimeError, OSError) as error:
        raise UserError(f"{source}: {changed} does not run ({error})") from None
    result = {}
    limit = CONVERSION_TOLERANCE * max(1.0, check["scale"])
    if not check["max_difference"] <= limit and not model.external:
        yardstick = _ulp_yardstick(original, feeds)
        result["ulp_yardstick"] = yardstick
        limit = max(limit, FOLD_ULPS * yardstick)
    if not check["max_difference"] <= limit:
        raise UserError(f"{source}: {done} moved output {check['output']} by {check['max_difference']:.3g}, more "
                        f"than float rounding explains; refused")
    result["max_difference"] = check["max_difference"]
    return result


def _ulp_yardstick(model, feeds) -> float:
    """How far one ulp of noise on every float32 weight of ``model`` (stored tensors of 2 or more dimensions,
    initializers and Constant nodes; each nonzero value moved one step up or down, by a fixed seed) moves its
    outputs on ``feeds``: the model's own amplification of float rounding, against which a fold's is judged."""
    from onnx import numpy_helper

    noisy = type(model)()
    noisy.CopyFrom(model)
    rng = np.random.default_rng(0)

    for tensor in stored_constants(noisy.graph).values():  # the graph's own TensorProtos: changed in place
        values = numpy_helper.to_array(tensor) if tensor is not None else None
        if values is None or values.dtype != np.float32 or values.ndim < 2:  # weights only: not bounds or shapes
            continue
        up = rng.integers(0, 2, values.shape, dtype=bool)
        moved = np.where(up, np.nextafter(values, np.float32(np.inf)), np.nextafter(values, np.float32(-np.inf)))
        moved = np.where(np.isfinite(moved) & (values != 0), moved, values)
        tensor.CopyFrom(numpy_helper.from_array(moved.astype(np.float32), tensor.name))
    return evaluation.check_conversion(model, noisy, feeds)["max_difference"]


def _kept_float(choices: list[Choice], model, static, settings: Settings) -> list[Choice]:
    """The weights that stay float besides what --exclude names: those of the nodes --keep-float names, with
    --target onnxruntime those of an image's first convolutions (`placement.onnxruntime`, rules 4 and 5), and
    below 8 bits those of an image's first layers (`_coarse_first_layers`)."""
    reasons = _coarse_first_layers(model, settings)
    if all(c.found.name in reasons for c in choices if c.quantized):
        reasons = {}  # the model is its first layers: no layer after them amplifies their rounding
    if static is not None:
        from .placement import kept_nodes

        if static.target == "onnxruntime":
            reasons.update(placement_onnxruntime.float_first_layers(model.model))
        for node in kept_nodes(model.model, static.keep_float) if static.keep_float else ():
            for name in node.input:
                reasons[name] = f"--keep-float {node.name or node.op_type}"
    return [Choice(c.found, None, reasons[c.found.name], c.symmetric)
            if c.quantized and c.found.name in reasons and not c.found.in_subgraph else c for c in choices]


def _coarse_first_layers(model, settings: Settings) -> dict[str, str]:
    """Weight name -> why it stays float: an image's first convolution and the depthwise ones after it
    (`placement.graph.image_stem`) under integer weight types of 4 bits or fewer (int4, uint4, int2, uint2),
    whose uniform grid of at most 16 levels rounds a few hundred weights coarsely, an error every later layer
    amplifies (BENCHMARKS.md: the recogniser's int4 gptq exact match 84.7-89.3% -> 94.0-97.3% over three
    calibration sets, float 93.3%). So does MXFP4 under the OCP floor rule, which clips a block's largest weights
    to 6/8 of their binade, and in the depthwise layer's one-weight blocks any weight (gptq: recogniser 72.7 ->
    84.7%, held-out lines 60.0 -> 67.0%, detector map 0.872 -> 0.899). The other 4-bit float formats and rules keep
    them quantized: with them float the detector's MXFP4 map under `even` fell from 0.949 to 0.847 and the
    recogniser's NVFP4 exact match measured no better."""
    qtype = settings.qtype
    mxfp4_floor = (settings.mx is not None and settings.mx.name == "mxfp4"
                   and (settings.scale_rule or mx.DEFAULT_SCALE_RULE) == "floor")
    if not mxfp4_floor and (settings.mx is not None or not qtype.is_integer or qtype.bits > 4):
        return {}
    reasons = {}
    for node, _, followers in image_stem(model.model, placement_onnxruntime.FEW_CHANNELS):
        for conv in (node, *followers):
            reasons.setdefault(conv.input[1], f"an image's first layers keep float weights at {settings.dtype_name}"
                                              f"{' under the floor rule' if mxfp4_floor else ''}: "
                                              f"their rounding error is amplified by every layer after it")
    return reasons


def _nothing_to_quantize(model, choices: list[Choice]) -> str:
    if not choices:
        return ("no float constants (initializers or Constant nodes, in any graph): there are no weights to "
                "quantize")
    reasons: dict[str, int] = {}
    for choice in choices:
        reasons[choice.reason] = reasons.get(choice.reason, 0) + 1
    common = sorted(reasons.items(), key=lambda item: -item[1])[:3]
    shown = "; ".join(f"{count} {'is' if count == 1 else 'are'} kept: {reason}" for reason, count in common)
    return (f"nothing to quantize among its {len(choices)} float constants ({shown}); name tensors with "
            f"--include to quantize them anyway")


def _input_names(proto) -> list[str]:
    initializers = {i.name for i in proto.graph.initializer}
    return [i.name for i in proto.graph.input if i.name not in initializers]


def _first_run(feeds: dict, task: evaluation.Task) -> dict:
    """The feeds of the first run of an evaluation (a batch, or the first step of a sequence)."""
    carried = {i for _, i in task.recurrent}
    if task.recurrent:
        return {n: (a if n in carried else a[0]) for n, a in feeds.items()}
    return {n: a[:evaluation.BATCH] for n, a in feeds.items()}


def _check_conversion(source: Path, model, original, feeds, before: int, after: int, folder: Path) -> dict:
    """Run the float model before and after onnx's version converter on the same inputs (the labelled
    data's first run, or made-up inputs that the original model accepts); refuse the conversion when it
    changed what the model computes."""
    if model.stored_bytes > CHECK_LIMIT:
        return {"checked": False, "note": f"{before} -> {after} by onnx's version converter; {_not_run(model)}"}
    candidates = [feeds] if feeds is not None else _made_inputs(original)
    result, failures = None, []
    try:
        with _materialized(model.model, model.base, folder) as converted:
            for candidate in candidates:
                try:
                    result = evaluation.check_conversion(source if model.external else original, converted, candidate)
                    break
                except RuntimeError as error:
                    failures.append(str(error))
    except (RuntimeError, OSError) as error:
        failures.append(str(error))
    if result is None:
        why = failures[-1] if failures and (feeds is not None or "file system" in failures[-1]) else (
            "no inputs it accepts could be made up; --eval data checks it" if candidates else
            "its inputs are not all float or integer tensors; --eval data checks it")
        return {"checked": False, "note": f"{before} -> {after} by onnx's version converter; not checked ({why})"}
    limit = CONVERSION_TOLERANCE * max(1.0, result["scale"])
    if not result["max_difference"] <= limit:
        raise UserError(f"{source}: onnx's version converter (opset {before} -> {after}, which this type and "
                        f"granularity need) changed what the float model computes: output {result['output']} moved "
                        f"by {result['max_difference']:.3g} ({result['runtime']}); the model cannot be raised safely")
    exact = "identical outputs" if result["max_difference"] == 0 else \
        f"outputs within {result['max_difference']:.3g} (float rounding)"
    inputs = "the labelled data's first run" if feeds is not None else "made-up inputs"
    return {"checked": True, "max_difference": result["max_difference"], "runtime": result["runtime"],
            "note": f"{before} -> {after} by onnx's version converter; the float model before and after gives "
                    f"{exact} on {inputs} ({result['runtime']})"}


_MADE_SIZES = (1, 32, 64, 48)  # what a dynamic dimension becomes, tried in turn (the first dimension stays 1)


def _made_inputs(proto) -> list[dict]:
    """Candidate inputs for a model: random floats (zeros for integers) of the declared shapes, each
    dynamic dimension 1 or one of `_MADE_SIZES`. Empty when an input is not a plain tensor."""
    from onnx import helper

    initializers = {i.name for i in proto.graph.initializer}
    declared = []
    for graph_input in proto.graph.input:
        if graph_input.name in initializers:
            continue
        if not graph_input.type.HasField("tensor_type") or not graph_input.type.tensor_type.HasField("shape"):
            return []
        tensor_type = graph_input.type.tensor_type
        try:
            dtype = helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        except (KeyError, ValueError):
            return []
        if not (np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.integer)):
            return []
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tensor_type.shape.dim]
        declared.append((graph_input.name, dtype, dims))
    candidates = []
    for size in _MADE_SIZES:
        rng = np.random.default_rng(0)
        feeds = {}
        for name, dtype, dims in declared:
            shape = [d if d is not None else (1 if axis == 0 else size) for axis, d in enumerate(dims)]
            feeds[name] = (rng.standard_normal(shape).astype(dtype) if np.issubdtype(dtype, np.floating)
                           else np.zeros(shape, dtype))
        candidates.append(feeds)
    return candidates


LINK_OR_COPY_LIMIT = 1 << 30  # bytes of data files copied (when they cannot be linked) to check a conversion


@contextlib.contextmanager
def _materialized(proto, base: Path, folder: Path):
    """A path (or the proto itself, when it has no external data) at which ``proto`` loads with the
    data files it names, which lie in ``base``: a temporary folder in ``folder`` holding the model and
    hard links to the files (onnxruntime and onnx refuse symbolic links that leave the model's folder),
    or copies where the file systems differ and the files are small. A RuntimeError when neither works."""
    locations = _locations(proto)
    if not locations:
        yield proto
        return
    with tempfile.TemporaryDirectory(prefix=".qlinear-", dir=folder) as temporary:
        copied = 0
        for location in locations:
            target, link = base / location, Path(temporary) / location
            link.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(target, link)
            except OSError:
                copied += target.stat().st_size
                if copied > LINK_OR_COPY_LIMIT:
                    raise RuntimeError(f"its data files are on another file system than {folder} and larger "
                                       f"than {LINK_OR_COPY_LIMIT >> 20} MiB") from None
                shutil.copyfile(target, link)
        model_path = Path(temporary) / "model.onnx"
        model_path.write_bytes(proto.SerializeToString())
        yield model_path


def _locations(proto) -> list[str]:
    from onnx.external_data_helper import _get_all_tensors

    return sorted({e.value for t in _get_all_tensors(proto) if t.data_location == 1 for e in t.external_data
                   if e.key == "location"})


def _valid_or_refused(source: Path, model, files, temporaries, external) -> str:
    """onnx.checker's verdict on the written model. Where it fails: the value_info hints are dropped and the model
    written again; where it still fails and the input passes the same check, a UserError (nothing is written).
    An input that fails the checker itself gives an output that may too, and the report says so."""
    verdict = _check(temporaries[-1])
    if verdict == "passed":
        return verdict
    if external is None:
        onnx_model.repair_value_info(model.model)
        changed = onnx_model.repair_output_shapes(model.model)
        files[-1].seek(0)
        files[-1].truncate()
        files[-1].write(onnx_model.serialize(model.model, str(source)))
        files[-1].flush()
        repaired = _check(temporaries[-1])
        if repaired == "passed":
            outputs = f"; output shape{'s' if len(changed) > 1 else ''} {', '.join(changed)} as inferred" if changed else ""
            return f"passed (after dropping the value_info hints{outputs}: the input's failed at the new opset)"
        verdict = repaired
    given = _check(source)
    if given == "passed":
        raise UserError(f"{source}: the quantized model fails onnx.checker's full check "
                        f"({verdict.removeprefix('failed: ')}) where the input passes it; nothing written")
    return f"{verdict} (the input fails it too: {given.removeprefix('failed: ')})"


def _check(model) -> str:
    """onnx.checker's full check (shape inference included) of a model or a model's path."""
    onnx = import_onnx()
    try:
        onnx.checker.check_model(str(model) if isinstance(model, Path) else model, full_check=True)
        return "passed"
    except Exception as error:  # noqa: BLE001 (the checker's several error types)
        return f"failed: {str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__}"


def _needed_opset(settings: Settings, choice: Choice) -> int:
    """The opset a quantized constant's DequantizeLinear needs: its type, granularity and scale type
    (MX: float8e8m0 scales, 24, or 28 for float6; NVFP4: float32 scales of float8e4m3fn block scales and
    float4 codes, 23)."""
    if settings.mx is None:
        return min_opset(settings.qtype, choice.granularity.kind, _SCALE_TYPES[choice.found.type_name])
    if settings.mx.name == "nvfp4":
        return max(min_opset(settings.qtype, "block", "float"), min_opset(dtypes.get("float8e4m3fn"), "tensor"))
    return min_opset(settings.qtype, "block", "float8e8m0")


def _rounded_constant(model, writer, choice: Choice, qtype, settings: Settings, advance, weight_scales,
                      outcome: weight_rounding.Outcome) -> dict:
    """A weight whose codes a rounding method chose (`weight_rounding`): written as they are."""
    found, rounded = choice.found, outcome.rounded
    advance(found.nbytes)
    if settings.mx is not None:
        row = _written_mx(writer, choice, settings, MXQuantized(rounded.codes, rounded.scale, rounded.global_scale,
                                                                outcome.stats))
    else:
        sink, finish = writer.sink(found, qtype)
        sink(rounded.codes)
        row = _written(writer, choice, qtype, settings, finish(), rounded.scale, rounded.zero_point, outcome.stats,
                       weight_scales)
    return row | {"rounding": settings.rounding, "output_sqnr_db": outcome.output_db}


def _quantize_mx_constant(source, model, writer, choice: Choice, settings: Settings, advance) -> dict:
    """An MX (or NVFP4) weight, whole in memory: `quantization.quantize_mx`, then `QdqWriter.replace_mx`."""
    found = choice.found
    x = np.asarray(model.array(found))
    result = quantize_mx(x, choice.granularity, settings.mx, settings.scale_rule, np.dtype(found.dtype))
    advance(found.nbytes)
    del x
    return _written_mx(writer, choice, settings, result)


def _written_mx(writer, choice: Choice, settings: Settings, result: MXQuantized) -> dict:
    """`QdqWriter.replace_mx` with an MX weight's codes and scales; its report row."""
    after = writer.replace_mx(choice.found, settings.mx, result.codes, result.scales, result.global_scale,
                              choice.granularity)
    row = report.quantized_row(choice, settings.qtype, after, Quantized(np.asarray(result.scales), np.zeros((), np.int8),
                                                                        result.stats), to=settings.mx.name)
    if settings.mx.name != "nvfp4":  # the power-of-two scales' rule, which --rounding gptq changes for mxfp4
        row["scale_rule"] = settings.scale_rule or mx.DEFAULT_SCALE_RULE
    return row


def _written(writer, choice: Choice, qtype, settings: Settings, values, scale, zero_point, stats,
             weight_scales: dict | None) -> dict:
    """`QdqWriter.replace` with a weight's values (a TensorProto from `QdqWriter.sink`), scale and zero point;
    its per-axis or per-tensor scale kept for the int32 biases of static quantization; its report row."""
    found, gran = choice.found, choice.granularity
    after = writer.replace(found, values, scale, zero_point if qtype.is_integer else None, gran, qtype)
    if weight_scales is not None and gran.kind in ("axis", "tensor") and not found.in_subgraph:
        weight_scales[found.name] = np.asarray(scale, np.float32)
    return report.quantized_row(choice, qtype, after, Quantized(scale, zero_point, stats), settings.plot)


def _quantize_constant(source, model, writer, choice: Choice, qtype, settings: Settings, advance,
                       weight_scales: dict | None = None, outcome: weight_rounding.Outcome | None = None) -> dict:
    found = choice.found
    if not choice.quantized:
        return report.copied_row(found, choice.reason)
    if outcome is not None and outcome.rounded is not None:
        return _rounded_constant(model, writer, choice, qtype, settings, advance, weight_scales, outcome)
    if outcome is not None:  # rounded to nearest, and the row says why
        row = _quantize_constant(source, model, writer, choice, qtype, settings, advance, weight_scales)
        return row | {"rounding": "rtn", "note": "; ".join(n for n in (row["note"], outcome.note) if n)}
    if settings.mx is not None:
        return _quantize_mx_constant(source, model, writer, choice, settings, advance)
    where = f"{source}: {found.location} {found.name!r}"
    x = model.array(found)
    gran = choice.granularity
    release = tensor_files.page_releaser(x, found) if isinstance(x, np.memmap) and x.ndim else None
    scale_dtype = np.float32 if _SCALE_TYPES[found.type_name] == "float" else found.dtype
    scale, zero_point = calibrate_tensor(where, x, gran, qtype, choice.symmetric, scale_dtype=scale_dtype,
                                         progress=advance, release=release)
    sink, finish = writer.sink(found, qtype)
    stats = quantize_tensor(x, gran, qtype, scale, zero_point, sink, plot=settings.plot, progress=advance,
                            release=release)
    del x
    return _written(writer, choice, qtype, settings, finish(), scale, zero_point, stats, weight_scales)


def _measure(measure: Evaluation, original, quantized, input_names: list[str], model) -> dict:
    if measure.data is None:
        return {"accuracy": None, "accuracy_note": measure.note}
    output_names = [o.name for o in model.model.graph.output]
    characters = None
    for prop in model.model.metadata_props:
        if prop.key == "character":
            characters = prop.value.splitlines()
    return evaluation.evaluate(original, quantized, measure.data, input_names, output_names, measure.task, characters)
