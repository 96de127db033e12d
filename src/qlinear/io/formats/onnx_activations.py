"""Static quantization of an ONNX model's activations: which tensors get a QuantizeLinear ->
DequantizeLinear pair, and the graph surgery that inserts them (and quantizes biases to int32).

Selected (main graph; subgraph activations stay float): the float activations that feed the operators
that compute in int8 (Conv, ConvTranspose, MatMul, Gemm: their data inputs, not their weights) and the
inputs and outputs of those operators and of the ones runtimes fuse around them (Add, Mul, Concat,
pooling, Resize, Relu, Clip, LeakyRelu, Sigmoid, HardSigmoid, HardSwish), as onnxruntime's QDQ quantizer
places them: a DequantizeLinear before each of these operators, a QuantizeLinear after. Kept float: the
model's inputs stay as given (their QuantizeLinear is inside the model), its outputs stay float (nothing
after them runs in int8), constants, non-float tensors, and what ``keep_float`` names (node names or
operator types).

A produced tensor T keeps its name: the producer writes ``T_float`` now, read by QuantizeLinear, and the
DequantizeLinear writes T, so every reader (subgraphs included) reads the quantized value under the old
name. A graph input's readers are rewired to its DequantizeLinear's output instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import UserError

INT8_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
AROUND_OPS = frozenset({"Add", "Mul", "Concat", "MaxPool", "AveragePool", "GlobalAveragePool", "Resize", "Relu",
                        "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish"})
# Which inputs of each operator are activations to quantize (None: every float input that is not constant).
_DATA_INPUTS = {"Conv": (0,), "ConvTranspose": (0,), "MatMul": (0, 1), "Gemm": (0, 1), "Resize": (0,), "Clip": (0,),
                "MaxPool": (0,), "AveragePool": (0,), "GlobalAveragePool": (0,), "Relu": (0,), "LeakyRelu": (0,),
                "Sigmoid": (0,), "HardSigmoid": (0,), "HardSwish": (0,)}
_FLOAT = 1  # TensorProto.FLOAT
# Activations that onnxruntime folds into the int8 Conv/MatMul/Gemm before them when the QuantizeLinear after
# them starts at zero (its Relu/Clip-Q fusion): a product read by one of these alone is not quantized, the pair
# goes after it. (Batch norms and Mul/Add by constants are folded into the weights before quantization:
# `onnx_folding`.)
FOLDED_AFTER = frozenset({"Relu", "Clip"})


@dataclass
class Activation:
    """One activation tensor to quantize: who makes it, who reads it, and why it was chosen."""

    name: str
    producer: str  # the producing node ("Conv 'conv1'"), or "" for a graph input
    node: str = ""  # the producing node's name (its first output's where it has none): what --keep-float takes
    readers: list[str] = field(default_factory=list)  # "Conv conv1", ...
    ops: set[str] = field(default_factory=set)  # the operator types whose inputs or outputs it is


@dataclass
class Skipped:
    name: str
    reason: str


def _node_label(node) -> str:
    return f"{node.op_type} {node.name or node.output[0]!r}"


def _constant_names(graph) -> set[str]:
    """Tensors that do not depend on the model's inputs: initializers, Constant outputs, and the outputs of
    nodes whose inputs all are such (shape arithmetic on constants)."""
    constant = {t.name for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" or (node.input and all(not i or i in constant for i in node.input)
                                          and not any(a.type in (5, 10) for a in node.attribute)):
            constant.update(o for o in node.output if o)
    return constant


def elem_types(model) -> dict[str, int]:
    """The element type of every main-graph tensor that onnx's shape inference can tell."""
    from onnx import shape_inference

    try:
        inferred = shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 (inference fails on some exports: fall back to what the model declares)
        inferred = model
    graph = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in list(graph.value_info) + list(graph.input) + list(graph.output)
             if v.type.HasField("tensor_type")}
    types.update({t.name: t.data_type for t in model.graph.initializer})
    return types


def _folded(readers: list, constant: set[str]) -> bool:
    """A value read by one node that onnxruntime folds into its producer."""
    return len(readers) == 1 and readers[0].op_type in FOLDED_AFTER


def _fused_chains(graph, readers: dict, constant: set[str]) -> dict[str, str]:
    """The tensors inside a Conv/MatMul/Gemm's fused chain (its product and the values between the folded
    operators after it), each with the label of the chain's first operator."""
    inside: dict[str, str] = {}
    head: dict[str, str] = {}  # node output -> the chain's first operator
    for node in graph.node:
        if node.op_type in INT8_OPS:
            label = _node_label(node)
        else:
            feeding = [head[name] for name in node.input if name in head and name in inside]
            if not feeding:
                continue
            label = feeding[0]
        for name in node.output[:1]:
            if name and _folded(readers.get(name, []), constant):
                head[name] = label
                inside[name] = label
    return inside


def kept_nodes(model, keep_float: tuple[str, ...]) -> list:
    """The main-graph nodes that ``keep_float`` names, by node name or operator type."""
    kept = set(keep_float)
    return [node for node in model.graph.node
            if node.name in kept or node.op_type in kept or (not node.name and node.output and node.output[0] in kept)]


def select(model, keep_float: tuple[str, ...] = ()) -> tuple[list[Activation], list[Skipped]]:
    """The activations of ``model`` (a ModelProto) to quantize, in graph order, and those left float with
    the reason. A node that ``keep_float`` names computes in float: no tensor it reads or writes is
    quantized, for it or for its neighbours."""
    graph = model.graph
    types = elem_types(model)
    constant = _constant_names(graph)
    outputs = {o.name for o in graph.output}
    inputs = {i.name for i in graph.input} - {t.name for t in graph.initializer}
    producers = {o: node for node in graph.node for o in node.output if o}
    readers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    fused = _fused_chains(graph, readers, constant)
    float_tensors = {}
    for node in kept_nodes(model, keep_float):
        for name in list(node.input) + list(node.output):
            if name:
                float_tensors.setdefault(name, f"--keep-float {node.name if node.name in keep_float else node.op_type}")
    chosen: dict[str, Activation] = {}
    skipped: dict[str, Skipped] = {}

    def consider(name: str, node, role: str):
        if not name or name in constant:
            return
        if types.get(name) != _FLOAT:
            if types.get(name) in (None, 0):
                skipped.setdefault(name, Skipped(name, "its type is unknown (shape inference could not tell)"))
            return
        if name in float_tensors:
            skipped.setdefault(name, Skipped(name, float_tensors[name]))
            return
        if name in outputs:
            skipped.setdefault(name, Skipped(name, "a model output (stays float)"))
            return
        producer = producers.get(name)
        if name in fused:
            skipped.setdefault(name, Skipped(name, f"inside the fused chain of {fused[name]} "
                                                   f"(read by {readers[name][0].op_type} alone)"))
            return
        if producer is None and name not in inputs:
            return  # an outer-scope name of a subgraph: not this graph's
        activation = chosen.setdefault(name, Activation(name, "" if producer is None else _node_label(producer),
                                                        "" if producer is None else producer.name or producer.output[0]))
        activation.ops.add(node.op_type)
        if role == "input":
            activation.readers.append(_node_label(node))

    for node in graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in INT8_OPS | AROUND_OPS:
            continue
        positions = _DATA_INPUTS.get(node.op_type)
        for position, name in enumerate(node.input):
            if positions is None or position in positions:
                consider(name, node, "input")
        for name in node.output[:1]:
            consider(name, node, "output")
    return list(chosen.values()), [s for name, s in skipped.items() if name not in chosen]


# ----------------------------------------------------------------------------------------------------
# Writing


def insert_pairs(model, activations: list[Activation], parameters: dict, qtype, taken: set[str], unique) -> int:
    """Insert QuantizeLinear -> DequantizeLinear after each activation's producer (or at the top for a graph
    input). ``parameters[name]`` = (scale float32 scalar, zero point scalar of ``qtype``, or None for a float
    type). Returns the number of pairs."""
    from onnx import helper

    graph = model.graph
    position_of = {o: index for index, node in enumerate(graph.node) for o in node.output if o}
    inserts: list[tuple[int, list]] = []
    initializers = []
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
        inserts.append((where, nodes))
    for where, nodes in sorted(inserts, key=lambda item: -item[0]):  # from the end, so positions hold
        for offset, node in enumerate(nodes):
            graph.node.insert(where + offset, node)
    graph.initializer.extend(initializers)
    return len(inserts)


def _rename_readers(graph, old: str, new: str) -> None:
    """Every reader of ``old`` in ``graph`` and in the subgraphs that see it reads ``new``."""
    for node in graph.node:
        for position, name in enumerate(node.input):
            if name == old:
                node.input[position] = new
        for attribute in node.attribute:
            for sub in [attribute.g] if attribute.type == 5 else list(attribute.graphs) if attribute.type == 10 else []:
                if old not in {i.name for i in sub.input} | {t.name for t in sub.initializer}:
                    _rename_readers(sub, old, new)


def bias_plans(model, activations: dict[str, tuple], weight_scales: dict[str, np.ndarray], constants) -> list[dict]:
    """The int32 biases: for each Conv/ConvTranspose (input 2) and Gemm (input 2, alpha = beta = 1, 1-D) whose
    input and weight are both quantized and whose float bias is read by it alone, the bias scale
    x_scale * w_scale (per output channel)."""
    from onnx import helper

    readers: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    plans = []
    for node in model.graph.node:
        if node.op_type not in ("Conv", "ConvTranspose", "Gemm") or len(node.input) < 3 or not node.input[2]:
            continue
        x, w, b = node.input[0], node.input[1], node.input[2]
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "Gemm" and (attributes.get("alpha", 1.0) != 1.0 or attributes.get("beta", 1.0) != 1.0
                                       or attributes.get("transA", 0)):
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


def require_known(activations: list[Activation], parameters: dict) -> None:
    missing = [a.name for a in activations if a.name not in parameters]
    if missing:
        raise UserError(f"no calibration statistics for {', '.join(missing[:3])}")
