"""A copy of a quantized ONNX model with its weights dequantized: every DequantizeLinear whose inputs are all
stored constants replaced by the float tensor it computes, computed by `qlinear.dequantize_linear` (exact:
the spec's arithmetic). onnxruntime 1.32 has no DequantizeLinear for the microscaling types (float4 codes,
e8m0 scales) and fails to load such a model; this copy computes the same outputs and runs. The bias
correction of weights-only quantization runs it so.

The float tensors are as large as the float model's: given a data file, they go there one at a time and the
copy refers to them, so that it holds no more than the quantized model and runs in segments that read their own
weights (a 1.2 GB model of Gemm layers, NVFP4 with its biases corrected: 8.9 GB peak with the tensors in the copy,
BENCHMARKS.md).
"""

from __future__ import annotations

import numpy as np

from ...ops.quantize_linear import dequantize_linear
from .onnx_constants import attributes, prune_unused, stored_constants, subgraphs
from .onnx_model import ExternalData


EXTERNAL_MIN = 1024  # bytes: smaller tensors stay in the copy (onnx's own threshold for external data)


def folded(model, folder=None, data=None):
    """A copy of ``model`` (a ModelProto) with each DequantizeLinear of stored constants (in any graph; a branch
    may read its outer graph's) replaced by an initializer of its output, under the same name; the constants
    nothing reads any longer removed. ``folder``: where the model's external data files are. ``data``: a file
    (Path) for the float tensors of `EXTERNAL_MIN` bytes or more, written anew, which the copy refers to by its
    name: it must lie in ``folder`` when the model has external data files (one folder holds what a model
    refers to)."""
    sink = open(data, "wb") if data is not None else None
    try:
        return _folded(model, folder, sink, data)
    finally:
        if sink is not None:
            sink.close()


def _folded(model, folder, sink, data):
    from onnx import helper, numpy_helper

    location = data.name if data is not None else ""
    external = ExternalData(sink, location) if sink is not None else None

    def read(tensor):  # a stored constant, or a folded tensor this wrote (NVFP4's block scales, folded first)
        ours = sink is not None and any(e.key == "location" and e.value == location for e in tensor.external_data)
        if ours:
            sink.flush()
        return numpy_helper.to_array(tensor, base_dir=str(data.parent if ours else folder or ""))

    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    copy = type(model)()
    copy.CopyFrom(model)

    def fold(graph, outer: dict) -> None:
        known = {**outer, **{name: t for name, t in stored_constants(graph).items() if t is not None}}
        kept = []
        for node in graph.node:
            inputs = [name for name in node.input if name]
            if node.op_type == "DequantizeLinear" and all(name in known for name in inputs):
                arrays = [read(known[name]) for name in inputs]
                given = attributes(node)
                if given.get("output_dtype"):
                    given["output_dtype"] = helper.tensor_dtype_to_np_dtype(given["output_dtype"])
                else:
                    given.pop("output_dtype", None)
                value = np.asarray(dequantize_linear(*arrays, opset=opset, **given))
                tensor = numpy_helper.from_array(value, node.output[0])
                del value, arrays
                if external is not None and len(tensor.raw_data) >= EXTERNAL_MIN:
                    start = external.begin()
                    external.write(np.frombuffer(tensor.raw_data, np.uint8))
                    external.point(tensor, start)
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
