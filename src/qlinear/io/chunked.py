"""Tensors larger than memory: ``qlinear quantize --chunks SIZE`` and zarr stores, through dask.

A tensor goes through dask when ``--chunks`` is given, when it is stored in zarr, or (without --plot)
when it is larger than `AUTO_BYTES`. The work is then:

1. calibration as dask reductions (min and max per group, both computed in one pass over the data);
2. `qlinear.quantize_linear` on the dask array (lazy, chunk by chunk, the same kernels as NumPy), with
   the error figures of the report (sum of x², sum of squared error, max |error|) as lazy reductions
   of `qlinear.dequantize_linear` of the same chunks;
3. storing, chunk by chunk: into a zarr array (in parallel), or, for .npz/.safetensors outputs whose
   writers take a tensor in order, band of rows after band of rows.

SIZE is bytes of input per chunk with a unit (``256MiB``, ``1GB``, ``64KiB``, ``512B``) or a bare
element count (``1000000``). Chunks are chosen by dask's "auto" rule under that limit, following a
zarr array's own chunks; for blocked quantization their edges along the blocked axis are multiples of
the block size (a block is never split). Peak memory is a few chunks per worker thread (the float64
error figures are the largest temporaries), not the tensor, plus the scales and zero points and, for
blocked quantization, the float64 per-block ranges they are computed from (1/16 of a float32 input
each with blocks of 32).

zarr layout (INPUT a directory ending in .zarr holding one array, or a group of named arrays, nested
groups included): the output is a zarr group with, per quantized tensor NAME, the array NAME, NAME.scale
(float32) and NAME.zero_point, and in the group's attributes under "qlinear" the same metadata as the
other formats (`qlinear.io.commands.FORMAT_VERSION`). Quantized values are stored one element per
byte, never packed, so that every chunk stays independently readable and writable: int4/uint4/int2/
uint2 as int8/uint8 values, float8/float6/float4 codes as their bit patterns in uint8. The output is
written to a hidden temporary store beside OUTPUT and renamed at the end (as `qlinear.io.atomic`).
"""

from __future__ import annotations

import math
import os
import re
import shutil
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from .. import calibrate, dtypes, report
from ..granularity import Granularity
from . import tensors
from .errors import UserError

AUTO_BYTES = 1 << 30  # tensors above this go through dask without --chunks
DEFAULT_CHUNK_BYTES = 64 << 20  # per chunk of input, when dask is used without --chunks

_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+)\s*([a-zA-Z]*)\s*$")


class ChunkSize:
    """A parsed --chunks value: ``nbytes`` of input per chunk, or ``elements`` per chunk."""

    def __init__(self, nbytes: int | None = None, elements: int | None = None):
        self.nbytes, self.elements = nbytes, elements

    def limit(self, itemsize: int) -> int:
        """Bytes of input per chunk for elements of ``itemsize`` bytes."""
        return self.nbytes if self.nbytes is not None else self.elements * itemsize


def parse_chunks(text: str) -> ChunkSize:
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or (unit and unit not in _UNITS):
        raise UserError(f"--chunks {text!r}: give an element count (e.g. 1000000) or a size with a unit "
                        f"(e.g. 256MiB, 1GB; units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    count = int(match.group(1))
    if count <= 0:
        raise UserError(f"--chunks {text!r}: must be positive")
    return ChunkSize(nbytes=count * _UNITS[unit]) if unit else ChunkSize(elements=count)


def chunk_setting(args) -> ChunkSize | None:
    """The --chunks value of ``args`` (None when not given); a UserError for a bad one or missing dask."""
    text = getattr(args, "chunks", None)
    if text is None:
        return None
    size = parse_chunks(text)
    if getattr(args, "plot", None):
        raise UserError("--plot draws from whole tensors in memory and cannot be combined with --chunks")
    require_dask("--chunks")
    return size


def require_dask(what: str):
    try:
        import dask.array as da
    except ImportError:
        raise UserError(f"{what} needs dask: pip install 'qlinear[dask]'") from None
    return da


def require_zarr(what: str):
    require_dask(what)
    try:
        import zarr
    except ImportError:
        raise UserError(f"{what} needs zarr: pip install 'qlinear[dask]'") from None
    return zarr


def dask_chunking(args, nbytes: int) -> ChunkSize | None:
    """How a tensor of ``nbytes`` is chunked: --chunks, or the default above `AUTO_BYTES` when dask is
    installed and --plot is not asked for; None for the in-memory path."""
    size = chunk_setting(args)
    if size is not None:
        return size
    if nbytes > AUTO_BYTES and not getattr(args, "plot", None):
        try:
            import dask.array  # noqa: F401
        except ImportError:  # the NumPy path streams memory maps as well, only serially
            return None
        return ChunkSize(nbytes=DEFAULT_CHUNK_BYTES)
    return None


# ----------------------------------------------------------------------------------------------------
# The dask graph of one tensor


def chunks_for(shape, dtype, size: ChunkSize, gran: Granularity, previous=None, rows_only: bool = False):
    """dask chunks for ``shape`` under ``size``: dask's auto rule (following ``previous``, a zarr
    array's chunks), or whole rows when ``rows_only``; blocked axes cut on block edges."""
    from dask.array.core import normalize_chunks

    dtype = np.dtype(dtype)
    limit = max(1, size.limit(dtype.itemsize))
    if rows_only:
        row_bytes = dtype.itemsize * max(1, math.prod(shape[1:]))
        rows = max(1, limit // row_bytes)
        if gran.kind == "block" and gran.axis == 0:
            rows = max(1, rows // gran.block_size) * gran.block_size
        return normalize_chunks((rows,) + tuple(shape[1:]), shape)
    chunks = normalize_chunks("auto", shape, limit=limit, dtype=dtype, previous_chunks=previous)
    if gran.kind == "block":
        step = max(1, chunks[gran.axis][0] // gran.block_size) * gran.block_size
        chunks = chunks[:gran.axis] + (normalize_chunks((step,), (shape[gran.axis],))[0],) + chunks[gran.axis + 1:]
    return chunks


def lazy_ranges(x, gran: Granularity):
    """Lazy (min, max) per group of a dask array chunked on block edges (float64 after compute)."""
    if gran.kind == "tensor":
        return x.min(), x.max()
    if gran.kind == "axis":
        others = tuple(i for i in range(x.ndim) if i != gran.axis)
        return x.min(axis=others), x.max(axis=others)
    # Blocks: each chunk holds whole blocks along the axis, so each reduces on its own.
    chunks = list(x.chunks)
    chunks[gran.axis] = tuple(-(-c // gran.block_size) for c in x.chunks[gran.axis])

    def reducer(how):
        def reduce(chunk):
            return calibrate.reduce_groups(chunk, Granularity("block", chunk.shape, gran.axis, gran.block_size), how)
        return x.map_blocks(reduce, chunks=tuple(chunks), dtype=np.float64)
    return reducer("min"), reducer("max")


def calibrate_dask(where: str, x, gran: Granularity, qtype, symmetric: bool):
    import dask

    low, high = dask.compute(*lazy_ranges(x, gran))
    try:
        return calibrate.parameters(np.asarray(low, np.float64), np.asarray(high, np.float64), qtype, symmetric)
    except ValueError:
        raise UserError(f"{where} holds NaN or infinite values, which have no scale; --exclude it") from None


def quantize_graph(x, gran: Granularity, qtype, scale, zero_point):
    """Lazy quantized values of dask ``x`` and the lazy error figures (signal, noise, max |error|)."""
    from ..ops.quantize_linear import dequantize_linear, quantize_linear

    attrs = gran.attributes()
    x32 = x.astype(np.float32)
    if qtype.is_integer:
        q = quantize_linear(x32, scale, zero_point, **attrs)
        restored = dequantize_linear(q, scale, zero_point, **attrs)
    else:
        q = quantize_linear(x32, scale, output_dtype=qtype.onnx_name, **attrs)
        restored = dequantize_linear(q, scale, **attrs)
    x64 = x.astype(np.float64)
    error = x64 - restored.astype(np.float64)
    return q, ((x64 * x64).sum(), (error * error).sum(), abs(error).max())


def _stats(signal, noise, max_abs_error) -> tensors.Stats:
    return tensors.Stats(signal=float(signal), noise=float(noise), max_abs_error=float(max_abs_error))


def storage_dtype(qtype) -> np.dtype:
    """The dtype zarr stores ``qtype`` as (one element per byte for the sub-byte and float types)."""
    if not qtype.is_integer:
        return np.dtype(np.uint8)
    if qtype.bits < 8:
        return np.dtype(np.int8) if qtype.qmin < 0 else np.dtype(np.uint8)
    return np.dtype(qtype.dtype)


def to_zarr_storage(q, qtype):
    if not qtype.is_integer:
        return q.view(np.uint8)
    return q.astype(storage_dtype(qtype))


def from_zarr_storage(stored, qtype):
    if not qtype.is_integer:
        return stored.view(qtype.dtype)
    return stored.astype(qtype.dtype)


class _PackingSink:
    """Packs a stream of quantized chunks into one continuous packed byte stream (chunks whose element
    count is not a multiple of the elements per byte carry their remainder into the next one)."""

    def __init__(self, write, qtype):
        self.write, self.qtype = write, qtype
        self.unit = 8 // math.gcd(qtype.bits, 8)  # elements per whole number of bytes
        self.rest = None

    def __call__(self, q):
        flat = q.reshape(-1)
        if self.rest is not None:
            flat = np.concatenate([self.rest, flat])
        whole = flat.size // self.unit * self.unit
        if whole:
            self.write(tensors.to_storage(flat[:whole], self.qtype))
        self.rest = flat[whole:] if whole < flat.size else None

    def close(self):
        if self.rest is not None:
            self.write(tensors.to_storage(self.rest, self.qtype))
            self.rest = None


class _ReleasingRows:
    """Rows of a memory map read as copies, after which their pages are released (``release`` from
    `formats.page_releaser`), so the resident memory of a pass stays near the chunks in flight."""

    def __init__(self, x, release):
        self.x, self.release = x, release
        self.shape, self.dtype, self.ndim = x.shape, x.dtype, x.ndim

    def __getitem__(self, key):
        rows = np.array(self.x[key])
        first = key[0] if isinstance(key, tuple) else key
        if isinstance(first, slice):
            start, stop, _ = first.indices(self.shape[0])
            self.release(start, stop)
        return rows


def quantize_tensor_dask(where: str, x, gran: Granularity, qtype, symmetric: bool, size: ChunkSize, write,
                         progress=None, release=None) -> tensors.Quantized:
    """`tensors.quantize_tensor` through dask for an array with NumPy slicing (a memory map): chunks
    of whole rows, computed one band after another so that ``write`` receives the stored bytes in order.
    ``release(start_row, stop_row)``, when given, drops the pages of rows once read."""
    import dask
    import dask.array as da

    scalar = x.ndim == 0
    if scalar:
        x = x.reshape(1)
        gran = Granularity("tensor", (1,))
        release = None
    chunks = chunks_for(tuple(x.shape), x.dtype, size, gran, rows_only=True)
    source = _ReleasingRows(x, release) if release is not None else x
    # An explicit name: dask would otherwise tokenize the array by hashing (for the wrapper: pickling) its data.
    lazy = da.from_array(source, chunks=chunks, asarray=True, lock=False, meta=np.empty((0,) * x.ndim, x.dtype),
                         name=f"qlinear-rows-{uuid.uuid4().hex}")
    scale, zero_point = calibrate_dask(where, lazy, gran, qtype, symmetric)
    if progress is not None:
        progress(x.nbytes / 2)
    sink = _PackingSink(write, qtype) if qtype.packs else (lambda chunk: write(tensors.to_storage(chunk, qtype)))
    stats = tensors.Stats()
    row_bytes = x.dtype.itemsize * max(1, math.prod(x.shape[1:]))
    start = 0
    for rows in lazy.chunks[0]:
        stop = start + rows
        band = Granularity(gran.kind, (rows,) + tuple(x.shape[1:]), gran.axis, gran.block_size)
        q, figures = quantize_graph(lazy[start:stop], band, qtype, _band_param(scale, gran, start, stop),
                                    _band_param(zero_point, gran, start, stop))
        values, signal, noise, max_error = dask.compute(q, *figures)
        stats.signal += float(signal)
        stats.noise += float(noise)
        stats.max_abs_error = max(stats.max_abs_error, float(max_error))
        sink(values.reshape(()) if scalar else values)
        if progress is not None:
            progress((stop - start) * row_bytes / 2)
        start = stop
    if qtype.packs:
        sink.close()
    if scalar:
        scale, zero_point = scale.reshape(()), zero_point.reshape(())
    return tensors.Quantized(scale, zero_point, stats)


def _band_param(param, gran: Granularity, start: int, stop: int):
    """The part of a scale or zero point that covers rows [start, stop)."""
    if gran.kind == "tensor" or (gran.kind == "axis" and gran.axis != 0):
        return param
    if gran.kind == "block" and gran.axis == 0:
        return param[start // gran.block_size: -(-stop // gran.block_size)]
    return param[start:stop]


# ----------------------------------------------------------------------------------------------------
# zarr stores


def is_zarr(path: Path) -> bool:
    return path.suffix.lower() == ".zarr"


def check_output_store(output: Path, source: Path, force: bool) -> None:
    if not is_zarr(output):
        raise UserError(f"{output}: the output of a .zarr input is a .zarr store")
    if output.exists() and source.exists() and os.path.samefile(output, source):
        raise UserError(f"{output}: is the input store; qlinear never overwrites its input")
    if output.exists() and not force:
        raise UserError(f"{output}: already exists; pass --force to overwrite it")
    if output.exists() and not output.is_dir():
        raise UserError(f"{output}: exists and is not a folder")
    if not output.parent.is_dir():
        raise UserError(f"{output}: the folder {output.parent} does not exist")


@contextmanager
def atomic_store(output: Path):
    """Yields the path of a temporary folder beside ``output``; on success it becomes ``output``
    (an existing ``output`` is moved aside first and removed after the rename)."""
    try:
        temporary = Path(tempfile.mkdtemp(dir=output.parent, prefix=f".{output.name}.", suffix=".partial"))
    except OSError as error:
        raise UserError(f"{output}: cannot write in {output.parent} ({error.strerror})") from None
    try:
        yield temporary
        os.chmod(temporary, 0o777 & ~_umask())
        old = None
        if output.exists():
            old = Path(tempfile.mkdtemp(dir=output.parent, prefix=f".{output.name}.", suffix=".old"))
            os.rmdir(old)
            os.replace(output, old)
        os.replace(temporary, output)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def open_store(source: Path):
    """(arrays, attributes, root_array): the arrays of a zarr store by path name, in order."""
    zarr = require_zarr("reading .zarr stores")
    try:
        node = zarr.open(str(source), mode="r")
    except Exception as error:  # noqa: BLE001 (zarr raises several types for a folder that is not a store)
        raise UserError(f"{source}: not a zarr store ({type(error).__name__}: {error})") from None
    if isinstance(node, zarr.Array):
        return {source.stem: node}, dict(node.attrs), True
    arrays = {path: array for path, array in sorted(node.arrays(), key=lambda item: item[0])}
    for path, group in node.groups():  # nested groups: arrays under "group/name"
        for sub, array in _arrays_under(group, path):
            arrays[sub] = array
    return arrays, dict(node.attrs), False


def _arrays_under(group, prefix):
    for name, array in sorted(group.arrays(), key=lambda item: item[0]):
        yield f"{prefix}/{name}", array
    for name, sub in group.groups():
        yield from _arrays_under(sub, f"{prefix}/{name}")


def _create(group, name, shape, chunks, dtype, attributes=None):
    array = group.create_array(name, shape=tuple(shape), chunks=tuple(chunks) if shape else (), dtype=dtype,
                               fill_value=0)
    if attributes:
        array.attrs.update(attributes)
    return array


def _regular(chunks) -> tuple[int, ...]:
    return tuple(int(c[0]) if c else 1 for c in chunks)


def _store(array, target, progress=None, extra=(), done_bytes=None):
    """Store dask ``array`` into zarr ``target`` (chunks made to match the target's) with ``extra`` lazy
    values computed in the same pass; returns their values. ``progress`` is then told ``done_bytes``
    (default: the array's bytes)."""
    import dask
    import dask.array as da

    if array.ndim and array.chunks != da.core.normalize_chunks(target.chunks, array.shape):
        array = array.rechunk(target.chunks)
    stored = da.store(array, target, lock=False, compute=False)
    results = dask.compute(stored, *extra)
    if progress is not None:
        progress(array.nbytes if done_bytes is None else done_bytes)
    return results[1:]


def quantize_store(source: Path, output: Path, settings, args, size: ChunkSize | None, select) -> dict:
    """`qlinear quantize` of a zarr store. ``select(name, dtype, shape) -> reason | None`` picks the tensors."""
    import dask.array as da
    zarr = require_zarr("reading .zarr stores")
    from .commands import FORMAT_VERSION, granularity_label

    arrays, attributes, root_array = open_store(source)
    if "qlinear" in attributes:
        raise UserError(f"{source}: was written by qlinear quantize; run qlinear dequantize on it first")
    size = size or ChunkSize(nbytes=DEFAULT_CHUNK_BYTES)
    qtype = settings.qtype
    jobs = []
    for name, array in arrays.items():
        reason = select(name, array.dtype, tuple(array.shape))
        if reason is None:
            where = f"{source}: tensor {name!r}"
            default_axis = 0 if settings.kind == "axis" else -1
            gran = tensors.resolve_granularity(where, tuple(array.shape), settings, default_axis)
            for suffix in (".scale", ".zero_point"):
                if name + suffix in arrays:
                    raise UserError(f"{where}: the store already has an array named {name + suffix!r}, where the "
                                    f"{suffix[1:]} would go")
            jobs.append((name, array, gran, None))
        else:
            jobs.append((name, array, None, reason))

    meta_tensors, copied, rows = {}, [], []
    total = sum(array.nbytes for _, array, gran, _ in jobs)
    with report.progress(total, f"quantizing {source.name}") as advance, atomic_store(output) as temporary:
        group = zarr.open_group(str(temporary), mode="w")
        for name, array, gran, reason in jobs:
            lazy = da.from_zarr(array)
            if gran is None:
                target = _create(group, name, array.shape, array.chunks, array.dtype, dict(array.attrs))
                _store(lazy, target, advance)
                copied.append(name)
                rows.append(report.copied_row(name, tuple(array.shape), str(array.dtype), array.nbytes, reason))
                continue
            where = f"{source}: tensor {name!r}"
            shape = tuple(array.shape)
            work_gran = gran if shape else Granularity("tensor", ())
            chunks = chunks_for(shape, array.dtype, size, work_gran, previous=array.chunks) if shape else ()
            lazy = lazy.rechunk(chunks) if shape else lazy
            scale, zero_point = calibrate_dask(where, lazy, work_gran, qtype, settings.symmetric)
            q, figures = quantize_graph(lazy, work_gran, qtype, scale, zero_point)
            target = _create(group, name, shape, _regular(chunks), storage_dtype(qtype), dict(array.attrs))
            stats = _stats(*_store(to_zarr_storage(q, qtype), target, advance, figures, done_bytes=array.nbytes))
            group.create_array(name + ".scale", data=np.asarray(scale, np.float32))
            group.create_array(name + ".zero_point", data=np.asarray(to_zarr_storage(zero_point, qtype)))
            kind = gran.kind if shape else "tensor"
            meta_tensors[name] = {
                "dtype": qtype.onnx_name, "shape": list(shape), "source_dtype": np.dtype(array.dtype).name,
                "granularity": kind, "axis": gran.axis, "block_size": gran.block_size,
                "symmetric": settings.symmetric, "packed": False, "scale": name + ".scale",
                "zero_point": name + ".zero_point", "opset": tensors.min_opset(qtype, kind),
            }
            after = math.prod(shape) * storage_dtype(qtype).itemsize + scale.nbytes + zero_point.size * storage_dtype(qtype).itemsize
            rows.append(report.quantized_row(name, shape, np.dtype(array.dtype).name, qtype,
                                             granularity_label(gran) if shape else "per-tensor", array.nbytes, after,
                                             tensors.Quantized(scale, zero_point, stats), gran, settings.symmetric))
        group.attrs.update({**attributes, "qlinear": {
            "format": FORMAT_VERSION, "tensors": meta_tensors, "copied": copied, "root_array": root_array}})
    return report.summary("quantize", source, output, rows, qtype=qtype.onnx_name)


def dequantize_store(source: Path, output: Path, args) -> dict:
    """`qlinear dequantize` of a zarr store written by `quantize_store`."""
    import dask.array as da
    zarr = require_zarr("reading .zarr stores")
    from ..ops.quantize_linear import dequantize_linear
    from .commands import FORMAT_VERSION

    arrays, attributes, _ = open_store(source)
    try:
        meta = attributes["qlinear"]
        if meta.get("format") != FORMAT_VERSION:
            raise ValueError(f"unknown format {meta.get('format')!r}")
        quantized = meta["tensors"]
    except KeyError:
        raise UserError(f"{source}: has no qlinear metadata; it was not written by qlinear quantize") from None
    except (ValueError, TypeError, AttributeError) as error:
        raise UserError(f"{source}: corrupt qlinear metadata ({error})") from None
    auxiliary = set()
    for name, info in quantized.items():
        try:
            auxiliary |= {info["scale"], info["zero_point"]}
        except (KeyError, TypeError) as error:
            raise UserError(f"{source}: tensor {name!r}: corrupt qlinear metadata (missing {error})") from None
    names = [name for name in arrays if name not in auxiliary]
    root_array = bool(meta.get("root_array")) and len(names) == 1
    rows = []
    total = sum(arrays[name].nbytes for name in names)
    with report.progress(total, f"dequantizing {source.name}") as advance, atomic_store(output) as temporary:
        group = None if root_array else zarr.open_group(str(temporary), mode="w")
        if group is not None:
            group.attrs.update({k: v for k, v in attributes.items() if k != "qlinear"})
        for name in names:
            array = arrays[name]
            attrs = dict(array.attrs)
            if root_array:
                attrs.update({k: v for k, v in attributes.items() if k != "qlinear"})

            def create(dtype, name=name, array=array, attrs=attrs):
                if root_array:
                    made = zarr.create_array(str(temporary), shape=array.shape,
                                             chunks=array.chunks if array.ndim else (), dtype=dtype, fill_value=0,
                                             overwrite=True)
                    made.attrs.update(attrs)
                    return made
                return _create(group, name, array.shape, array.chunks, dtype, attrs)

            lazy = da.from_zarr(array)
            if name not in quantized:
                _store(lazy, create(array.dtype), advance)
                rows.append(report.copied_row(name, tuple(array.shape), str(array.dtype), array.nbytes, "copied"))
                continue
            info = quantized[name]
            try:
                qtype = dtypes.get(info["dtype"])
                shape = tuple(int(d) for d in info["shape"])
                out_dtype = dtypes.resolve_dtype(info["source_dtype"], "source_dtype", "dequantize").dtype
                gran = Granularity(info["granularity"], shape, info["axis"], int(info["block_size"])) if shape \
                    else Granularity("tensor", ())
                scale = np.asarray(arrays[info["scale"]][...])
                zero_point = np.asarray(from_zarr_storage(np.asarray(arrays[info["zero_point"]][...]), qtype))
            except (KeyError, ValueError, TypeError) as error:
                raise UserError(f"{source}: tensor {name!r}: corrupt qlinear metadata (missing {error})") from None
            if tuple(array.shape) != shape or tuple(scale.shape) != gran.param_shape \
                    or np.dtype(array.dtype) != storage_dtype(qtype):
                raise UserError(f"{source}: tensor {name!r}: its values or scale do not match the shape {list(shape)}, "
                                f"type and granularity in the metadata")
            attrs_q = {}
            if gran.kind != "tensor":
                attrs_q["axis"] = gran.axis
            if gran.kind == "block":
                attrs_q["block_size"] = gran.block_size
            q = from_zarr_storage(lazy, qtype)
            restored = dequantize_linear(q, scale, zero_point if qtype.is_integer else None, **attrs_q)
            _store(restored.astype(out_dtype), create(out_dtype), advance, done_bytes=array.nbytes)
            rows.append(report.restored_row(name, shape, qtype.onnx_name, out_dtype.name,
                                            array.nbytes + scale.nbytes + zero_point.nbytes,
                                            math.prod(shape) * out_dtype.itemsize))
    return report.summary("dequantize", source, output, rows)

