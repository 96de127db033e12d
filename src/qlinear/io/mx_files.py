"""`qlinear quantize --dtype mxfp4` and `qlinear dequantize` for safetensors checkpoints in gpt-oss's MXFP4
layout (`formats.mx_checkpoint` holds the layout; `pipeline` hands these files over), and `qlinear dequantize`
for NVFP4 checkpoints in TensorRT Model Optimizer's layout (`formats.nvfp4_checkpoint`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import ml_dtypes
import numpy as np

from ..granularity import Granularity
from ..kernels import mx as mx_kernels
from ..reference import mx as mx_reference
from . import report, select
from .atomic import atomic_output
from .errors import UserError
from .formats import tensor_files
from .formats.mx_checkpoint import BLOCK, BLOCK_BYTES, MXFP4Tensor, mxfp4_pairs, row_slices, to_gpt_oss
from .formats.nvfp4_checkpoint import SCALES as NVFP4_SCALES
from .formats.nvfp4_checkpoint import (CompressedNVFP4Tensor, NVFP4Tensor, compressed_triples, fused_groups,
                                       nvfp4_names, nvfp4_triples, to_modelopt)
from .formats.tensor_files import SafetensorsReader, SafetensorsWriter
from .plan import Choice, Quantized, Stats
from .quantization import quantize_mx

METADATA_KEY = "qlinear_mx"  # the safetensors metadata entry: {"format", "scale_rule", "tensors": {NAME: {...}}}
METADATA_FORMATS = {"mxfp4": "qlinear.mxfp4/1", "nvfp4": "qlinear.nvfp4/1"}
DEFAULT_OUTPUT_DTYPE = np.dtype(ml_dtypes.bfloat16)  # what gpt-oss decodes to, and what its other tensors are


class _Writes:
    """How `quantize_file` stores one quantized tensor in a format's checkpoint layout."""

    def __init__(self, fmt, separator: str):
        self.fmt, self.separator = fmt, separator
        self.block = fmt.block_size
        self.layout = "Model Optimizer's (NAME, NAME_scale, NAME_scale_2)" if fmt.name == "nvfp4" else \
            "gpt-oss's (NAME.blocks, NAME.scales)"

    def parts(self, name: str, shape: tuple) -> list[tuple[str, np.dtype, tuple]]:
        """(name, dtype, shape) of each stored part, the codes' part first."""
        scale_shape = tuple(shape[:-1]) + (shape[-1] // self.block,)
        if self.fmt.name == "nvfp4":
            names = nvfp4_names(name)
            return [(names[0], np.dtype(np.uint8), tuple(shape[:-1]) + (shape[-1] // 2,)),
                    (names[1], NVFP4_SCALES, scale_shape), (names[2], np.dtype(np.float32), ())]
        return [(name + self.separator + "blocks", np.dtype(np.uint8), scale_shape + (BLOCK_BYTES,)),
                (name + self.separator + "scales", np.dtype(np.uint8), scale_shape)]

    def pack(self, result) -> tuple[np.ndarray, np.ndarray]:
        """(codes' bytes, scales' bytes) of one band's `quantize_mx` result."""
        if self.fmt.name == "nvfp4":
            weight, weight_scale, _ = to_modelopt(result.codes, result.scales, result.global_scale)
            return weight, weight_scale
        return to_gpt_oss(result.codes, result.scales)


def quantize_file(source: Path, output: Path, kind: str, settings) -> dict:
    """`qlinear quantize` of a tensor file with ``--dtype mxfp4`` or ``nvfp4``: the selected float tensors become
    ``NAME.blocks``/``NAME.scales`` (MXFP4, gpt-oss's layout) or ``NAME`` (packed codes), ``NAME_scale`` and
    ``NAME_scale_2`` (NVFP4, TensorRT Model Optimizer's layout: ``MODULE.weight``, ``.weight_scale``,
    ``.weight_scale_2``), blocks along the last axis; the rest is copied. The report row of each tensor
    compares it with what the decoder reads back."""
    fmt = settings.mx
    if fmt.name not in ("mxfp4", "nvfp4"):
        raise UserError(f"{source}: --dtype {fmt.name}: a safetensors checkpoint holds MXFP4 in gpt-oss's layout "
                        f"(NAME.blocks, NAME.scales) or NVFP4 in Model Optimizer's; the other MX formats go into "
                        f"ONNX models")
    if kind != "safetensors":
        raise UserError(f"{source}: --dtype {fmt.name} writes safetensors checkpoints; a .{kind} file cannot hold "
                        f"it (convert it to .safetensors first)")
    reader = tensor_files.open_tensor_file(source)
    if "qlinear" in reader.metadata or METADATA_KEY in reader.metadata:
        raise UserError(f"{source}: was written by qlinear quantize; run qlinear dequantize on it first")
    try:
        pairs = mxfp4_pairs(reader.entries)
        nvfp4_triples(reader.entries)  # a malformed triple is an error here too
    except ValueError as error:
        raise UserError(f"{source}: {error}") from None
    separators = {separator for _, _, separator in pairs.values()}
    writes = _Writes(fmt, separators.pop() if len(separators) == 1 else ".")
    rules = select.Rules(tensor_files.FLOAT_DTYPES)
    choices = []
    for found in reader.entries:
        choice = select.choose(found, settings, rules, f"{source}: tensor {found.name!r}")
        if choice.quantized:
            last = len(found.shape) - 1
            if choice.granularity.axis != last:
                raise UserError(f"{source}: tensor {found.name!r}: {writes.layout} layout blocks the last axis "
                                f"({last}), not axis {choice.granularity.axis}; leave out --axis")
            if found.shape[-1] % writes.block:
                choice = Choice(found, None, f"its last axis ({found.shape[-1]}) is not a whole number of "
                                            f"{writes.block}-element blocks, which the layout needs", choice.symmetric)
        choices.append(choice)
    names = {found.name for found in reader.entries}
    plan, meta = [], {}
    for choice in choices:
        found = choice.found
        if not choice.quantized:
            plan.append(tensor_files.Planned(found.name, found.dtype, found.shape, found.nbytes, found.code))
            continue
        for name, dtype, shape in writes.parts(found.name, tuple(found.shape)):
            if name in names and name != found.name:
                raise UserError(f"{source}: tensor {found.name!r}: the file already has a tensor named {name!r}, "
                                f"where its {fmt.name.upper()} {name[len(found.name):].lstrip('._')} would go")
            plan.append(tensor_files.Planned(name, dtype, shape, math.prod(shape) * dtype.itemsize))
        meta[found.name] = {"source_dtype": found.dtype.name, "shape": list(found.shape)}
    metadata = {**reader.metadata, METADATA_KEY: _json({"format": METADATA_FORMATS[fmt.name],
                                                        "scale_rule": settings.scale_rule or (
                                                            "floor" if fmt.name == "mxfp4" else "exact"),
                                                        "tensors": meta})}
    # NVFP4: the weights an inference engine fuses (q/k/v, gate/up) take one tensor scale, from the largest of
    # their maxima (nvfp4_checkpoint.FUSED_SIBLINGS); the others each their own, taken just before they are written
    shared, sharing = {}, {}
    if fmt.name == "nvfp4":
        by_name = {c.found.name: c.found for c in choices if c.quantized}
        for group in fused_groups(list(by_name)):
            amax = np.max([_nvfp4_amax(reader, by_name[name], settings.scale_rule) for name in group])
            g = mx_reference.nvfp4_scale_from_amax(amax, settings.scale_rule)
            for name in group:
                shared[name] = g
                sharing[name] = ", ".join(other for other in group if other != name)
    rows = []
    total = sum(c.found.nbytes for c in choices if c.quantized)
    with report.progress(total, f"quantizing {source.name}") as advance, atomic_output(output) as f:
        writer = SafetensorsWriter(f, plan, metadata)
        for choice in choices:
            found = choice.found
            if not choice.quantized:
                tensor_files.copy_raw(reader, found, writer)
                rows.append(report.copied_row(found, choice.reason))
                continue
            x = reader.array(found)
            # NVFP4's tensor scale is the whole tensor's (or its fused group's): one reading of x before the bands
            g = None
            if fmt.name == "nvfp4":
                g = shared.get(found.name)
                if g is None:
                    g = mx_reference.nvfp4_scale_from_amax(_nvfp4_amax(reader, found, settings.scale_rule, x),
                                                           settings.scale_rule)
            release = tensor_files.page_releaser(x, found)
            stats, scale_parts = Stats(), []
            parts = writes.parts(found.name, tuple(found.shape))
            writer.begin(parts[0][0])
            # bands of 16 MiB of input: the error figures take a few float64 copies of a band
            for rows_slice in row_slices(found.shape, found.nbytes, fraction=4):
                band = np.asarray(x[rows_slice])
                result = quantize_mx(band, _blocks_along_last(band.shape, writes.block), fmt, settings.scale_rule,
                                     found.dtype, g)
                codes_part, scale_part = writes.pack(result)
                writer.write(codes_part)
                scale_parts.append(scale_part)
                stats.signal += result.stats.signal
                stats.noise += result.stats.noise
                stats.max_abs_error = max(stats.max_abs_error, result.stats.max_abs_error)
                advance(band.nbytes)
                if release is not None and rows_slice != slice(None):
                    release(rows_slice.start, rows_slice.stop)
            writer.end()
            del x
            writer.begin(parts[1][0])
            for part in scale_parts:
                writer.write(part)
            writer.end()
            if g is not None:
                writer.begin(parts[2][0])
                writer.write(np.asarray(g, np.float32))
                writer.end()
            after = sum(math.prod(shape) * dtype.itemsize for _, dtype, shape in parts)
            rows.append(report.quantized_row(choice, settings.qtype, after,
                                             Quantized(np.zeros(0, np.float32), np.zeros((), np.int8), stats),
                                             to=fmt.name))
            if found.name in sharing:
                note = f"tensor scale shared with {sharing[found.name]} (fused by inference engines)"
                rows[-1]["note"] = "; ".join(filter(None, (rows[-1]["note"], note)))
        writer.close()
    reader.close()
    return report.summary("quantize", source, output, rows, qtype=fmt.name)


def _nvfp4_amax(reader, found, rule, x=None):
    """The maximum NVFP4's tensor scale comes from (`reference.mx.nvfp4_amax` under ``rule``) of a tensor, read
    band by band (``x``: the tensor's array, when the caller has it)."""
    x = reader.array(found) if x is None else x
    maxima = []
    for rows_slice in row_slices(found.shape, found.nbytes, fraction=4):
        band = np.asarray(x[rows_slice], np.float32)
        amax = mx_kernels.nvfp4_amax(band, rule)  # None: the reference's
        maxima.append(mx_reference.nvfp4_amax(band, rule) if amax is None else amax)
    return np.max(maxima)


COMPRESSED_LABEL = "nvfp4 (compressed-tensors)"


class _Group:
    """One quantized tensor of a checkpoint: gpt-oss's MXFP4 pair, Model Optimizer's NVFP4 triple or
    compressed-tensors' (``MODULE.weight_packed``, ``_scale``, ``_global_scale``)."""

    def __init__(self, name: str, members: tuple[str, ...], label: str, separator: str = "."):
        self.name, self.members, self.label, self.separator = name, members, label, separator

    def tensor(self, arrays, rows=slice(None)):
        """The group's tensor (`MXFP4Tensor` or `NVFP4Tensor`) on the rows ``rows`` of its first axis."""
        if self.label == "mxfp4":
            blocks, scale_bytes = arrays
            return MXFP4Tensor(blocks[rows], scale_bytes[rows], self.separator)
        weight, weight_scale, g = arrays  # an NVFP4 tensor scale per expert follows the rows
        kind = CompressedNVFP4Tensor if self.label == COMPRESSED_LABEL else NVFP4Tensor
        return kind(weight[rows], weight_scale[rows], g[rows] if np.ndim(g) and np.size(g) > 1 else g)


def _groups(reader) -> dict[str, _Group]:
    """The quantized tensors of ``reader``'s file by the name their values get: gpt-oss's MXFP4 pairs
    (``NAME.blocks``/``NAME.scales`` -> NAME) and Model Optimizer's NVFP4 triples (``MODULE.weight``,
    ``.weight_scale``, ``.weight_scale_2`` -> ``MODULE.weight``); a malformed group is a one-line error."""
    try:
        pairs = mxfp4_pairs(reader.entries)
        triples = nvfp4_triples(reader.entries)
        compressed = compressed_triples(reader.entries)
    except ValueError as error:
        raise UserError(f"{reader.path}: {error}") from None
    groups = {base: _Group(base, (blocks, scales), "mxfp4", separator)
              for base, (blocks, scales, separator) in pairs.items()}
    groups.update({weight: _Group(weight, names, "nvfp4") for weight, names in triples.items()})
    groups.update({weight: _Group(weight, names, COMPRESSED_LABEL) for weight, names in compressed.items()})
    return groups


def dequantizes(reader) -> bool:
    """Whether `qlinear dequantize` reads ``reader``'s file as a microscaling checkpoint: a safetensors file
    with gpt-oss's MXFP4 pairs or NVFP4 triples (Model Optimizer's or compressed-tensors') and no metadata of
    qlinear's own Q/DQ format."""
    if not isinstance(reader, SafetensorsReader) or "qlinear" in reader.metadata:
        return False
    return bool(_groups(reader))


def dequantize_file(source: Path, reader, output: Path, out_kind: str) -> dict:
    """`qlinear dequantize` of an MXFP4 checkpoint in gpt-oss's layout or an NVFP4 one in Model Optimizer's or
    compressed-tensors': each quantized tensor becomes its values under its name (the dtype it was quantized
    from, when qlinear wrote it; else bfloat16, as these checkpoints decode), the rest is copied."""
    groups = _groups(reader)
    recorded = _recorded(source, reader.metadata)
    entries = {entry.name: entry for entry in reader.entries}
    firsts = {}
    for group in groups.values():
        if group.name in entries and group.name not in group.members:
            raise UserError(f"{source}: {group.label.upper()} tensor {group.name!r}: the file already has a tensor "
                            f"of that name, where its dequantized values would go")
        first = min(group.members, key=lambda n: reader.entries.index(entries[n]))
        firsts[first] = group
    members = {name for group in groups.values() for name in group.members}
    plan, order = [], []
    for entry in reader.entries:
        if entry.name in firsts:
            group = firsts[entry.name]
            arrays = [reader.array(entries[n]) for n in group.members]
            shape, dtype = group.tensor(arrays).shape, recorded.get(group.name, DEFAULT_OUTPUT_DTYPE)
            plan.append(tensor_files.Planned(group.name, dtype, shape, math.prod(shape) * dtype.itemsize))
            order.append((group, arrays, shape, dtype))
        elif entry.name not in members:
            plan.append(tensor_files.Planned(entry.name, entry.dtype, entry.shape, entry.nbytes, entry.code))
            order.append(entry)
    if out_kind == "npy" and len(plan) != 1:
        raise UserError(f"{output}: a .npy file holds one array and {source} has {len(plan)} tensors; write a .npz")
    metadata = {k: v for k, v in reader.metadata.items() if k != METADATA_KEY}
    rows = []
    total = sum(p.nbytes for p in plan if p.name in groups)
    with report.progress(total, f"dequantizing {source.name}") as advance, atomic_output(output) as f:
        writer = tensor_files.WRITERS[out_kind](f, plan, metadata)
        for item in order:
            if not isinstance(item, tuple):
                tensor_files.copy_raw(reader, item, writer)
                rows.append(report.restored_row(item.name, item.shape, item.type_name, item.type_name,
                                                item.nbytes, item.nbytes) | {"note": "copied"})
                continue
            item, arrays, shape, dtype = item  # the group, its members' arrays, its values' shape and dtype
            writer.begin(item.name)
            for rows_slice in row_slices(arrays[0].shape, arrays[0].nbytes * 2 * dtype.itemsize):
                band = item.tensor(arrays, rows_slice).dequantize(dtype)
                writer.write(band)
                advance(band.nbytes)
            writer.end()
            stored = sum(entries[n].nbytes for n in item.members)
            rows.append(report.restored_row(item.name, shape, item.label, dtype.name, stored,
                                            math.prod(shape) * dtype.itemsize))
        writer.close()
    reader.close()
    return report.summary("dequantize", source, output, rows)


def _blocks_along_last(shape, block: int = BLOCK):
    return Granularity("block", tuple(shape), len(shape) - 1, block)


def _json(value) -> str:
    return json.dumps(value, separators=(",", ":"))


def _recorded(source: Path, metadata: dict) -> dict[str, np.dtype]:
    """The source dtypes `quantize_file` recorded, by tensor name (empty for a checkpoint qlinear did not write)."""
    if METADATA_KEY not in metadata:
        return {}
    try:
        meta = json.loads(metadata[METADATA_KEY])
        if meta.get("format") not in METADATA_FORMATS.values():
            raise ValueError(f"unknown format {meta.get('format')!r}")
        return {name: np.dtype(ml_dtypes.bfloat16) if info["source_dtype"] == "bfloat16"
                else np.dtype(info["source_dtype"]) for name, info in meta["tensors"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise UserError(f"{source}: corrupt {METADATA_KEY} metadata ({error})") from None
