"""Zero channels added to convolutions so that onnxruntime runs them in its fast int8 kernels.

onnxruntime (1.32, `qlinearconv.cc` / MLAS `convsym.cpp`, `MlasConvSymPackWSize`) runs an int8 QLinearConv with
symmetric weights in its vectorized kernels (AVX2, AVX-512, VNNI) only when the channels fit them on x86:

- a depthwise convolution: a channel count that is a multiple of 16; any other count falls back to a generic
  kernel (SSE2, 8 channels at a time), 2.3-2.6x slower on 5x5 layers of 88-200 channels (BENCHMARKS.md).
  PP-OCR's classifier has such layers of 24, 40, 88, 104 and 200 channels.
- a dense one (group 1): at least 16 output channels, output channels a multiple of 8 (4 with AVX-512) and input
  channels a multiple of 4; otherwise its im2col GEMM runs, on one thread for a narrow output (1x1, 16 -> 8
  channels over 8 x 12 x 96 pixels: 79 us on 1 thread, 65 on 2; 16 -> 16: 36 and 24). The classifier's
  MobileNetV3 blocks project to 8 channels at its largest maps.

So, for the onnxruntime target, each depthwise Conv whose channel count is not a multiple of `MULTIPLE`, and each
dense one whose output channels are fewer than `DENSE_MINIMUM` or not a multiple of `DENSE_MULTIPLE`, gets zero
channels up to the next count that fits (`aligned`), and with it every tensor that must carry them (its
*region*): back to the dense convolutions that write it (zero weight rows, zero bias: they write zeros there) and
forward to the dense convolutions that read it (zero weight columns: they read nothing from there; a multiple of
8 input channels is a multiple of 4), through the operators that work channel by channel in between
(activations, pools, element-wise operators with per-channel or scalar constants, other depthwise convolutions,
a squeeze-excite block's gate). Every real channel computes exactly what it did:
a padded channel meets a real one only in a dense convolution's sum, with a zero weight (in int8 too: a zero
code times anything is 0). Whatever a padded channel holds in between (a hard sigmoid of 0 is 0.5) stays
finite and reaches nothing else.

A region that reaches anything else (a graph input or output, a reshape, a concatenation, a constant shared
with another reader, a broadcast that is not per channel) is left as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .onnx_constants import attributes, producers_of, readers_of

MULTIPLE = 16  # onnxruntime's channel alignment for its symmetric depthwise kernel on x86 (ARM64 needs 8)
DENSE_MINIMUM = 16  # the output channels its symmetric dense kernel packs at a time (FilterOutputChannelPackCount)
DENSE_MULTIPLE = 8  # and their alignment there (KernelOutputChannelAlignment: 8 for AVX2 and AVX-VNNI, 4 AVX-512)
UNARY = frozenset({"Relu", "Clip", "LeakyRelu", "HardSwish", "HardSigmoid", "Sigmoid", "Tanh", "Identity"})
POOLS = frozenset({"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"})
BINARY = {"Add": 0.0, "Sub": 0.0, "Mul": 0.0, "Div": 1.0}  # what a per-channel constant operand is padded with


@dataclass
class Padded:
    depthwise: list[str]  # the depthwise convolutions' names
    dense: list[str]  # the dense convolutions whose outputs it widens (those reading it widen their inputs)
    channels: int
    to: int
    tensors: list[str]  # the tensors that carry the zero channels (after the real ones, on axis 1)


@dataclass
class _Region:
    channels: int
    rank: int
    tensors: set[str] = field(default_factory=set)
    out_rows: dict[str, object] = field(default_factory=dict)  # dense Conv writing the region: pad its outputs
    in_columns: dict[str, object] = field(default_factory=dict)  # dense Conv reading the region: pad its inputs
    depthwise: dict[str, object] = field(default_factory=dict)
    operands: dict[str, float] = field(default_factory=dict)  # per-channel constant -> what it is padded with


def _label(node) -> str:
    return node.name or node.output[0]


def aligned(channels: int, depthwise: bool) -> int:
    """The channel count onnxruntime's symmetric kernels take for ``channels`` (module docstring)."""
    if depthwise:
        return -(-channels // MULTIPLE) * MULTIPLE
    return max(DENSE_MINIMUM, -(-channels // DENSE_MULTIPLE) * DENSE_MULTIPLE)


def pad_channels(model, read_tensor, write_tensor, names: set[str] | None = None) -> list[Padded]:
    """Pad the main graph's Convs (those named in ``names``, or all) whose channels onnxruntime's symmetric
    kernels do not take, and their regions, in place.
    ``read_tensor(name)`` gives a stored constant's values (or None), ``write_tensor(name, array)`` stores new
    values for it."""
    graph = model.graph
    producers, readers = producers_of(graph), readers_of(graph)
    outputs = {o.name for o in graph.output}

    def only_reader(name: str, node) -> bool:
        return name not in outputs and [id(n) for n in readers.get(name, [])] == [id(node)]

    def conv_kind(node, channels: int) -> str | None:
        """"dense" or "depthwise" for a Conv whose float weight (and bias) only it reads, else None."""
        if node.op_type != "Conv" or node.domain not in ("", "ai.onnx"):
            return None
        weight = read_tensor(node.input[1])
        if weight is None or weight.ndim < 3 or not only_reader(node.input[1], node):
            return None
        bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
        if bias is not None and (read_tensor(bias) is None or not only_reader(bias, node)):
            return None
        group = attributes(node).get("group", 1)
        if group == 1:
            return "dense"
        if group == channels and weight.shape[0] == channels and weight.shape[1] == 1:
            return "depthwise"
        return None

    def grow(start: str, channels: int, rank: int) -> _Region | None:
        region = _Region(channels, rank)
        work = [start]
        while work:
            tensor = work.pop()
            if tensor in region.tensors:
                continue
            if tensor in outputs or tensor not in producers:
                return None  # a graph output or input (or a constant)
            region.tensors.add(tensor)
            # Who writes it.
            node = producers[tensor]
            kind = conv_kind(node, channels)
            if kind == "dense":
                if read_tensor(node.input[1]).shape[0] != channels:
                    return None
                region.out_rows[_label(node)] = node
            elif not _through(node, tensor, region, work, read_tensor, only_reader, kind):
                return None
            # Who reads it.
            for reader in readers.get(tensor, []):
                kind = conv_kind(reader, channels)
                if kind == "dense" and reader.input[0] == tensor:
                    if read_tensor(reader.input[1]).shape[1] != channels:
                        return None
                    region.in_columns[_label(reader)] = reader
                elif not _through(reader, reader.output[0] if reader.output else "", region, work, read_tensor,
                                  only_reader, kind):
                    return None
        return region

    done: list[Padded] = []
    padded_tensors: set[str] = set()
    for node in list(graph.node):
        if node.op_type != "Conv" or (names is not None and _label(node) not in names):
            continue
        weight = read_tensor(node.input[1]) if len(node.input) > 1 else None
        if weight is None:
            continue
        channels = weight.shape[0]
        kind = conv_kind(node, channels)
        # A depthwise convolution's region holds its input; a dense one's, its output.
        start = {"depthwise": node.input[0], "dense": node.output[0]}.get(kind)
        if start is None or aligned(channels, kind == "depthwise") == channels or start in padded_tensors:
            continue
        region = grow(start, channels, weight.ndim)
        if region is None or not region.tensors.isdisjoint(padded_tensors):
            continue
        # never `channels`: a count a depthwise convolution takes (a multiple of 16) a dense one takes too
        to = aligned(channels, bool(region.depthwise))
        _apply(region, to, read_tensor, write_tensor)
        padded_tensors |= region.tensors
        done.append(Padded(sorted(region.depthwise), sorted(region.out_rows), channels, to, sorted(region.tensors)))
    if done:
        kept = [v for v in graph.value_info if v.name not in padded_tensors]  # their shapes changed
        del graph.value_info[:]
        graph.value_info.extend(kept)
    return done


def _through(node, output: str, region: _Region, work: list, read_tensor, only_reader, kind) -> bool:
    """Whether ``node`` works channel by channel, from region tensors to ``output`` (which joins the region with
    its data inputs); records what of it must be padded."""
    op = node.op_type
    if node.domain not in ("", "ai.onnx") or len(node.output) != 1 or not output:
        return False
    if kind == "depthwise":
        region.depthwise[_label(node)] = node
        data = [node.input[0]]
    elif op in POOLS or op in UNARY:
        data = [node.input[0]]
        if op == "Clip" and any(name and read_tensor(name) is None for name in node.input[1:]):
            return False
        if op != "Clip" and len(node.input) > 1:
            return False
    elif op in BINARY and len(node.input) == 2:
        data = []
        for name in node.input:
            value = read_tensor(name)
            if value is None:
                data.append(name)
            elif value.size != 1:
                shape = (1,) * (region.rank - value.ndim) + value.shape
                if (value.ndim > region.rank or shape[1] != region.channels
                        or any(n != 1 for axis, n in enumerate(shape) if axis != 1) or not only_reader(name, node)):
                    return False
                region.operands[name] = BINARY[op]
        if not data:
            return False
    else:
        return False
    work.extend(data)
    work.append(output)
    return True


def _apply(region: _Region, to: int, read_tensor, write_tensor) -> None:
    extra = to - region.channels

    def padded(name: str, axis: int, value: float = 0.0):
        array = np.asarray(read_tensor(name))
        width = [(0, 0)] * array.ndim
        width[axis] = (0, extra)
        write_tensor(name, np.pad(array, width, constant_values=np.asarray(value, array.dtype)))

    for node in list(region.out_rows.values()) + list(region.depthwise.values()):
        padded(node.input[1], 0)
        if len(node.input) > 2 and node.input[2]:
            padded(node.input[2], 0)
    for node in region.in_columns.values():
        padded(node.input[1], 1)
    for name, value in region.operands.items():  # broadcast from the right: axis 1 of the region's rank
        padded(name, np.asarray(read_tensor(name)).ndim - region.rank + 1, value)
    for node in region.depthwise.values():
        for attribute in node.attribute:
            if attribute.name == "group":
                attribute.i = to

