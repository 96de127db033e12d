"""Run one QuantizeLinear or DequantizeLinear node on the peers: onnx.reference.ReferenceEvaluator and
onnxruntime (CPU, one thread).

A model is built once per case (opset, types, attributes, scale and zero point, x shape) and then run on
many x arrays: x is the only graph input, the scale and the zero point are initializers.

onnxruntime's Python API feeds and returns only the classic NumPy dtypes, so the ml_dtypes types travel
through a carrier: a graph input of a carrier type (float32 for bfloat16/float8/float6/float4, int8/uint8
for int4/int2/uint4/uint2) followed by a Cast node to the real type, and a Cast node back to the carrier
after the node under test. Every value of the real type is exactly representable in its carrier, so both
Casts are exact (NaN stays NaN; its sign may not survive, so callers compare small-float NaNs as NaN).
"""

from __future__ import annotations

import functools
import warnings

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ONNX_NAME_TO_DTYPE = {
    "float": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "double": np.dtype(np.float64),
    "int32": np.dtype(np.int32),
    "uint8": np.dtype(np.uint8),
    "int8": np.dtype(np.int8),
    "uint16": np.dtype(np.uint16),
    "int16": np.dtype(np.int16),
    "uint4": np.dtype(ml_dtypes.uint4),
    "int4": np.dtype(ml_dtypes.int4),
    "uint2": np.dtype(ml_dtypes.uint2),
    "int2": np.dtype(ml_dtypes.int2),
    "float8e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8e4m3fnuz": np.dtype(ml_dtypes.float8_e4m3fnuz),
    "float8e5m2": np.dtype(ml_dtypes.float8_e5m2),
    "float8e5m2fnuz": np.dtype(ml_dtypes.float8_e5m2fnuz),
    "float8e8m0": np.dtype(ml_dtypes.float8_e8m0fnu),
    "float4e2m1": np.dtype(ml_dtypes.float4_e2m1fn),
    "float6e2m3": np.dtype(ml_dtypes.float6_e2m3fn),
    "float6e3m2": np.dtype(ml_dtypes.float6_e3m2fn),
}

TENSORPROTO = {
    "float": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16,
    "double": TensorProto.DOUBLE, "int32": TensorProto.INT32, "uint8": TensorProto.UINT8,
    "int8": TensorProto.INT8, "uint16": TensorProto.UINT16, "int16": TensorProto.INT16,
    "uint4": TensorProto.UINT4, "int4": TensorProto.INT4, "uint2": TensorProto.UINT2,
    "int2": TensorProto.INT2, "float8e4m3fn": TensorProto.FLOAT8E4M3FN,
    "float8e4m3fnuz": TensorProto.FLOAT8E4M3FNUZ, "float8e5m2": TensorProto.FLOAT8E5M2,
    "float8e5m2fnuz": TensorProto.FLOAT8E5M2FNUZ, "float8e8m0": TensorProto.FLOAT8E8M0,
    "float4e2m1": TensorProto.FLOAT4E2M1, "float6e2m3": TensorProto.FLOAT6E2M3,
    "float6e3m2": TensorProto.FLOAT6E3M2,
}
DTYPE_TO_ONNX_NAME = {d: n for n, d in ONNX_NAME_TO_DTYPE.items()}

# What onnxruntime's Python API can feed and return directly.
_ORT_NATIVE = {"float", "float16", "double", "int32", "uint8", "int8", "uint16", "int16"}


def carrier(name: str) -> str:
    """The type an onnxruntime graph input/output of type ``name`` travels as (``name`` itself when native)."""
    if name in _ORT_NATIVE:
        return name
    if name in ("int4", "int2"):
        return "int8"
    if name in ("uint4", "uint2"):
        return "uint8"
    return "float"  # bfloat16, float8, float6, float4: all exact in float32


def onnx_name(dtype) -> str:
    return DTYPE_TO_ONNX_NAME[np.dtype(dtype)]


def make_model(op: str, opset: int, x_type: str, x_shape, scale: np.ndarray, zero_point: np.ndarray | None,
               y_type: str, attributes: dict, *, via_carriers: bool) -> onnx.ModelProto:
    """A model computing ``op`` on the graph input "x"; the scale and zero point are initializers.

    With ``via_carriers``, x and y travel as their carrier types (see the module docstring)."""
    nodes = []
    x_input, y_output = "x", "y"
    x_graph_type, y_graph_type = x_type, y_type
    if via_carriers and carrier(x_type) != x_type:
        x_graph_type = carrier(x_type)
        x_input = "x_carrier"
        # saturate=0: a float8 Inf must stay Inf (every other carried value is exact anyway).
        saturate = {"saturate": 0} if x_type.startswith("float8") else {}
        nodes.append(helper.make_node("Cast", [x_input], ["x"], to=TENSORPROTO[x_type], **saturate))
    inputs = ["x", "scale"] + (["zero_point"] if zero_point is not None else [])
    initializers = [numpy_helper.from_array(np.asarray(scale), "scale")]
    if zero_point is not None:
        initializers.append(numpy_helper.from_array(np.asarray(zero_point), "zero_point"))
    nodes.append(helper.make_node(op, inputs, ["y"], **{k: v for k, v in attributes.items() if v is not None}))
    if via_carriers and carrier(y_type) != y_type:
        y_graph_type = carrier(y_type)
        y_output = "y_carrier"
        nodes.append(helper.make_node("Cast", ["y"], [y_output], to=TENSORPROTO[y_graph_type]))
    graph = helper.make_graph(
        nodes, f"{op}_{opset}",
        [helper.make_tensor_value_info(x_input, TENSORPROTO[x_graph_type], list(x_shape))],
        [helper.make_tensor_value_info(y_output, TENSORPROTO[y_graph_type], None)],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 11 if opset >= 23 else 10
    return model


class ReferencePeer:
    """onnx.reference.ReferenceEvaluator on one node."""

    name = "reference"

    def __init__(self, op, opset, x_type, x_shape, scale, zero_point, y_type, attributes):
        from onnx.reference import ReferenceEvaluator

        self.y_dtype = ONNX_NAME_TO_DTYPE[y_type]
        model = make_model(op, opset, x_type, x_shape, scale, zero_point, y_type, attributes, via_carriers=False)
        self.evaluator = ReferenceEvaluator(model)

    def run(self, x: np.ndarray) -> np.ndarray:
        with warnings.catch_warnings():
            # Its int32 cast of huge quotients and NaN warns (and yields INT32_MIN): a documented deviation.
            warnings.simplefilter("ignore", RuntimeWarning)
            (y,) = self.evaluator.run(None, {"x": x})
        return np.asarray(y)


class OnnxRuntimeUnsupported(Exception):
    """onnxruntime has no CPU kernel for this combination (its session cannot be created)."""


def _session_options():
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 4
    # No graph rewrites: run exactly the node under test (and the carrier Casts).
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return options


class OnnxRuntimePeer:
    """onnxruntime's CPU kernel for one node, inputs and outputs through carriers where needed."""

    name = "onnxruntime"

    def __init__(self, op, opset, x_type, x_shape, scale, zero_point, y_type, attributes):
        import onnxruntime as ort

        self.x_carrier = ONNX_NAME_TO_DTYPE[carrier(x_type)]
        self.y_dtype = ONNX_NAME_TO_DTYPE[y_type]
        model = make_model(op, opset, x_type, x_shape, scale, zero_point, y_type, attributes, via_carriers=True)
        self.input_name = model.graph.input[0].name
        try:
            self.session = ort.InferenceSession(model.SerializeToString(), _session_options(),
                                                providers=["CPUExecutionProvider"])
        except Exception as error:  # onnxruntime raises its own exception types for a missing kernel
            raise OnnxRuntimeUnsupported(str(error)) from error

    def run(self, x: np.ndarray) -> np.ndarray:
        (y,) = self.session.run(None, {self.input_name: x.astype(self.x_carrier)})
        y = np.asarray(y)
        return y if y.dtype == self.y_dtype else y.astype(self.y_dtype)


@functools.cache
def onnxruntime_supports(op: str, opset: int, x_type: str, scale_type: str, y_type: str, granularity: str,
                         with_zero_point: bool) -> bool:
    """Whether onnxruntime can create a session for this combination (probed once with a tiny model)."""
    x_shape = (2, 4)
    scale_shape = {"tensor": (), "axis": (4,), "block": (2, 2)}[granularity]
    attributes = {}
    if granularity != "tensor":
        attributes["axis"] = 1
    if granularity == "block":
        attributes["block_size"] = 2
    scale = np.ones(scale_shape, ONNX_NAME_TO_DTYPE[scale_type])
    quantized = y_type if op == "QuantizeLinear" else x_type
    zero_point = np.zeros(scale_shape, ONNX_NAME_TO_DTYPE[quantized]) if with_zero_point else None
    if op == "QuantizeLinear" and not with_zero_point and quantized != "uint8":
        attributes["output_dtype"] = TENSORPROTO[quantized]
    if op == "DequantizeLinear" and y_type != scale_type:
        attributes["output_dtype"] = TENSORPROTO[y_type]
    try:
        peer = OnnxRuntimePeer(op, opset, x_type, x_shape, scale, zero_point, y_type, attributes)
        peer.run(np.zeros(x_shape, ONNX_NAME_TO_DTYPE[x_type]))
    except OnnxRuntimeUnsupported:
        return False
    return True


PEERS = {"reference": ReferencePeer, "onnxruntime": OnnxRuntimePeer}
