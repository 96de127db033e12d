"""What placement reads of a model's main graph: who produces and who reads each tensor, the element types
and shapes that onnx's shape inference can tell, which tensors are constant, and the model's inputs and
outputs. Subgraph activations stay float, so only the main graph is indexed."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..formats.onnx_constants import attributes, producers_of, readers_of, stored_constants

FLOAT = 1  # TensorProto.FLOAT
_GRAPH_ATTRIBUTES = (5, 10)  # AttributeProto.GRAPH, GRAPHS


def node_label(node) -> str:
    return f"{node.op_type} {node.name or node.output[0]!r}"


def node_key(node) -> str:
    """What --keep-float and the report call a node: its name, or its first output's where it has none."""
    return node.name or node.output[0]


def constant_names(graph) -> set[str]:
    """Tensors that do not depend on the model's inputs: initializers, Constant outputs, and the outputs of
    nodes whose inputs all are such (shape arithmetic on constants)."""
    constant = {t.name for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" or (node.input and all(not i or i in constant for i in node.input)
                                          and not any(a.type in _GRAPH_ATTRIBUTES for a in node.attribute)):
            constant.update(o for o in node.output if o)
    return constant


def _inferred(model):
    from onnx import shape_inference

    try:
        return shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 (inference fails on some exports: fall back to what the model declares)
        return model


@dataclass
class GraphView:
    """An index of ``model``'s main graph (a ModelProto), built once per placement."""

    model: object
    types: dict[str, int] = field(init=False)
    shapes: dict[str, tuple | None] = field(init=False)  # dims (int, or None where unknown); None: no shape
    constant: set[str] = field(init=False)
    outputs: set[str] = field(init=False)
    inputs: set[str] = field(init=False)
    producers: dict[str, object] = field(init=False)
    readers: dict[str, list] = field(init=False)

    def __post_init__(self):
        graph = self.model.graph
        inferred = _inferred(self.model).graph
        infos = list(inferred.value_info) + list(inferred.input) + list(inferred.output)
        self.types = {v.name: v.type.tensor_type.elem_type for v in infos if v.type.HasField("tensor_type")}
        self.types.update({t.name: t.data_type for t in graph.initializer})
        self.shapes = {}
        for v in infos:
            if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape"):
                # (Paddle writes an unknown dimension as -1: unknown too)
                self.shapes[v.name] = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                                            for d in v.type.tensor_type.shape.dim)
        self.constant = constant_names(graph)
        self.outputs = {o.name for o in graph.output}
        self.inputs = {i.name for i in graph.input} - {t.name for t in graph.initializer}
        self.producers = producers_of(graph)
        self.readers = readers_of(graph)

    @property
    def nodes(self) -> list:
        return list(self.model.graph.node)

    def is_float_activation(self, name: str) -> bool:
        """A float tensor computed from the model's inputs (not a constant), in this graph."""
        return (bool(name) and name not in self.constant and self.types.get(name) == FLOAT
                and (name in self.producers or name in self.inputs))


def kept_nodes(model, keep_float: tuple[str, ...]) -> list:
    """The main-graph nodes that ``keep_float`` names, by node name or operator type."""
    kept = set(keep_float)
    return [node for node in model.graph.node
            if node.name in kept or node.op_type in kept or (not node.name and node.output and node.output[0] in kept)]


def kept_reasons(model, keep_float: tuple[str, ...]) -> dict[str, str]:
    """Each tensor that a node named by ``keep_float`` reads or writes, with the reason it stays float."""
    reasons: dict[str, str] = {}
    for node in kept_nodes(model, keep_float):
        for name in list(node.input) + list(node.output):
            if name:
                reasons.setdefault(name, f"--keep-float {node.name if node.name in keep_float else node.op_type}")
    return reasons


PRODUCTS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})


def image_stem(model, few_channels: int) -> list[tuple[object, int, list]]:
    """An image's first layers in ``model``'s main graph: each Conv (one group) whose data input is a float model
    input and whose weight is a stored constant with at most ``few_channels`` input channels, with the depthwise
    Convs (one input channel per group, a stored weight) that read its output through operators that compute no
    product (a batch norm, an activation, a constant scale): (the Conv, its input channels, the depthwise Convs)."""
    graph = model.graph
    constants = stored_constants(graph)
    inputs = {i.name: i for i in graph.input if i.name not in constants}
    readers = readers_of(graph)
    stems = []
    for node in graph.node:
        if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            continue
        source, weight = inputs.get(node.input[0]), constants.get(node.input[1])
        if source is None or source.type.tensor_type.elem_type != FLOAT or weight is None \
                or attributes(node).get("group", 1) != 1 or len(weight.dims) < 3 or weight.dims[1] > few_channels:
            continue
        stems.append((node, weight.dims[1], _depthwise_after(node, readers, constants)))
    return stems


def _depthwise_after(first, readers: dict[str, list], constants) -> list:
    """The depthwise Convs with a stored weight that read ``first``'s output through operators that compute no
    product; a product ends the walk on its path."""
    found, seen, frontier = [], {id(first)}, list(first.output)
    while frontier:
        for node in readers.get(frontier.pop(), ()):
            if id(node) in seen:
                continue
            seen.add(id(node))
            if node.op_type not in PRODUCTS:
                frontier.extend(node.output)
                continue
            weight = constants.get(node.input[1]) if node.op_type == "Conv" and len(node.input) > 1 else None
            if weight is not None and node.domain in ("", "ai.onnx") and attributes(node).get("group", 1) > 1 \
                    and len(weight.dims) >= 3 and weight.dims[1] == 1:
                found.append(node)
    return found
