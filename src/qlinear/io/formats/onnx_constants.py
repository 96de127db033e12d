"""The value of a main-graph tensor that does not depend on the model's inputs, where it is a stored constant
or a short chain of shape operators on constants (Paddle writes a convolution's bias as ``Add(x,
Reshape(bias, shape))``): what the rewrites before static quantization read to fold such a node."""

from __future__ import annotations

import numpy as np

_DEPTH = 8  # operators followed back from a tensor at most


def attributes(node) -> dict:
    """A node's attributes by name (strings as onnx gives them: bytes)."""
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def producers_of(graph) -> dict:
    """Tensor name -> the node of ``graph`` that writes it."""
    return {out: node for node in graph.node for out in node.output if out}


def readers_of(graph) -> dict[str, list]:
    """Tensor name -> the nodes of ``graph`` that read it, in graph order."""
    readers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            if name:
                readers.setdefault(name, []).append(node)
    return readers


def _float_type(to: int):
    from onnx import helper

    return np.dtype(helper.tensor_dtype_to_np_dtype(to))


class ConstantValues:
    """``values(name)``: the array of a constant tensor of ``model``'s main graph, or None where it is not one
    this can compute. ``stored(name)`` reads an initializer or Constant node output (None if not one)."""

    def __init__(self, model, stored):
        self.stored = stored
        self.producers = {o: node for node in model.graph.node for o in node.output if o}
        # Integer constants (shapes, axes) are not among the float constants `stored` reads.
        self._small = {t.name: t for t in model.graph.initializer if t.data_type != 1}
        self._cache: dict[str, np.ndarray | None] = {}  # computed values (of constants that are not rewritten)

    def __call__(self, name: str, depth: int = 0) -> np.ndarray | None:
        value = self.stored(name)  # read again each time: a rewrite may have stored new values
        if value is not None:
            return np.asarray(value)
        if name not in self._cache:
            self._cache[name] = self._computed(name, depth) if depth < _DEPTH else None
        return self._cache[name]

    def _computed(self, name: str, depth: int) -> np.ndarray | None:
        from onnx import numpy_helper

        if name in self._small:
            return numpy_helper.to_array(self._small[name])
        node = self.producers.get(name)
        if node is not None and node.op_type == "Constant":
            value = next((a for a in node.attribute if a.name == "value"), None)
            return None if value is None else numpy_helper.to_array(value.t)
        if node is None or node.domain not in ("", "ai.onnx") or len(node.output) != 1:
            return None
        inputs = [self(i, depth + 1) if i else None for i in node.input]
        if not inputs or inputs[0] is None:
            return None
        x, attrs, op = inputs[0], attributes(node), node.op_type
        try:
            if op == "Identity":
                return x
            if op == "Cast":
                return x.astype(_float_type(attrs["to"]))
            if op == "Reshape" and len(inputs) > 1 and inputs[1] is not None:
                shape = [int(d) for d in inputs[1]]
                if not attrs.get("allowzero", 0):
                    shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
                return x.reshape(shape)
            if op == "Flatten":
                axis = attrs.get("axis", 1) % max(x.ndim, 1) if x.ndim else 0
                return x.reshape(int(np.prod(x.shape[:axis])), -1)
            if op in ("Unsqueeze", "Squeeze"):
                axes = attrs.get("axes")
                if axes is None and len(inputs) > 1 and inputs[1] is not None:
                    axes = [int(a) for a in inputs[1]]
                if op == "Squeeze":
                    return np.squeeze(x) if axes is None else np.squeeze(x, tuple(a % x.ndim for a in axes))
                rank = x.ndim + len(axes)
                return np.expand_dims(x, tuple(sorted(a % rank for a in axes)))
        except (ValueError, KeyError, TypeError, IndexError):
            return None
        return None


def stored_constants(graph) -> dict:
    """name -> TensorProto of the tensors ``graph`` stores: its initializers and its Constant nodes' outputs (the
    tensor of a Constant's ``value``; None for the other forms, value_float and the like)."""
    found: dict = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            found[node.output[0]] = next((a.t for a in node.attribute if a.name == "value" and a.HasField("t")),
                                         None)
    return found


def names_read_inside(node) -> set[str]:
    """Every name the subgraphs of ``node`` (If's branches, Loop's and Scan's bodies, at any depth) read, outer
    names among them."""
    return {name for sub in subgraphs(node) for name in names_read(sub) if name}


def subgraphs(node) -> list:
    """The graphs a node's attributes hold (If's branches, Loop's and Scan's bodies)."""
    found = []
    for attribute in node.attribute:
        found += [attribute.g] if attribute.type == 5 else list(attribute.graphs) if attribute.type == 10 else []
    return found


def prune_unused(graph) -> int:
    """Remove the nodes of ``graph`` whose outputs nothing reads (not a graph output, no node of this graph or
    of its subgraphs reads them), repeatedly, then its initializers nothing reads; returns how many nodes."""
    removed = 0
    while True:
        used = names_read(graph)
        dead = [node for node in graph.node if node.output and not any(o in used for o in node.output if o)]
        if not dead:
            inputs = {i.name for i in graph.input}
            for tensor in [t for t in graph.initializer if t.name not in used and t.name not in inputs]:
                graph.initializer.remove(tensor)
            return removed
        for node in dead:
            graph.node.remove(node)
        removed += len(dead)


def names_read(graph) -> set[str]:
    """Every name the nodes of ``graph`` and of their subgraphs read, and its outputs."""
    names = {o.name for o in graph.output}
    for node in graph.node:
        names.update(node.input)
        for sub in subgraphs(node):
            names.update(names_read(sub))
    return names
