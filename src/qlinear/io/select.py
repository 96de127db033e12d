"""Select: which tensors are quantized, with which granularity, and why the others are kept.

The defaults are the ones an expert picks (and onnxruntime, NNCF and the GenAI builder agree on):

- only weights: in a model, a float constant that a weight-bearing operator reads as its weight
  (Conv/ConvTranspose W, Gemm/MatMul's constant operand, LSTM/GRU/RNN W and R, a Gather table),
  found by the format adapter; in a tensor file, every float tensor of two or more dimensions.
  Biases and 1-D tensors (norm scales) stay float: quantizing them saves little and costs accuracy;
- 8- and 16-bit types: one scale per output channel, symmetric (signed: zero point 0 and the range
  [-qmax, qmax]; unsigned: the middle code);
- 6 bits and fewer: blocks of `DEFAULT_BLOCK_SIZE` along the reduction axis, min/max with a zero point
  (integers; the float formats are always symmetric). Where the reduction axis is shorter than a block
  (depthwise convolutions: one input channel), one scale per output channel instead, since a block
  would hold that axis's few elements only.

``--include`` names tensors to quantize whatever they are; ``--granularity``, ``--axis`` and
``--block-size`` override the defaults for every tensor.

The microscaling formats (``--dtype mxfp4``, ``nvfp4``, ...) are blocked by definition: blocks of the
format's size along the reduction axis, a short axis making one short block (never the per-channel
fallback: an MX runtime reads blocks), and a tensor without a reduction axis kept float unless
``--axis`` names one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase

import numpy as np

from .. import granularity as granularity_mod
from .plan import DEFAULT_BLOCK_SIZE, Choice, Found, Settings
from .errors import UserError


@dataclass(frozen=True)
class Rules:
    """What a format adds to the settings: which dtypes it can quantize, the default --min-elements,
    and the axes a tensor without a model around it is read with."""

    float_types: tuple[np.dtype, ...]
    min_elements: int = 1
    channel_axis: int = 0  # tensor files: PyTorch's [out, in] layout
    reduction_axis: int = -1
    refused_types: dict[str, str] | None = None  # dtype name -> why it cannot be quantized in this format


def default_kind(settings: Settings) -> str:
    if settings.kind is not None:
        return settings.kind
    if settings.mx is not None:
        return "block"
    return "axis" if settings.qtype.bits >= 8 else "block"


def default_symmetric(settings: Settings) -> bool:
    """Symmetric for 8- and 16-bit integers (what runtimes' integer kernels want: a zero zero point) and
    the float formats (always); min/max with a zero point for 6 bits and fewer, where the level a
    symmetric range leaves unused (-8 of int4's [-8, 7]) and the skew of a small block cost accuracy."""
    if not settings.qtype.is_integer:
        return True
    if settings.symmetric is not None:
        return settings.symmetric
    return settings.qtype.bits >= 8


def reason_by_name(name: str, include: Iterable[str], exclude: Iterable[str]) -> str | None:
    """Why the name globs leave a tensor alone, or None when they let it through."""
    include, exclude = tuple(include), tuple(exclude)
    if include and not any(fnmatchcase(name, glob) for glob in include):
        return "not matched by --include"
    if any(fnmatchcase(name, glob) for glob in exclude):
        return "matched by --exclude"
    return None


def choose(found: Found, settings: Settings, rules: Rules, where: str) -> Choice:
    """The decision for one tensor. ``where`` names it in errors (file and tensor)."""
    symmetric = default_symmetric(settings)
    reason = _kept_because(found, settings, rules)
    if reason is not None:
        return Choice(found, None, reason, symmetric)
    if settings.mx is not None:
        gran, note = _mx_granularity(found, settings, rules, where)
    else:
        gran, note = _granularity(found, settings, rules, where)
    return Choice(found, gran, note, symmetric)


def _kept_because(found: Found, settings: Settings, rules: Rules) -> str | None:
    if found.dtype is None or found.dtype not in rules.float_types:
        name = found.type_name or (str(found.dtype) if found.dtype is not None else found.code or "unknown")
        refused = (rules.refused_types or {}).get(name)
        return refused or f"{name} is not a float type"
    if found.size == 0:
        return "empty"
    by_name = reason_by_name(found.name, settings.include, settings.exclude)
    if by_name is not None:
        return by_name
    if not settings.include:  # a tensor named by --include is quantized whatever it is
        if found.uses is not None and not any(use.weight for use in found.uses):
            return _role(found)
        if settings.keep_1d and len(found.shape) < 2:
            what = "a scalar" if not found.shape else "1-D"
            if found.uses and any(use.weight for use in found.uses):
                return (f"{what}, stored flat and reshaped into a weight ({_uses(found)}); --include it to quantize "
                        f"it")
            return f"{what} (a bias or norm scale); --include it to quantize it"
    min_elements = rules.min_elements if settings.min_elements is None else settings.min_elements
    if found.size < max(min_elements, 1):
        return f"{found.size} elements, below --min-elements {min_elements}"
    return None


def _role(found: Found) -> str:
    if not found.uses:
        return "not read by any operator"
    labels = sorted({use.label() for use in found.uses})
    shown = ", ".join(labels[:3]) + (f" and {len(labels) - 3} more" if len(labels) > 3 else "")
    return f"not a weight: {shown}"


def _axes(found: Found, rules: Rules) -> tuple[int | None, int | None, str]:
    """(channel axis, reduction axis, note) for a tensor: its weight uses' axes when they agree."""
    rank = len(found.shape)
    if found.uses is None:
        return rules.channel_axis % rank, rules.reduction_axis % rank, ""
    weight_uses = [use for use in found.uses if use.weight] or list(found.uses)
    channels = {use.channel_axis for use in weight_uses}
    reductions = {use.reduction_axis for use in weight_uses}
    note = ""
    if len(channels) > 1 or len(reductions) > 1:
        note = f"its {len(weight_uses)} uses read it along different axes"
    channel = channels.pop() if len(channels) == 1 else None
    reduction = reductions.pop() if len(reductions) == 1 else None
    return channel, reduction, note


def _granularity(found: Found, settings: Settings, rules: Rules, where: str):
    shape = tuple(int(d) for d in found.shape)
    kind = default_kind(settings)
    if kind == "tensor" or not shape:
        if kind != "tensor" and settings.kind is not None:
            raise UserError(f"{where}: a scalar (shape ()) cannot take {_what(kind)} quantization; use "
                            f"--granularity tensor or --exclude it")
        return granularity_mod.Granularity("tensor", shape), ""
    channel, reduction, note = _axes(found, rules)
    block_size = settings.block_size or DEFAULT_BLOCK_SIZE
    if kind == "block" and settings.kind is None and settings.axis is None and reduction is not None \
            and shape[reduction] < block_size and channel is not None:
        kind = "axis"
        note = _join(note, f"per channel: the reduction axis has {shape[reduction]} elements, fewer than a block")
    axis = settings.axis if settings.axis is not None else channel if kind == "axis" else reduction
    if axis is None:
        what = "output-channel" if kind == "axis" else "reduction"
        if settings.kind is not None:
            raise UserError(f"{where}: has no {what} axis that its uses agree on ({_uses(found)}); "
                            f"give --axis N or --granularity tensor")
        return granularity_mod.Granularity("tensor", shape), _join(note, f"per tensor: no {what} axis")
    return _resolve(where, shape, kind, axis, block_size), note


def _mx_granularity(found: Found, settings: Settings, rules: Rules, where: str):
    """Blocks of the MX format's size along the reduction axis (or --axis): (granularity, note), or
    (None, why it is kept) for a scalar or a tensor whose uses agree on no reduction axis."""
    shape = tuple(int(d) for d in found.shape)
    if not shape:
        return None, f"a scalar: {settings.dtype_name} quantizes blocks along an axis"
    _, reduction, note = _axes(found, rules)
    axis = settings.axis if settings.axis is not None else reduction
    if axis is None:
        return None, _join(note, f"no reduction axis that its uses agree on ({_uses(found)}) for "
                                 f"{settings.dtype_name}'s blocks; --axis N names one")
    try:
        axis = granularity_mod.normalize_axis(axis, len(shape), "granularity", "the tensor")
    except (ValueError, TypeError) as error:
        raise UserError(f"{where} of shape {shape}: {str(error).removeprefix('granularity: ')}") from None
    return granularity_mod.Granularity("block", shape, axis, settings.mx.block_size), note


def _resolve(where: str, shape, kind: str, axis: int, block_size: int):
    """The granularity, checked with the spec's rules (`qlinear.granularity.resolve`)."""
    try:
        axis = granularity_mod.normalize_axis(axis, len(shape), "granularity", "the tensor")
        if kind == "axis":
            param_shape, block_size = (shape[axis],), 0
        else:
            param_shape = list(shape)
            param_shape[axis] = -(-shape[axis] // block_size)
            param_shape = tuple(param_shape)
        gran = granularity_mod.resolve("granularity", shape, param_shape, param_shape, axis, block_size)
    except (ValueError, TypeError) as error:
        message = str(error).removeprefix("granularity: ")
        raise UserError(f"{where} of shape {shape} cannot take {_what(kind)} quantization: {message}") from None
    if gran.kind == "tensor":  # a length-1 axis: one scale, which the spec reads as per-tensor
        return granularity_mod.Granularity("axis", shape, axis) if kind == "axis" else gran
    return gran


def _what(kind: str) -> str:
    return {"axis": "per-axis", "block": "blocked", "tensor": "per-tensor"}[kind]


def _uses(found: Found) -> str:
    return ", ".join(sorted({use.label() for use in found.uses or ()})) or "no uses"


def _join(first: str, second: str) -> str:
    return f"{first}; {second}" if first and second else first or second
