"""Run one ONNX node on the peers: onnx.reference.ReferenceEvaluator and onnxruntime (1 thread).

The first input is a graph input; every other input is an initializer, as in a deployed model (onnxruntime
prepacks constant weights, which selects its production kernels).
"""

from __future__ import annotations

import functools
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

_ELEM_TYPE = {
    np.dtype(np.uint8): TensorProto.UINT8,
    np.dtype(np.int8): TensorProto.INT8,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(ml_dtypes.bfloat16): TensorProto.BFLOAT16,
}


@functools.cache
def cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def cpu_has_vnni() -> bool:
    """onnxruntime's u8s8 kernels use VPDPBUSD (exact) with VNNI and VPMADDUBSW (saturating) without it."""
    return bool({"avx512_vnni", "avx_vnni"} & cpu_flags())


def onnxruntime_exact_for_weights(w: np.ndarray, activations_dtype=np.uint8) -> bool:
    """Whether onnxruntime's integer GEMM is known exact for these weights (measured, docs/semantics.md):
    always with VNNI; without it only for uint8 weights or int8 weights in [-64, 63] (int8 activations are
    not known to be safe there either, so they get the same rule). ConvInteger with int8 activations over
    uint8 weights: see onnxruntime_conv_integer_exact_for_activations."""
    del activations_dtype
    if w.dtype == np.uint8 or cpu_has_vnni():
        return True
    return bool(w.min(initial=0) >= -64 and w.max(initial=0) <= 63)


def onnxruntime_conv_integer_exact_for_activations(x: np.ndarray, x_zero_point, w: np.ndarray) -> bool:
    """ConvInteger's GEMM in onnxruntime takes the weights as its first operand and the im2col'd activations
    (padding reads x_zero_point) as its second: with uint8 weights and int8 activations those are the u8 and
    s8 operands that saturate without VNNI, so the activations must follow the int8 weights' rule (measured on
    an AVX2 CPU without VNNI; uint8 activations, or int8 with int8 weights, were exact: docs/semantics.md)."""
    if w.dtype != np.uint8 or x.dtype != np.int8:
        return True
    return onnxruntime_exact_for_weights(np.append(x, np.asarray(x_zero_point, x.dtype)), w.dtype)


def make_model(op_type: str, inputs: list[tuple[str, np.ndarray | None]], output_dtypes: list, opset: int,
               **attributes) -> onnx.ModelProto:
    """One-node model; inputs given as None are omitted (empty name), trailing ones dropped."""
    while inputs and inputs[-1][1] is None:
        inputs = inputs[:-1]
    first_name, first_value = inputs[0]
    graph_inputs = [helper.make_tensor_value_info(first_name, _ELEM_TYPE[first_value.dtype], first_value.shape)]
    initializers = []
    for name, value in inputs[1:]:
        if value is not None:
            initializers.append(numpy_helper.from_array(np.asarray(value), name))
    node_inputs = [name if value is not None else "" for name, value in inputs]
    outputs = [f"out{i}" for i in range(len(output_dtypes))]
    node = helper.make_node(op_type, node_inputs, outputs, **{k: v for k, v in attributes.items() if v is not None})
    graph = helper.make_graph(
        [node], "g", graph_inputs,
        [helper.make_tensor_value_info(o, _ELEM_TYPE[np.dtype(d)], None) for o, d in zip(outputs, output_dtypes)],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def run_reference(model: onnx.ModelProto, first_input: np.ndarray) -> list[np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    name = model.graph.input[0].name
    return [np.asarray(o) for o in ReferenceEvaluator(model).run(None, {name: first_input})]


def run_onnxruntime(model: onnx.ModelProto, first_input: np.ndarray) -> list[np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {model.graph.input[0].name: first_input})
