"""Folding what follows a convolution into its weights, before static quantization.

Runtimes fold a BatchNormalization (or the Mul and Add by constants that Paddle exports a batch norm as, or
a scalar branch weight) into the Conv before it, and then run the Conv in int8 with its QuantizeLinear
after. They can only do that while the Conv's weight is a float constant: once it is quantized
(DequantizeLinear -> Conv), onnxruntime leaves the BatchNormalization in float and cannot fuse the Conv into
QLinearConv. So static quantization folds first, as onnxruntime's `quant_pre_process` does:

    BatchNormalization:  W' = W * g,  B' = (B - mean) * g + beta,  g = scale / sqrt(var + epsilon)
    Mul by c:            W' = W * c,  B' = B * c
    Add of d:            B' = B + d

per output channel (c and d scalars or one value per channel, stored or computed from constants by shape
operators), where the Conv's output is read by that node alone and its weight is a float constant read by this
Conv alone. With ``onnxruntime`` (the onnxruntime target), a HardSigmoid after a Conv becomes a Clip to [0, 1]
of the Conv with its weights times alpha and its bias times alpha plus beta (HardSigmoid(x) = clip(alpha x +
beta, 0, 1)): onnxruntime has no int8 HardSigmoid, and folds a Clip from 0 into the Conv's QuantizeLinear; and a
Max (Min) of a value and a scalar constant becomes the Clip from (to) that constant, exactly (tf2onnx writes
Keras' clamps so), which onnxruntime folds the same way. The
float model changes by float rounding only; `pipeline` runs it against the original before going on, as it
does after an opset conversion.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .onnx_constants import attributes



@dataclass
class Folded:
    conv: str
    folded: str  # "BatchNormalization 'bn1'", ...


def _per_channel(value: np.ndarray, channels: int, rank: int) -> np.ndarray | None:
    """``value`` (broadcast against a Conv output of ``rank`` dimensions) as one number per output channel,
    or None when it varies along another axis."""
    value = np.asarray(value, np.float64)
    if value.size == 1:
        return np.full(channels, float(value.reshape(-1)[0]))
    if value.ndim > rank:
        return None
    shape = (1,) * (rank - value.ndim) + value.shape
    if any(length != 1 for axis, length in enumerate(shape) if axis != 1) or shape[1] != channels:
        return None
    return value.reshape(channels)


def fold(model, read_tensor, write_tensor, onnxruntime: bool = False) -> list[Folded]:
    """Fold the foldable nodes after the main graph's Conv/ConvTranspose nodes, in place.
    ``read_tensor(name)`` gives a main-graph float constant's values (or None); ``write_tensor(name, array)``
    stores new values for it (creating an initializer when it does not exist)."""
    graph = model.graph
    readers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    for output in graph.output:
        readers.setdefault(output.name, []).append(None)
    done: list[Folded] = []
    removed = []
    for conv in list(graph.node):
        if conv.op_type not in ("Conv", "ConvTranspose") or conv.domain not in ("", "ai.onnx") or conv in removed:
            continue
        while True:
            after = readers.get(conv.output[0], [])
            if len(after) != 1 or after[0] is None:
                break
            node = after[0]
            w_name = conv.input[1]
            weight = read_tensor(w_name)
            if weight is None or len(readers.get(w_name, [])) != 1:
                break
            rank = weight.ndim
            group = attributes(conv).get("group", 1)
            channels = weight.shape[0] if conv.op_type == "Conv" else weight.shape[1] * group
            b_name = conv.input[2] if len(conv.input) > 2 and conv.input[2] else None
            bias = read_tensor(b_name) if b_name else np.zeros(channels)
            if bias is None or (b_name and len(readers.get(b_name, [])) != 1):
                break
            bias = np.asarray(bias, np.float64)
            gain = shift = None
            if node.op_type == "BatchNormalization" and len(node.output) == 1:
                values = [read_tensor(name) for name in node.input[1:5]]
                if any(v is None for v in values):
                    break
                scale, beta, mean, var = (np.asarray(v, np.float64).reshape(-1) for v in values)
                epsilon = attributes(node).get("epsilon", 1e-5)
                gain = scale / np.sqrt(var + epsilon)
                shift = beta - mean * gain
            elif node.op_type == "HardSigmoid" and onnxruntime and conv.op_type == "Conv":
                given = attributes(node)
                alpha, beta = given.get("alpha", 0.2), given.get("beta", 0.5)
                gain, shift = np.full(channels, alpha, np.float64), np.full(channels, beta, np.float64)
            elif node.op_type in ("Mul", "Add") and len(node.input) == 2:
                other = node.input[1] if node.input[0] == conv.output[0] else node.input[0]
                value = read_tensor(other)
                per_channel = None if value is None else _per_channel(value, channels, rank)
                if per_channel is None:
                    break
                if node.op_type == "Mul":
                    gain, shift = per_channel, np.zeros(channels)
                else:
                    gain, shift = np.ones(channels), per_channel
            else:
                break
            if conv.op_type == "Conv":
                shape = (channels,) + (1,) * (rank - 1)
                new_weight = np.asarray(weight, np.float64) * gain.reshape(shape)
            else:  # ConvTranspose: [C_in, C_out / group, ...]; output channel o = g * (C_out / group) + j
                per_group = weight.shape[1]
                grid = gain.reshape(group, per_group)
                rows = weight.shape[0] // group
                expanded = np.repeat(grid, rows, axis=0).reshape((weight.shape[0], per_group) + (1,) * (rank - 2))
                new_weight = np.asarray(weight, np.float64) * expanded
            write_tensor(w_name, new_weight.astype(weight.dtype))
            new_bias = (bias * gain + shift).astype(weight.dtype)
            if b_name is None:
                b_name = _unused(graph, f"{w_name}_folded_bias")
                while len(conv.input) < 3:
                    conv.input.append("")
                conv.input[2] = b_name
            write_tensor(b_name, new_bias)
            done.append(Folded(f"{conv.op_type} {conv.name or conv.output[0]!r}", f"{node.op_type} {node.name or node.output[0]!r}"))
            if node.op_type == "HardSigmoid":  # the Conv stays, the HardSigmoid becomes a Clip to [0, 1] of it
                _to_clip(model, node)
                break
            # The Conv now writes what the folded node wrote.
            conv.output[0] = node.output[0]
            graph.node.remove(node)
            removed.append(node)
            readers = {}
            for other_node in graph.node:
                for name in other_node.input:
                    readers.setdefault(name, []).append(other_node)
            for output in graph.output:
                readers.setdefault(output.name, []).append(None)
    if onnxruntime:
        done += _bounds_to_clips(model, read_tensor)
    return done


def _bounds_to_clips(model, read_tensor) -> list[Folded]:
    """Max(x, c) -> Clip(x, c, ) and Min(x, c) -> Clip(x, , c) for a scalar constant c, in place (opset 11+,
    where Clip takes its bounds as inputs)."""
    from onnx import helper

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    if opset < 11:
        return []
    done = []
    for node in model.graph.node:
        if node.op_type not in ("Max", "Min") or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
            continue
        values = [read_tensor(name) for name in node.input]
        constants = [i for i, v in enumerate(values) if v is not None]
        if len(constants) != 1 or np.asarray(values[constants[0]]).size != 1:
            continue
        value = np.asarray(values[constants[0]]).reshape(())
        if value.dtype.kind != "f":
            continue
        bound = _unused(model.graph, f"{node.output[0]}_{'min' if node.op_type == 'Max' else 'max'}")
        model.graph.initializer.append(helper.make_tensor(bound, helper.np_dtype_to_tensor_dtype(value.dtype), [],
                                                          [value.item()]))
        x = node.input[1 - constants[0]]
        label = f"{node.op_type} {node.name or node.output[0]!r}"
        del node.input[:]
        node.input.extend([x, bound] if node.op_type == "Max" else [x, "", bound])
        node.op_type = "Clip"
        done.append(Folded("a Clip of the same bound", label))
    return done


def _to_clip(model, node) -> None:
    """Make HardSigmoid ``node`` a Clip of its input to [0, 1], in place (bounds as inputs from opset 11,
    attributes before)."""
    from onnx import helper

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    graph = model.graph
    del node.attribute[:]
    node.op_type = "Clip"
    if opset >= 11:
        bounds = []
        for value in (0.0, 1.0):
            name = _unused(graph, f"{node.output[0]}_clip_{int(value)}")
            graph.initializer.append(helper.make_tensor(name, 1, [], [value]))
            bounds.append(name)
        node.input.extend(bounds)
    else:
        node.attribute.extend([helper.make_attribute("min", 0.0), helper.make_attribute("max", 1.0)])


def _unused(graph, name: str) -> str:
    taken = {t.name for t in graph.initializer} | {o for n in graph.node for o in list(n.output) + list(n.input)}
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}_{n}"
    return candidate
