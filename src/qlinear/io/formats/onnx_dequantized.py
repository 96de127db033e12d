"""A copy of a quantized ONNX model with its weights dequantized: every DequantizeLinear whose inputs are all
stored constants replaced by the float tensor it computes, computed by `qlinear.dequantize_linear` (exact:
the spec's arithmetic). onnxruntime 1.32 has no DequantizeLinear for the microscaling types (float4 codes,
e8m0 scales) and fails to load such a model; this copy computes the same outputs and runs. The bias
correction of weights-only quantization runs it so.
"""

from __future__ import annotations

import numpy as np

from ...ops.quantize_linear import dequantize_linear
from .onnx_constants import attributes, prune_unused, stored_constants, subgraphs


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
    _pruned(copy.graph)
    return copy


def _pruned(graph) -> None:
    """`prune_unused` in ``graph`` and in its subgraphs: the codes and scales no node reads any longer."""
    prune_unused(graph)
    for node in graph.node:
        for sub in subgraphs(node):
            _pruned(sub)
