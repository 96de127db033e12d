"""`qlinear quantize` and `qlinear dequantize`: checking the arguments, choosing the tensors, running
the per-tensor work (`qlinear.io.tensors`) between a reader and a writer (`qlinear.io.formats`), and
handing the figures to `qlinear.report`.

Everything that can be checked before writing is checked first (the type name, the granularity of
every tensor, name clashes, the output path), so a user error leaves nothing behind.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from fnmatch import fnmatchcase
from pathlib import Path

import numpy as np

from .. import dtypes, report
from ..granularity import Granularity
from . import chunked, formats, tensors
from .atomic import atomic_output, check_output
from .errors import UserError

FORMAT_VERSION = "qlinear.quantized/1"


def parse_qtype(name: str):
    try:
        qtype = dtypes.resolve_dtype(name, "--dtype", "qlinear quantize")
    except (ValueError, TypeError):
        raise UserError(f"--dtype {name!r} is not a type name qlinear knows; the quantized types are "
                        f"{', '.join(tensors.quantized_types())}") from None
    if qtype.onnx_name not in tensors.quantized_types():
        raise UserError(f"--dtype {name!r}: {qtype.onnx_name} is not a quantized type; the quantized types are "
                        f"{', '.join(tensors.quantized_types())}")
    return qtype


def parse_settings(args, qtype) -> tensors.Settings:
    kind = args.granularity
    block_size = args.block_size
    if block_size is not None and block_size <= 0:
        raise UserError(f"--block-size must be a positive integer, got {block_size}")
    if kind is None:
        kind = "block" if block_size is not None else "axis" if args.axis is not None else "tensor"
    if kind == "block" and block_size is None:
        raise UserError("--granularity block needs --block-size B")
    if kind != "block" and block_size is not None:
        raise UserError(f"--block-size applies to blocked quantization, not --granularity {kind}")
    if kind == "tensor" and args.axis is not None:
        raise UserError("--axis applies to --granularity axis or block, not tensor")
    return tensors.Settings(qtype, kind, args.axis, block_size or 0, bool(args.symmetric))


def selection_reason(name: str, include: list[str], exclude: list[str]) -> str | None:
    """Why a tensor is left alone by the name globs, or None when they select it."""
    if include and not any(fnmatchcase(name, glob) for glob in include):
        return "not matched by --include"
    if any(fnmatchcase(name, glob) for glob in exclude):
        return "matched by --exclude"
    return None


def granularity_label(gran: Granularity) -> str:
    if gran.kind == "tensor":
        return "per-tensor"
    if gran.kind == "axis":
        return f"per-axis (axis {gran.axis})"
    return f"blocked (axis {gran.axis}, {gran.block_size})"


def _default_output(source: Path, qtype, kind: str) -> Path:
    suffix = ".npz" if kind == "npy" else source.suffix
    return source.with_name(f"{source.stem}.{qtype.onnx_name}{suffix}")


def _check_plot_support(args) -> None:
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UserError("--plot needs matplotlib: pip install 'qlinear[plot]'") from None
        plot_dir = Path(args.plot)
        if plot_dir.exists() and not plot_dir.is_dir():
            raise UserError(f"--plot {plot_dir}: exists and is not a folder")


def quantize_command(args) -> int:
    source = Path(args.input)
    kind = formats.format_of(source)
    if not source.exists():
        raise UserError(f"{source}: no such file")
    qtype = parse_qtype(args.dtype)
    settings = parse_settings(args, qtype)
    if args.min_elements is not None and args.min_elements < 0:
        raise UserError(f"--min-elements must be >= 0, got {args.min_elements}")
    chunk_size = chunked.chunk_setting(args)
    if kind == "onnx" and chunk_size is not None:
        raise UserError("--chunks applies to tensor files and .zarr stores, not ONNX models")
    output = Path(args.output) if args.output else _default_output(source, qtype, kind)
    if kind == "zarr":
        chunked.check_output_store(output, source, args.force)
        _check_plot_support(args)
        result = chunked.quantize_store(source, output, settings, args, chunk_size,
                                        lambda name, dtype, shape: _store_selection(name, dtype, shape, args))
        report.show(result, as_json=args.json)
        if args.plot:
            report.plot(result, Path(args.plot))
        return 0
    expected = {"npy": "npz"}.get(kind, kind)
    if formats.format_of(output) != expected:
        extra = " (a .npy holds a single array, so the quantized values, scale and zero point go to a .npz)" if kind == "npy" else ""
        raise UserError(f"{output}: the output of a .{kind} input is a .{expected} file{extra}")
    check_output(output, [source], args.force)
    _check_plot_support(args)
    if kind == "onnx":
        from .onnx_model import quantize_model

        result = quantize_model(source, output, settings, args)
    else:
        result = quantize_tensor_file(source, output, kind, settings, args)
    report.show(result, as_json=args.json)
    if args.plot:
        report.plot(result, Path(args.plot))
    return 0


def _store_selection(name: str, dtype, shape, args) -> str | None:
    """Why a zarr array is copied rather than quantized (None: it is quantized)."""
    if np.dtype(dtype) not in formats.FLOAT_DTYPES:
        return f"{np.dtype(dtype)} is not a float type"
    size = int(np.prod(shape))
    if size == 0:
        return "empty"
    reason = selection_reason(name, args.include, args.exclude)
    min_elements = 1 if args.min_elements is None else args.min_elements
    if reason is None and size < min_elements:
        reason = f"{size} elements, below --min-elements {min_elements}"
    return reason


def quantize_tensor_file(source: Path, output: Path, kind: str, settings: tensors.Settings, args) -> dict:
    reader = formats.open_tensor_file(source)
    if "qlinear" in reader.metadata:
        raise UserError(f"{source}: was written by qlinear quantize; run qlinear dequantize on it first")
    min_elements = 1 if args.min_elements is None else args.min_elements
    names = {entry.name for entry in reader.entries}
    qtype = settings.qtype
    jobs = []
    for entry in reader.entries:
        reason = None
        if not entry.is_float:
            reason = f"{entry.code or entry.dtype} is not a float type"
        elif entry.size == 0:
            reason = "empty"
        else:
            reason = selection_reason(entry.name, args.include, args.exclude)
            if reason is None and entry.size < min_elements:
                reason = f"{entry.size} elements, below --min-elements {min_elements}"
        if reason is not None:
            jobs.append((entry, None, reason))
            continue
        where = f"{source}: tensor {entry.name!r}"
        default_axis = 0 if settings.kind == "axis" else -1
        gran = tensors.resolve_granularity(where, entry.shape, settings, default_axis)
        for suffix in (".scale", ".zero_point"):
            if entry.name + suffix in names:
                raise UserError(f"{where}: the file already has a tensor named {entry.name + suffix!r}, where the "
                                f"{suffix[1:]} would go")
        jobs.append((entry, gran, None))

    plan, meta_tensors, copied = [], {}, []
    for entry, gran, reason in jobs:
        if gran is None:
            plan.append(formats.Planned(entry.name, entry.dtype, entry.shape, entry.nbytes, entry.code))
            copied.append(entry.name)
            continue
        stored_dtype, stored_shape = _storage(qtype, entry.shape)
        param_shape = gran.param_shape if entry.shape else ()
        zp_dtype, zp_shape = _storage(qtype, param_shape)
        plan += [
            formats.Planned(entry.name, stored_dtype, stored_shape, tensors.stored_size(qtype, entry.shape)),
            formats.Planned(entry.name + ".scale", np.dtype(np.float32), param_shape, 4 * int(np.prod(param_shape))),
            formats.Planned(entry.name + ".zero_point", zp_dtype, zp_shape, tensors.stored_size(qtype, param_shape)),
        ]
        meta_tensors[entry.name] = {
            "dtype": qtype.onnx_name, "shape": list(entry.shape), "source_dtype": entry.dtype.name,
            "granularity": gran.kind if entry.shape else "tensor",
            "axis": gran.axis, "block_size": gran.block_size, "symmetric": settings.symmetric,
            "packed": qtype.packs, "scale": entry.name + ".scale", "zero_point": entry.name + ".zero_point",
            "opset": tensors.min_opset(qtype, gran.kind if entry.shape else "tensor"),
        }
    metadata = {k: v for k, v in reader.metadata.items()}
    metadata["qlinear"] = json.dumps({"format": FORMAT_VERSION, "tensors": meta_tensors, "copied": copied})

    rows = []
    total = sum(entry.nbytes for entry, gran, _ in jobs if gran is not None)
    with report.progress(total, f"quantizing {source.name}") as advance, atomic_output(output) as f:
        writer = formats.WRITERS["npz" if kind == "npy" else kind](f, plan, metadata)
        with _aborting(writer):
            _write_quantized(source, reader, writer, jobs, qtype, settings, args, advance, rows)
    reader.close()
    return report.summary("quantize", source, output, rows, qtype=qtype.onnx_name)


@contextmanager
def _aborting(writer):
    try:
        yield
    except BaseException:
        if hasattr(writer, "abort"):
            writer.abort()
        raise


def _write_quantized(source, reader, writer, jobs, qtype, settings, args, advance, rows):
    for entry, gran, reason in jobs:
        if gran is None:
            formats.copy_raw(reader, entry, writer)
            rows.append(report.copied_row(entry.name, entry.shape, str(entry.code or entry.dtype), entry.nbytes, reason))
            continue
        where = f"{source}: tensor {entry.name!r}"
        x = reader.array(entry)
        writer.begin(entry.name)
        chunk_size = chunked.dask_chunking(args, entry.nbytes)
        if chunk_size is not None:
            result = chunked.quantize_tensor_dask(
                where, x, gran, qtype, settings.symmetric, chunk_size, writer.write, progress=advance,
                release=None if x.ndim == 0 else formats.page_releaser(x, entry))
        else:
            result = tensors.quantize_tensor(
                where, x, gran, qtype, settings.symmetric,
                sink=lambda q: writer.write(tensors.to_storage(q, qtype)),
                plot=bool(args.plot), progress=advance,
                release=None if x.ndim == 0 else formats.page_releaser(x, entry),
            )
        writer.end()
        del x
        writer.begin(entry.name + ".scale")
        writer.write(result.scale)
        writer.end()
        writer.begin(entry.name + ".zero_point")
        writer.write(tensors.to_storage(result.zero_point, qtype))
        writer.end()
        after = tensors.stored_size(qtype, entry.shape) + result.scale.nbytes + tensors.stored_size(qtype, result.scale.shape)
        rows.append(report.quantized_row(entry.name, entry.shape, entry.dtype.name, qtype, granularity_label(gran) if entry.shape else "per-tensor",
                                         entry.nbytes, after, result, gran, settings.symmetric))
    writer.close()


def _storage(qtype, shape):
    """The dtype and shape a file stores a quantized array of ``shape`` as."""
    if qtype.packs:
        return np.dtype(np.uint8), (tensors.stored_size(qtype, shape),)
    if not qtype.is_integer:
        return np.dtype(np.uint8), tuple(shape)
    return qtype.dtype, tuple(shape)


def dequantize_command(args) -> int:
    source = Path(args.input)
    kind = formats.format_of(source)
    if kind == "zarr":
        if not source.exists():
            raise UserError(f"{source}: no such file")
        output = Path(args.output)
        chunked.check_output_store(output, source, args.force)
        report.show(chunked.dequantize_store(source, output, args), as_json=args.json)
        return 0
    if kind not in ("npz", "safetensors"):
        raise UserError(f"{source}: qlinear dequantize reads the .npz and .safetensors files that qlinear quantize "
                        f"writes, not .{kind}")
    if not source.exists():
        raise UserError(f"{source}: no such file")
    output = Path(args.output)
    out_kind = formats.format_of(output)
    if out_kind == "onnx":
        raise UserError(f"{output}: qlinear dequantize writes tensor files (.npy, .npz, .safetensors), not ONNX models")
    check_output(output, [source], args.force)
    reader = formats.open_tensor_file(source)
    if "qlinear" not in reader.metadata:
        raise UserError(f"{source}: has no qlinear metadata; it was not written by qlinear quantize")
    try:
        meta = json.loads(reader.metadata["qlinear"])
        quantized = meta["tensors"]
        if meta.get("format") != FORMAT_VERSION:
            raise ValueError(f"unknown format {meta.get('format')!r}")
    except (ValueError, KeyError, TypeError) as error:
        raise UserError(f"{source}: corrupt qlinear metadata ({error})") from None
    entries = {entry.name: entry for entry in reader.entries}
    auxiliary = set()
    jobs = []
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
        if tuple(scale.shape) != gran.param_shape or values.nbytes != tensors.stored_size(qtype, shape):
            raise UserError(f"{source}: tensor {name!r}: its values or scale do not match the shape {list(shape)} "
                            f"and granularity in the metadata")
        jobs.append((name, qtype, shape, out_dtype, gran, values, scale, zero))
    by_name = {job[0]: job for job in jobs}
    plan, order = [], []
    for entry in reader.entries:
        if entry.name in auxiliary:
            continue
        if entry.name in by_name:
            _, qtype, shape, out_dtype, gran, *_ = by_name[entry.name]
            plan.append(formats.Planned(entry.name, out_dtype, shape, int(np.prod(shape)) * out_dtype.itemsize))
        else:
            plan.append(formats.Planned(entry.name, entry.dtype, entry.shape, entry.nbytes, entry.code))
        order.append(entry)
    if out_kind == "npy" and len(plan) != 1:
        raise UserError(f"{output}: a .npy file holds one array and {source} has {len(plan)} tensors; write a .npz")
    metadata = {k: v for k, v in reader.metadata.items() if k != "qlinear"}
    rows = []
    total = sum(p.nbytes for p in plan if p.name in by_name)
    with report.progress(total, f"dequantizing {source.name}") as advance, atomic_output(output) as f:
        writer = formats.WRITERS[out_kind](f, plan, metadata)
        for entry in order:
            if entry.name not in by_name:
                formats.copy_raw(reader, entry, writer)
                rows.append(report.copied_row(entry.name, entry.shape, str(entry.code or entry.dtype), entry.nbytes, "copied"))
                continue
            name, qtype, shape, out_dtype, gran, values, scale, zero = by_name[name := entry.name]
            scale_array = np.asarray(reader.array(scale))
            zero_raw = np.asarray(reader.array(zero))
            if qtype.packs:
                zero_array = _unpack(zero_raw, qtype, scale_array.shape)
            else:
                zero_array = zero_raw.view(qtype.dtype).reshape(scale_array.shape)
            writer.begin(name)
            tensors.dequantize_tensor(reader.array(values), qtype, shape, scale_array, zero_array, gran,
                                      out_dtype, sink=writer.write, progress=advance)
            writer.end()
            rows.append(report.restored_row(name, shape, qtype.onnx_name, out_dtype.name, values.nbytes + scale.nbytes + zero.nbytes,
                                            int(np.prod(shape)) * out_dtype.itemsize))
        writer.close()
    reader.close()
    report.show(report.summary("dequantize", source, output, rows), as_json=args.json)
    return 0


def _unpack(raw, qtype, shape):
    from ..packing import unpack

    return unpack(raw.reshape(-1), qtype.dtype, shape)
