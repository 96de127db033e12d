"""A copy of a quantized ONNX model with its weights dequantized: every DequantizeLinear whose inputs are all
stored constants replaced by the float tensor it computes, computed by `qlinear.dequantize_linear` (exact:
the spec's arithmetic). onnxruntime 1.32 has no DequantizeLinear for the microscaling types (float4 codes,
e8m0 scales) and fails to load such a model; this copy computes the same outputs and runs. The bias
correction of weights-only quantization runs it so.
"""

from __future__ import annotations

import numpy as np

from ...ops.quantize_linear import dequantize_linear
from .onnx_constants import attributes, stored_constants, subgraphs


def folded(model, folder=None):
    """A copy of ``model`` (a ModelProto) with each DequantizeLinear of stored constants (in any graph; a branch
    may read its outer graph's) replaced by an initializer of its output, under the same name; the constants
    nothing reads any longer removed. ``folder``: where the model's external data files are."""
    from onnx import helper, numpy_helper

    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    copy = type(model)()
    copy.CopyFrom(model)

    def fold(graph, outer: dict) -> None:
        known = {**outer, **{name: t for name, t in stored_constants(graph).items() if t is not None}}
        kept = []
        for node in graph.node:
            inputs = [name for name in node.input if name]
            if node.op_type == "DequantizeLinear" and all(name in known for name in inputs):
                arrays = [numpy_helper.to_array(known[name], base_dir=str(folder or "")) for name in inputs]
                given = attributes(node)
                if given.get("output_dtype"):
                    given["output_dtype"] = helper.tensor_dtype_to_np_dtype(given["output_dtype"])
                else:
                    given.pop("output_dtype", None)
                value = np.asarray(dequantize_linear(*arrays, opset=opset, **given))
                tensor = numpy_helper.from_array(value, node.output[0])
                known[node.output[0]] = tensor
                graph.initializer.append(tensor)
                continue
            for sub in subgraphs(node):
                fold(sub, known)
            kept.append(node)
        del graph.node[:]
        graph.node.extend(kept)

    fold(copy.graph, {})
    _drop_unread(copy.graph)
    return copy


def _drop_unread(graph) -> None:
    """The initializers and Constant nodes of ``graph`` (and its subgraphs) that nothing reads any longer."""
    from .onnx_constants import names_read

    read = names_read(graph) | {i.name for i in graph.input}  # (old models list initializers as inputs too)
    for tensor in [t for t in graph.initializer if t.name not in read]:
        graph.initializer.remove(tensor)
    for node in [n for n in graph.node if n.op_type == "Constant" and n.output and n.output[0] not in read]:
        graph.node.remove(node)
    for node in graph.node:
        for sub in subgraphs(node):
            _drop_unread(sub)
