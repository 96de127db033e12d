"""Static quantization of an ONNX model's activations: the graph surgery that inserts the pairs a placement
chose (`io.placement`) and quantizes biases to int32.

A produced tensor T keeps its name: the producer writes ``T_float`` now, read by QuantizeLinear, and the
DequantizeLinear writes T, so every reader (subgraphs included) reads the quantized value under the old
name. A graph input's readers are rewired to its DequantizeLinear's output instead. A Mul or Div by a scalar
that a placement folded into a pair (`placement.ScaleFold`) is replaced by a second DequantizeLinear of the
pair's codes that writes the node's output.
"""

from __future__ import annotations

import numpy as np

from .onnx_constants import attributes, subgraphs

_FLOAT = 1  # TensorProto.FLOAT


# ----------------------------------------------------------------------------------------------------
# Writing


def insert_pairs(model, activations: list, parameters: dict, qtype, taken: set[str], unique, scale_folds=()) -> int:
    """Insert QuantizeLinear -> DequantizeLinear after each activation's producer (or at the top for a graph
    input), and the DequantizeLinear of each scale fold in place of its node. ``parameters[name]`` = (scale
    float32 scalar, zero point scalar of ``qtype``, or None for a float type). Returns the number of pairs."""
    from onnx import helper

    graph = model.graph
    for fold in scale_folds:
        graph.node.remove(fold.node)
    position_of = {o: index for index, node in enumerate(graph.node) for o in node.output if o}
    inserts: list[tuple[int, list]] = []
    initializers = []
    folds: dict[str, list] = {}
    for fold in scale_folds:
        folds.setdefault(fold.source, []).append(fold)
    for activation in activations:
        name = activation.name
        scale, zero_point = parameters[name]
        s_name, z_name = unique(f"{name}_scale", taken), unique(f"{name}_zero_point", taken)
        initializers.append(helper.make_tensor(s_name, _FLOAT, [], np.asarray(scale, np.float32).tobytes(), raw=True))
        # A float8 type has a zero zero point: it still names QuantizeLinear's output type (before opset 21's
        # output_dtype attribute).
        zero = np.asarray(0 if zero_point is None else zero_point, qtype.dtype)
        initializers.append(helper.make_tensor(z_name, qtype.tensorproto, [], zero.tobytes(), raw=True))
        quantized = unique(f"{name}_quantized", taken)
        if name in position_of:  # a produced tensor keeps its name on the DequantizeLinear's output
            source, target = unique(f"{name}_float", taken), name
            producer = graph.node[position_of[name]]
            producer.output[list(producer.output).index(name)] = source
            where = position_of[name] + 1
        else:  # a graph input: its readers read the DequantizeLinear's output
            source, target = name, unique(f"{name}_dequantized", taken)
            _rename_readers(graph, name, target)
            where = 0
        q_inputs = [source, s_name, z_name]
        dq_inputs = [quantized, s_name, z_name]
        nodes = [helper.make_node("QuantizeLinear", q_inputs, [quantized], name=unique(f"{name}_QuantizeLinear", taken)),
                 helper.make_node("DequantizeLinear", dq_inputs, [target], name=unique(f"{name}_DequantizeLinear", taken))]
        for fold in folds.pop(name, []):
            # The folded node's output from the same codes: (q - zero point) * (scale * factor).
            folded = fold.node.output[0]
            f_name = unique(f"{folded}_scale", taken)
            factor_scale = np.float32(np.float64(scale) * fold.factor)
            initializers.append(helper.make_tensor(f_name, _FLOAT, [], factor_scale.tobytes(), raw=True))
            nodes.append(helper.make_node("DequantizeLinear", [quantized, f_name, z_name], [folded],
                                          name=unique(f"{folded}_DequantizeLinear", taken)))
        inserts.append((where, nodes))
    if folds:
        raise ValueError(f"scale folds of activations without a pair: {sorted(folds)}")
    for where, nodes in sorted(inserts, key=lambda item: -item[0]):  # from the end, so positions hold
        for offset, node in enumerate(nodes):
            graph.node.insert(where + offset, node)
    graph.initializer.extend(initializers)
    return len(inserts)


def insert_operand(model, operand, q: np.ndarray, scale, zero_point, qtype, taken: set[str], unique) -> int:
    """A constant operand's quantized values, scale and zero point as initializers and a DequantizeLinear just
    before its reader, which reads that instead (the constant stays for its other readers); returns the bytes
    of the new tensors."""
    from onnx import helper

    from ..storage import to_storage

    graph, node, name = model.graph, operand.node, operand.name
    q_name, s_name, z_name, out = (unique(f"{name}_{suffix}", taken) for suffix in ("quantized", "scale",
                                                                                       "zero_point", "dequantized"))
    raw = np.ascontiguousarray(to_storage(np.asarray(q), qtype))
    tensors = [helper.make_tensor(q_name, qtype.tensorproto, list(q.shape), raw.tobytes(), raw=True),
               helper.make_tensor(s_name, _FLOAT, [], np.asarray(scale, np.float32).tobytes(), raw=True)]
    inputs = [q_name, s_name]
    if zero_point is not None:
        tensors.append(helper.make_tensor(z_name, qtype.tensorproto, [],
                                          np.asarray(zero_point, qtype.dtype).tobytes(), raw=True))
        inputs.append(z_name)
    graph.initializer.extend(tensors)
    dequantize = helper.make_node("DequantizeLinear", inputs, [out], name=unique(f"{name}_DequantizeLinear", taken))
    graph.node.insert(list(graph.node).index(node), dequantize)
    for position, input_name in enumerate(node.input):
        if input_name == name:
            node.input[position] = out
    return sum(len(t.raw_data) for t in tensors)


def _rename_readers(graph, old: str, new: str) -> None:
    """Every reader of ``old`` in ``graph`` and in the subgraphs that see it reads ``new``."""
    for node in graph.node:
        for position, name in enumerate(node.input):
            if name == old:
                node.input[position] = new
        for sub in subgraphs(node):
            if old not in {i.name for i in sub.input} | {t.name for t in sub.initializer}:
                _rename_readers(sub, old, new)


def bias_plans(model, activations: dict[str, tuple], weight_scales: dict[str, np.ndarray], constants) -> list[dict]:
    """The int32 biases: for each Conv/ConvTranspose (input 2) and Gemm (input 2, alpha = beta = 1, 1-D) whose
    input and weight are both quantized and whose float bias is read by it alone, the bias scale
    x_scale * w_scale (per output channel)."""
    readers: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    plans = []
    for node in model.graph.node:
        if node.op_type not in ("Conv", "ConvTranspose", "Gemm") or len(node.input) < 3 or not node.input[2]:
            continue
        x, w, b = node.input[0], node.input[1], node.input[2]
        given = attributes(node)
        if node.op_type == "Gemm" and (given.get("alpha", 1.0) != 1.0 or given.get("beta", 1.0) != 1.0
                                       or given.get("transA", 0)):
            continue
        if x not in activations or w not in weight_scales or b not in constants or readers.get(b, 0) != 1:
            continue
        plans.append({"node": node, "bias": b, "x_scale": float(activations[x][0]), "w_scale": weight_scales[w]})
    return plans


def int32_bias(bias: np.ndarray, x_scale: float, w_scale: np.ndarray, where: str) -> tuple[np.ndarray, np.ndarray] | str:
    """(int32 values, float32 scale per output channel) of a bias, or the reason it stays float (its
    values would leave int32: what onnxruntime's quantizer warns of and clips)."""
    scale = (np.float64(x_scale) * np.asarray(w_scale, np.float64)).astype(np.float32)
    if scale.shape not in ((), bias.shape):
        scale = np.broadcast_to(scale, bias.shape).astype(np.float32)
    if np.any(scale <= 0):
        return "a zero scale"
    scale = np.broadcast_to(scale, bias.shape).astype(np.float32)
    values = np.rint(bias.astype(np.float64) / scale.astype(np.float64))
    if np.any(np.abs(values) > 2**31 - 1):
        return f"its values over x_scale * w_scale leave int32 (largest {float(np.max(np.abs(values))):.3g})"
    return values.astype(np.int32), scale
