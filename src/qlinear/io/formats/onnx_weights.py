"""Finding a model's weights: every float constant, wherever it is stored, and how the graph uses it.

A constant is an initializer or the ``value`` of a Constant node, in the main graph or in the graphs
of If, Loop and Scan at any depth (a subgraph sees the constants of the graphs around it by name).
Exporters seldom feed a weight straight to its operator: Paddle writes Constant nodes, PyTorch casts
float16 weights or reorders an LSTM's gates with Slice and Concat, others transpose or reshape. So the
search follows each constant through the constant-foldable operators (Identity, Cast to a float type,
Transpose, Reshape, Flatten, Unsqueeze, Squeeze, Slice, Concat, Split, and Gather with constant
indices) to the operators that read it, keeping track of which of the constant's own axes each axis
of the folded value comes from. A weight-bearing operator then says which axes of its input are the
output channels and the reduction (`CONSUMERS`), and these are carried back to the constant's axes.

The model is not changed here: `onnx_model` quantizes the constants where they are stored, so every
chain after them computes what it did before, on dequantized values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..plan import Use

# op -> {input index: (input name, carries a weight, channel axis, reduction axis)}. Axes are in the
# input's own coordinates, negative from the end; a callable takes (rank, attributes) for the ops
# whose layout depends on an attribute.
_FLOAT_TYPES = {1, 10, 11, 16}  # TensorProto FLOAT, FLOAT16, DOUBLE, BFLOAT16


def _gemm_a(rank, attrs):
    return (1, 0) if attrs.get("transA", 0) else (0, 1)


def _gemm_b(rank, attrs):
    return (0, 1) if attrs.get("transB", 0) else (1, 0)


def _matmul_a(rank, attrs):
    return (None, 0) if rank == 1 else (-2, -1)


def _matmul_b(rank, attrs):
    return (None, 0) if rank == 1 else (-1, -2)


def _gather_data(rank, attrs):
    axis = attrs.get("axis", 0) % max(rank, 1)
    others = [a for a in range(rank) if a != axis]
    return axis, (others[-1] if others else None)


CONSUMERS: dict[str, dict[int, tuple]] = {
    "Conv": {1: ("W", True, 0, 1), 2: ("B", False, None, None)},
    "ConvTranspose": {1: ("W", True, 1, 0), 2: ("B", False, None, None)},
    "Gemm": {0: ("A", True, _gemm_a), 1: ("B", True, _gemm_b), 2: ("C", False, None, None)},
    "MatMul": {0: ("A", True, _matmul_a), 1: ("B", True, _matmul_b)},
    "LSTM": {1: ("W", True, 1, 2), 2: ("R", True, 1, 2), 3: ("B", False, None, None),
             5: ("initial_h", False, None, None), 6: ("initial_c", False, None, None), 7: ("P", False, None, None)},
    "GRU": {1: ("W", True, 1, 2), 2: ("R", True, 1, 2), 3: ("B", False, None, None),
            5: ("initial_h", False, None, None)},
    "RNN": {1: ("W", True, 1, 2), 2: ("R", True, 1, 2), 3: ("B", False, None, None),
            5: ("initial_h", False, None, None)},
    "Gather": {0: ("data", True, _gather_data)},  # an embedding table: its indices are not constant
}
FOLDABLE = frozenset({"Identity", "Cast", "Transpose", "Reshape", "Flatten", "Unsqueeze", "Squeeze", "Slice",
                      "Concat", "Split", "Gather"})
_SMALL = 4096  # integer constants up to this many elements are read as parameters (shapes, axes, indices)


@dataclass
class Constant:
    """A float constant of the model and the uses the search found."""

    name: str
    tensor: object  # its onnx.TensorProto
    graph: object  # the onnx.GraphProto that defines it
    node: object | None  # the Constant node, or None for an initializer
    scope: str  # "" for the main graph; "If 'cond' then_branch", nested with " > "
    uses: list[Use] = field(default_factory=list)

    @property
    def location(self) -> str:
        kind = "initializer" if self.node is None else "Constant node"
        return f"{self.scope}: {kind}" if self.scope else kind


@dataclass(frozen=True)
class _Part:
    """Where part of a folded value comes from: a constant, and for each axis of the value the
    constant's axis it runs along (None for an axis the chain made)."""

    source: Constant
    axes: tuple[int | None, ...]
    through: tuple[str, ...]


@dataclass(frozen=True)
class _Value:
    shape: tuple[int, ...]
    parts: tuple[_Part, ...]


def find_constants(model, attributes_of, small_array) -> list[Constant]:
    """Every float constant of ``model`` with its uses, in graph order (subgraphs after their parent
    node's earlier constants). ``attributes_of(node)`` gives a node's attributes as Python values;
    ``small_array(tensor)`` a small TensorProto's values (both from onnx, passed in by the caller)."""
    found: list[Constant] = []
    _search(model.graph, "", {}, {}, found, attributes_of, small_array)
    return found


def _search(graph, scope: str, outer_values: dict, outer_params: dict, found: list, attributes_of, small_array):
    values: dict[str, _Value] = dict(outer_values)  # name -> folded float constant
    params: dict[str, np.ndarray] = dict(outer_params)  # name -> small integer constant (shapes, axes, ...)

    def add_constant(name, tensor, node):
        if tensor.data_type in _FLOAT_TYPES:
            constant = Constant(name, tensor, graph, node, scope)
            found.append(constant)
            rank = len(tensor.dims)
            values[name] = _Value(tuple(int(d) for d in tensor.dims), (_Part(constant, tuple(range(rank)), ()),))
        elif math.prod(tensor.dims) <= _SMALL:
            array = small_array(tensor)
            if array is not None:
                params[name] = array

    for initializer in graph.initializer:
        add_constant(initializer.name, initializer, None)
    for index, node in enumerate(graph.node):
        attrs = attributes_of(node)
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            if "value" in attrs and node.output:
                add_constant(node.output[0], attrs["value"], node)
            elif node.output:
                for key in ("value_int", "value_ints"):
                    if key in attrs:
                        params[node.output[0]] = np.asarray(attrs[key], np.int64)
            continue
        folded = None
        if node.op_type in FOLDABLE and node.domain in ("", "ai.onnx"):
            folded = _fold(node, attrs, values, params)
        if folded is not None:
            for name, value in zip(node.output, folded):
                if name:
                    values[name] = value
        else:
            if node.op_type in FOLDABLE and node.op_type != "Gather" and all(i in params for i in node.input if i):
                _fold_params(node, attrs, params)
            _record_uses(node, attrs, values, params, scope)
        for key, attr in attrs.items():
            subgraphs = attr if isinstance(attr, list) else [attr]
            for position, sub in enumerate(subgraphs):
                if hasattr(sub, "node") and hasattr(sub, "initializer"):
                    label = f"{node.op_type} {node.name or node.output[0]!r} {key}"
                    if len(subgraphs) > 1:
                        label += f"[{position}]"
                    _search(sub, f"{scope} > {label}" if scope else label, values, params, found,
                            attributes_of, small_array)
    for output in graph.output:
        for part in values.get(output.name, _Value((), ())).parts:
            part.source.uses.append(Use("graph output", output.name, False, through=part.through))


def _record_uses(node, attrs, values, params, scope):
    slots = CONSUMERS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
    for index, name in enumerate(node.input):
        value = values.get(name) if name else None
        if value is None:
            continue
        spec = (slots or {}).get(index)
        rank = len(value.shape)
        if spec is None:
            label, weight, channel, reduction = f"input {index}", False, None, None
        elif len(spec) == 3:
            label, weight, layout = spec
            channel, reduction = layout(rank, attrs)
        else:
            label, weight, channel, reduction = spec
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] in params:
            weight = False  # constant indices: a lookup the search could not fold, not an embedding
        for part in value.parts:
            use = Use(node.op_type, label, weight, _axis_of(part, channel, rank), _axis_of(part, reduction, rank),
                      f"{scope}: {node.name}" if scope else node.name, part.through)
            part.source.uses.append(use)


def _axis_of(part: _Part, axis, rank: int):
    if axis is None or rank == 0 or not -rank <= axis < rank:
        return None
    return part.axes[axis % rank]


# ----------------------------------------------------------------------------------------------------
# Folding: the shape of each foldable operator's output and where its axes come from


def _fold(node, attrs, values, params) -> list[_Value] | None:
    """The folded outputs of ``node`` when its data input(s) are folded constants and every other
    input is a known small integer constant; None otherwise."""
    op = node.op_type
    inputs = list(node.input)
    if op == "Concat":
        if not inputs or any(name not in values for name in inputs):
            return None
        shapes = [values[name].shape for name in inputs]
        rank = len(shapes[0])
        if rank == 0 or any(len(s) != rank for s in shapes):
            return None
        axis = attrs.get("axis", 0) % rank
        shape = list(shapes[0])
        shape[axis] = sum(s[axis] for s in shapes)
        parts = tuple(_through(part, part.axes, op) for name in inputs for part in values[name].parts)
        return [_Value(tuple(shape), parts)]
    if not inputs or inputs[0] not in values:
        return None
    extra = [name for name in inputs[1:] if name]
    if any(name not in params for name in extra):
        return None
    value = values[inputs[0]]
    shape = value.shape
    rank = len(shape)
    try:
        if op == "Identity":
            return [value]
        if op == "Cast":
            if attrs.get("to") not in _FLOAT_TYPES:
                return None
            return [_map(value, shape, tuple(range(rank)), op)]
        if op == "Transpose":
            perm = tuple(attrs.get("perm", range(rank - 1, -1, -1)))
            return [_map(value, tuple(shape[p] for p in perm), perm, op)]
        if op in ("Reshape", "Flatten"):
            if op == "Flatten":
                axis = attrs.get("axis", 1) % (rank + 1) if rank else 0
                target = (math.prod(shape[:axis]), math.prod(shape[axis:]))
            else:
                target = _reshape_target(shape, params[inputs[1]], attrs.get("allowzero", 0))
            return [_map(value, target, _reshape_axes(shape, target), op)]
        if op == "Unsqueeze":
            axes = attrs.get("axes") if "axes" in attrs else params[inputs[1]].tolist()
            out_rank = rank + len(axes)
            inserted = sorted(a % out_rank for a in axes)
            source = iter(range(rank))
            mapping = tuple(None if a in inserted else next(source) for a in range(out_rank))
            target = tuple(1 if m is None else shape[m] for m in mapping)
            return [_map(value, target, mapping, op)]
        if op == "Squeeze":
            axes = attrs.get("axes") if "axes" in attrs else params[inputs[1]].tolist() if len(inputs) > 1 and inputs[1] else None
            removed = {a % rank for a in axes} if axes else {a for a in range(rank) if shape[a] == 1}
            mapping = tuple(a for a in range(rank) if a not in removed)
            return [_map(value, tuple(shape[a] for a in mapping), mapping, op)]
        if op == "Slice":
            return [_map(value, _slice_shape(shape, attrs, inputs, params), tuple(range(rank)), op)]
        if op == "Split":
            axis = attrs.get("axis", 0) % rank
            if "split" in attrs:
                sizes = list(attrs["split"])
            elif len(inputs) > 1 and inputs[1]:
                sizes = params[inputs[1]].tolist()
            else:
                count = attrs.get("num_outputs", len(node.output))
                step = -(-shape[axis] // count)
                sizes = [min(step, shape[axis] - i * step) for i in range(count)]
            outputs = []
            for size in sizes:
                target = list(shape)
                target[axis] = int(size)
                outputs.append(_map(value, tuple(target), tuple(range(rank)), op))
            return outputs
        if op == "Gather":
            if len(inputs) < 2 or inputs[1] not in params:
                return None
            indices = np.asarray(params[inputs[1]])
            axis = attrs.get("axis", 0) % rank
            target = shape[:axis] + tuple(indices.shape) + shape[axis + 1:]
            mapping = tuple(range(axis)) + (None,) * indices.ndim + tuple(range(axis + 1, rank))
            return [_map(value, tuple(target), mapping, op)]
    except (KeyError, IndexError, ValueError, TypeError, ZeroDivisionError):
        return None
    return None


def _through(part: _Part, axes, op: str) -> _Part:
    return _Part(part.source, tuple(axes), part.through + (op,))


def _map(value: _Value, shape, mapping, op: str) -> _Value:
    """``value`` after an operator whose output axis i runs along input axis ``mapping[i]``."""
    parts = tuple(_through(part, tuple(None if m is None else part.axes[m] for m in mapping), op)
                  for part in value.parts)
    return _Value(tuple(int(d) for d in shape), parts)


def _reshape_target(shape, requested, allowzero) -> tuple[int, ...]:
    requested = [int(d) for d in np.asarray(requested).reshape(-1)]
    target = [shape[i] if d == 0 and not allowzero and i < len(shape) else d for i, d in enumerate(requested)]
    if target.count(-1) == 1:
        known = math.prod(d for d in target if d != -1)
        target[target.index(-1)] = math.prod(shape) // known
    if math.prod(target) != math.prod(shape) or any(d < 0 for d in target):
        raise ValueError("not a reshape of this shape")
    return tuple(target)


def _reshape_axes(shape, target) -> tuple[int | None, ...]:
    """For each axis of ``target``, the axis of ``shape`` it is (same length, same elements before it
    in row-major order), or None where a reshape merged or split it."""
    before = {}
    running = 1
    for axis, length in enumerate(shape):
        before.setdefault((running, length), axis)
        running *= length
    mapping, running = [], 1
    for length in target:
        mapping.append(before.get((running, length)) if length != 1 else None)
        running *= length
    return tuple(mapping)


def _slice_shape(shape, attrs, inputs, params) -> tuple[int, ...]:
    rank = len(shape)
    if "starts" in attrs:  # Slice-1: attributes
        starts, ends = list(attrs["starts"]), list(attrs["ends"])
        axes = list(attrs.get("axes", range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts, ends = params[inputs[1]].tolist(), params[inputs[2]].tolist()
        axes = params[inputs[3]].tolist() if len(inputs) > 3 and inputs[3] else list(range(len(starts)))
        steps = params[inputs[4]].tolist() if len(inputs) > 4 and inputs[4] else [1] * len(starts)
    target = list(shape)
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis %= rank
        target[axis] = len(range(*slice(int(start), int(end), int(step)).indices(shape[axis])))
    return tuple(target)


def _fold_params(node, attrs, params):
    """Small integer constants computed from others (a Concat of shape pieces, an Unsqueeze of a
    scalar): kept as parameters so that the chains after them fold too."""
    op = node.op_type
    inputs = [params[name] for name in node.input if name]
    try:
        if op in ("Identity", "Cast") and inputs:
            result = inputs[0].astype(np.int64)
        elif op == "Concat":
            result = np.concatenate([np.atleast_1d(i) for i in inputs], axis=attrs.get("axis", 0))
        elif op == "Unsqueeze":
            axes = attrs.get("axes") if "axes" in attrs else inputs[1].tolist()
            result = np.expand_dims(inputs[0], tuple(axes))
        elif op == "Squeeze":
            axes = attrs.get("axes") if "axes" in attrs else (inputs[1].tolist() if len(inputs) > 1 else None)
            result = np.squeeze(inputs[0], axis=tuple(axes) if axes else None)
        elif op == "Reshape":
            result = inputs[0].reshape(_reshape_target(inputs[0].shape, inputs[1], attrs.get("allowzero", 0)))
        else:
            return
    except (ValueError, IndexError, TypeError, np.exceptions.AxisError):
        return
    if node.output and node.output[0]:
        params[node.output[0]] = result
