"""AWQ's channel scales written into the float graph.

A layer whose weight AWQ rounded as ``W diag(s)`` computes what it did once its input is divided by ``s``, channel by
channel. Where the node that writes the input allows it, the division is folded into that node: a Conv, Gemm or
MatMul with constant weights whose output channel c, divided by s_c (its weight's rows, its bias), reaches the layer
through operators that commute with a per-channel scale (Relu, LeakyRelu, PRelu, pools, Identity, Mul by a constant;
an Add of a per-channel constant, which is divided too), each tensor on the way read by the next node only. Nothing
then runs between the quantized tensors that the division would need: with quantized activations the layer's input
keeps its QuantizeLinear/DequantizeLinear pair next to the layer, and onnxruntime still fuses both layers. Otherwise
a Div node reads the input (`divide`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .onnx_constants import attributes, producers_of, readers_of

# Operators f with f(x / s) = f(x) / s for s > 0 per channel, on the channel axis the layer reads.
COMMUTING = frozenset({"Relu", "LeakyRelu", "PRelu", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
                       "Identity", "Dropout", "Mul", "Add"})
CONV_FAMILY = frozenset({"Conv", "ConvTranspose"})  # channels on axis 1
MATMUL_FAMILY = frozenset({"MatMul", "Gemm"})  # channels on the last axis


@dataclass
class Writer:
    """The node that writes a layer's input, and the way there: ``weight`` has its output channels on ``axis``,
    ``bias`` (or "") is its 1-D bias, ``added`` the constants of Adds on the way (one value or one per channel), ``tensors`` every
    tensor from the writer's output to the layer's input (each divided by the scales once folded)."""

    node: object
    weight: str
    axis: int
    bias: str
    added: list[str]
    tensors: list[str]
    spatial: int  # the spatial axes after the channel axis (0: channels last)


def writer_of(graph, layer_node, read_tensor) -> Writer | None:
    """The `Writer` of ``layer_node``'s first input, or None where the division cannot be folded."""
    conv = layer_node.op_type in CONV_FAMILY
    if not conv and (layer_node.op_type not in MATMUL_FAMILY or attributes(layer_node).get("transA", 0)):
        return None
    layer_weight = read_tensor(layer_node.input[1]) if len(layer_node.input) > 1 else None
    if layer_weight is None:
        return None
    spatial = layer_weight.ndim - 2 if conv else 0  # a convolution's input: [N, C, spatial...]
    producers, readers = producers_of(graph), readers_of(graph)
    outputs = {o.name for o in graph.output}

    def alone(name: str) -> bool:
        return name not in outputs and len(readers.get(name, ())) == 1

    tensor, tensors, added = layer_node.input[0], [], []
    while True:
        node = producers.get(tensor)
        if node is None or not alone(tensor) or node.domain not in ("", "ai.onnx"):
            return None
        tensors.append(tensor)
        if node.op_type in ("Mul", "Add"):
            found = _constant_operand(node, read_tensor, spatial)
            if found is None or not alone(found[0]):
                return None
            if node.op_type == "Add":
                added.append(found[0])
            tensor = found[1]
        elif node.op_type in COMMUTING:
            if node.op_type == "MaxPool" and len(node.output) > 1 and node.output[1]:
                return None  # its indices output: not worth the case
            slope = read_tensor(node.input[1]) if node.op_type == "PRelu" else None
            if node.op_type == "PRelu" and (slope is None or _per_channel(slope.shape, spatial) is None):
                return None
            tensor = node.input[0]
        else:
            return _weighted(node, conv, spatial, read_tensor, alone, added, tensors)


def _per_channel(shape, spatial: int) -> bool | None:
    """For a constant of ``shape`` broadcast against the layer's input (channels on axis 1 before ``spatial``
    axes, or last when ``spatial`` is 0): True if it holds a value per channel, False if one value, None if it
    varies along another axis."""
    if int(np.prod(shape)) == 1:
        return False
    if len(shape) <= spatial or any(d != 1 for d in shape[len(shape) - spatial:]):
        return None
    if any(d != 1 for d in shape[: len(shape) - spatial - 1]):
        return None
    return True


def _constant_operand(node, read_tensor, spatial: int):
    """(the constant, the other operand) of a Mul or Add by a constant that is one value or one per channel."""
    values = [read_tensor(name) for name in node.input[:2]]
    for index in (0, 1):
        value = values[index]
        if value is None or values[1 - index] is not None:
            continue
        return None if _per_channel(value.shape, spatial) is None else (node.input[index], node.input[1 - index])
    return None


def _weighted(node, conv: bool, spatial: int, read_tensor, alone, added, tensors) -> Writer | None:
    """The `Writer` for a Conv, Gemm or MatMul ``node`` with a constant weight (and bias) only it reads."""
    op, inputs = node.op_type, list(node.input)
    if len(inputs) < 2 or not alone(inputs[1]) or read_tensor(inputs[0]) is not None:
        return None
    weight = read_tensor(inputs[1])
    bias = inputs[2] if len(inputs) > 2 and inputs[2] else ""
    bias_value = read_tensor(bias) if bias else None
    if weight is None or (bias and (bias_value is None or not alone(bias) or bias_value.ndim != 1)):
        return None
    if conv and op == "Conv" and weight.ndim == spatial + 2:
        return Writer(node, inputs[1], 0, bias, added, tensors, spatial)
    if not conv and op == "MatMul" and weight.ndim == 2:
        return Writer(node, inputs[1], 1, "", added, tensors, 0)
    if not conv and op == "Gemm" and weight.ndim == 2 and not attributes(node).get("transA", 0):
        columns = 0 if attributes(node).get("transB", 0) else 1
        if bias and bias_value.shape[0] != weight.shape[columns]:
            return None
        return Writer(node, inputs[1], columns, bias, added, tensors, 0)
    return None


def fold(writer: Writer, scales: np.ndarray, read_tensor, write_tensor) -> None:
    """Divide ``writer``'s output channels (and the Adds' constants on the way) by ``scales`` [C], in place."""
    scales = np.asarray(scales, np.float64)
    weight = read_tensor(writer.weight)
    shape = [1] * weight.ndim
    shape[writer.axis] = scales.size
    write_tensor(writer.weight, (weight / scales.reshape(shape)).astype(weight.dtype))
    if writer.bias:
        bias = read_tensor(writer.bias)
        write_tensor(writer.bias, (bias / scales).astype(bias.dtype))
    per_channel = (scales.size,) + (1,) * writer.spatial
    for name in writer.added:
        value = read_tensor(name)
        if value.size == 1:  # one value for every channel: one per channel now
            divided = value.reshape(()) / scales.reshape(per_channel)
        else:
            divided = value / scales.reshape(value.shape)
        write_tensor(name, divided.astype(value.dtype))


def divide(graph, node, divisor: np.ndarray, unique) -> str:
    """A Div node before ``node`` that divides its first input by ``divisor`` (a float32 constant broadcast per
    input channel); ``unique(name)`` makes names the graph does not hold. Returns the divided tensor's name."""
    from onnx import helper, numpy_helper

    position = list(graph.node).index(node)
    d_name = unique(f"{node.name}_input_scale")
    y_name = unique(f"{node.input[0]}_scaled")
    graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(divisor, np.float32), d_name))
    graph.node.insert(position, helper.make_node("Div", [node.input[0], d_name], [y_name],
                                                 name=unique(f"{node.name}_input_Div")))
    node.input[0] = y_name
    return y_name
