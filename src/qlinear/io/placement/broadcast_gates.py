"""Channel gates for onnxruntime: a squeeze-excite block's ``x * gate``, where the gate is one value per sample and
channel (``[N, C, 1, 1]``) and both operands are read from DequantizeLinear, gets its gate's codes tiled to x's
shape first (``Tile(gate codes, [1, 1] + shape(x)[2:])`` between the gate's QuantizeLinear and DequantizeLinear).

Onnxruntime fuses ``DequantizeLinear x2 -> Mul -> QuantizeLinear`` into its contrib QLinearMul either way. Its
broadcasting loop (`BroadcastLooper`) splits work between threads only when the output is one span of equal
shapes: a gate broadcast over the map runs on one thread (one-node models, uint8 [8, 2, 96, 208] by
[8, 1, 1, 208]: 153 us on 1 thread, 148 on 2; two tensors of the same shape: 133 -> 71 us). Tiled, the
multiplication is of equal shapes and the codes are the same ones (Tile repeats them; a DequantizeLinear of the
tiled codes is the broadcast dequantized gate), so the outputs keep their bits. Onnxruntime's layout
transformer moves its NHWC transposes through Tile, so no transpose of the full map appears. Measured on the
OCR classifier in BENCHMARKS.md ("Channel gates tiled").
"""

from __future__ import annotations

import numpy as np

from ..formats.onnx_model import _all_names, _unique
from .graph import GraphView


def rewrite(model) -> list[tuple[str, str]]:
    """Tile the gate of every fitting ``Mul`` of the main graph in place (module docstring); returns, in graph
    order, each Mul node's name (its output, for an unnamed node) and the tiled gate (its DequantizeLinear's
    output, which now holds the repeated values). A gate fits when shape inference gives its
    codes rank >= 3 with every axis after the second of size 1, x the same rank with some such axis known to be
    larger (or unknown), and the gate's DequantizeLinear is read by this Mul alone."""
    from onnx import helper, numpy_helper

    graph = model.graph
    view = GraphView(model)
    taken = _all_names(model)
    done, inserts, constants = [], {}, {}
    for node in graph.node:
        fit = _fits(node, view)
        if fit is None:
            continue
        gate_dq, x_codes, rank = fit
        tiled = _unique(f"{gate_dq.input[0]}_tiled", taken)
        shape, spatial, repeats = (_unique(f"{tiled}_{what}", taken) for what in ("shape", "spatial", "repeats"))
        if rank not in constants:
            names = [_unique(f"qlinear_tile_{what}_{rank}", taken) for what in ("ones", "start", "end")]
            values = (np.ones(2, np.int64), np.array([2], np.int64), np.array([rank], np.int64))
            graph.initializer.extend(numpy_helper.from_array(v, n) for v, n in zip(values, names))
            constants[rank] = names
        ones, start, end = constants[rank]
        inserts[id(gate_dq)] = [
            helper.make_node("Shape", [x_codes], [shape], name=f"{tiled}_Shape"),
            helper.make_node("Slice", [shape, start, end], [spatial], name=f"{tiled}_Slice"),
            helper.make_node("Concat", [ones, spatial], [repeats], name=f"{tiled}_Concat", axis=0),
            helper.make_node("Tile", [gate_dq.input[0], repeats], [tiled], name=f"{tiled}_Tile"),
        ]
        gate_dq.input[0] = tiled
        done.append((node.name or node.output[0], gate_dq.output[0]))
    if inserts:
        ordered = []
        for node in graph.node:
            ordered.extend(inserts.get(id(node), ()))
            ordered.append(node)
        del graph.node[:]
        graph.node.extend(ordered)
    return done


def _fits(node, view: GraphView):
    """(the gate's DequantizeLinear, x's codes, the rank) where ``node`` is a Mul of a tileable gate; else None."""
    if node.op_type != "Mul" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
        return None
    dequantized = [view.producers.get(name) for name in node.input]
    if any(d is None or d.op_type != "DequantizeLinear" for d in dequantized):
        return None
    codes = [d.input[0] for d in dequantized]
    if any(view.producers.get(c) is None or view.producers[c].op_type != "QuantizeLinear" for c in codes):
        return None
    for gate in (0, 1):
        g, x = view.shapes.get(codes[gate]), view.shapes.get(codes[1 - gate])
        if not g or not x or len(g) != len(x) or len(g) < 3 or any(d != 1 for d in g[2:]):
            continue
        if all(d == 1 for d in x[2:]) or any(a is not None and b is not None and a != b for a, b in zip(g[:2], x[:2])):
            continue  # nothing to tile, or the gate broadcasts over the batch or the channels too
        gate_dq = dequantized[gate]
        if len(view.readers.get(gate_dq.output[0], ())) != 1 or gate_dq.output[0] in view.outputs:
            continue
        return gate_dq, codes[1 - gate], len(g)
    return None
