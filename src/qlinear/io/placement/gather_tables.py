"""4-bit embedding tables for onnxruntime: ``DequantizeLinear(table) -> Gather`` becomes onnxruntime's contrib
``com.microsoft.GatherBlockQuantized``, which dequantizes only the rows it gathers.

Onnxruntime folds no DequantizeLinear of a constant and fuses none into a Gather: it dequantizes the whole table
on every run (MiniLM-L3's 30522 x 384 int4 table: 40 ms, fifteen times the float model's whole run). Its contrib
operator computes ``float(q - zero_point) * scale`` per gathered element, DequantizeLinear's arithmetic, on the
same codes, scales and zero points (`qlinear.onnx.ops.GatherBlockQuantized` transcribes it; the tests run
both in onnxruntime and demand the same bits). Its CPU kernel (onnxruntime 1.32) takes int4 and uint4 tables with
blocks of a power of two >= 16 along any axis; a table that does not fit keeps its DequantizeLinear. It writes
zeros for an index out of range where Gather fails.
"""

from __future__ import annotations

from ..formats.onnx_constants import names_read_inside, stored_constants

DOMAIN = "com.microsoft"
_INT4, _UINT4 = 22, 21  # TensorProto.INT4, UINT4
_SCALE_TYPES = (1, 10)  # FLOAT, FLOAT16: the kernel's output types


def rewrite(model) -> list[str]:
    """Rewrite every fitting ``DequantizeLinear -> Gather`` of the main graph in place; returns the tables'
    names (the DequantizeLinear outputs), in graph order."""
    from onnx import helper

    graph = model.graph
    constants = _constant_types(graph)
    readers: dict[str, list] = {}
    for node in graph.node:
        for position, name in enumerate(node.input):
            readers.setdefault(name, []).append((node, position))
    in_subgraphs = _subgraph_inputs(graph)
    outputs = {o.name for o in graph.output}
    done, dropped = [], []
    for node in list(graph.node):
        fits = _fits(node, constants, readers, in_subgraphs, outputs)
        if fits is None:
            continue
        axis, block = fits
        for gather, _ in readers[node.output[0]]:
            inputs = [node.input[0], gather.input[1], node.input[1]] + list(node.input[2:3])
            gather_axis = next((a.i for a in gather.attribute if a.name == "axis"), 0)
            replacement = helper.make_node("GatherBlockQuantized", inputs, list(gather.output), name=gather.name,
                                           domain=DOMAIN, gather_axis=gather_axis, quantize_axis=axis,
                                           block_size=block, bits=4)
            position = list(graph.node).index(gather)
            graph.node.remove(gather)
            graph.node.insert(position, replacement)
        dropped.append(node)
        done.append(node.output[0])
    for node in dropped:
        graph.node.remove(node)
    if done and not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return done


def _fits(node, constants: dict, readers: dict, in_subgraphs: set, outputs: set):
    """(quantize axis >= 0, block size) where ``node`` is a DequantizeLinear that the contrib operator can take
    the place of, with its readers; None otherwise."""
    if node.op_type != "DequantizeLinear" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
        return None
    attributes = {a.name: a for a in node.attribute}
    block = attributes["block_size"].i if "block_size" in attributes else 0
    if block < 16 or block & (block - 1):
        return None
    if "output_dtype" in attributes and attributes["output_dtype"].i != constants.get(node.input[1], (None,))[0]:
        return None
    data, scale = constants.get(node.input[0]), constants.get(node.input[1])
    if data is None or scale is None or data[0] not in (_INT4, _UINT4) or scale[0] not in _SCALE_TYPES:
        return None
    if len(node.input) > 2 and node.input[2] and constants.get(node.input[2], (None,))[0] != data[0]:
        return None
    rank = data[1]
    axis = attributes["axis"].i if "axis" in attributes else 1
    axis = axis + rank if axis < 0 else axis
    out = node.output[0]
    reading = readers.get(out, [])
    if (not reading or out in outputs or out in in_subgraphs
            or any(r.op_type != "Gather" or r.domain not in ("", "ai.onnx") or p != 0 for r, p in reading)):
        return None
    return axis, block


def _constant_types(graph) -> dict:
    """name -> (element type, rank) of the graph's stored tensors."""
    return {name: (t.data_type, len(t.dims)) for name, t in stored_constants(graph).items() if t is not None}


def _subgraph_inputs(graph) -> set[str]:
    """Every tensor name a node of a subgraph (If/Loop/Scan bodies, at any depth) reads."""
    return {name for node in graph.node for name in names_read_inside(node)}
