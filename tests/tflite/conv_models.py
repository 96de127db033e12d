"""One-operator CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED LiteRT models: the oracle of qlinear.tflite.conv.

A model is written with the flatbuffer object API of ``ai_edge_litert.schema_py_generated`` (no converter),
so every scale and zero point is exactly the float32 / int the test chose; the weights and the bias are
constant buffers, the activation is the only graph input. It is run by the LiteRT ``Interpreter`` under the
op resolver of one kernel family.

``layer_model(op, x_shape, x_dtype, w, bias, x_scale, x_zero_point, w_scale, y_scale, y_zero_point, *,
w_zero_point=0, strides=(1, 1), padding="VALID", dilations=(1, 1), activation=None, depth_multiplier=None,
version=None) -> bytes``
    ``op``: "CONV_2D" (w OHWI), "DEPTHWISE_CONV_2D" (w 1HWO) or "FULLY_CONNECTED" (w [out, in],
    keep_num_dims=True). The arguments mean what they mean for qlinear.tflite.conv's functions; ``bias``
    may be None (the operator then has two inputs). A 1-D ``w_scale`` makes the weights per channel (dimension 0,
    or 3 for depthwise). For int16 activations the options' ``quantized_bias_type`` is the bias's type.

``Runner(model, kernel)``: an interpreter under ``kernel`` ("reference" -> BUILTIN_REF, "optimized" ->
BUILTIN_WITHOUT_DEFAULT_DELEGATES, "xnnpack" -> AUTO); ``runner(x)`` resizes the input when its shape
changed, invokes and returns a copy of the output; ``runner.delegated`` says whether XNNPACK took the node.
Reuse one Runner for many cases (a big batch): creating an interpreter costs far more than invoking it.
"""

from __future__ import annotations

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.interpreter import Interpreter, OpResolverType

KERNELS = {
    "reference": OpResolverType.BUILTIN_REF,
    "optimized": OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
    "xnnpack": OpResolverType.AUTO,
}

_TYPES = {np.dtype(t): getattr(schema.TensorType, np.dtype(t).name.upper())
          for t in (np.int8, np.uint8, np.int16, np.int32, np.int64)}
_ACTIVATIONS = {None: schema.ActivationFunctionType.NONE, "relu": schema.ActivationFunctionType.RELU,
                "relu6": schema.ActivationFunctionType.RELU6,
                "relu_n1_to_1": schema.ActivationFunctionType.RELU_N1_TO_1}
# Versions registered by every resolver for these types (int16 activations need the 16x8 versions).
_VERSIONS = {("CONV_2D", False): 3, ("CONV_2D", True): 4, ("DEPTHWISE_CONV_2D", False): 3,
             ("DEPTHWISE_CONV_2D", True): 5, ("FULLY_CONNECTED", False): 4, ("FULLY_CONNECTED", True): 7}


class _AlignedBufferT(schema.BufferT):
    """A buffer packed 16-byte aligned (the schema's ``force_align: 16``, which the object API ignores)."""

    def Pack(self, builder):
        raw = self.data
        builder.StartVector(1, len(raw), 16)
        builder.head -= len(raw)
        builder.Bytes[builder.head:builder.head + len(raw)] = raw
        builder.vectorNumElems = len(raw)
        data = builder.EndVector()
        schema.BufferStart(builder)
        schema.BufferAddData(builder, data)
        return schema.BufferEnd(builder)


def _output_size(size, kernel, stride, dilation, padding):
    extent = dilation * (kernel - 1) + 1
    return -(-size // stride) if padding == "SAME" else -(-(size - extent + 1) // stride)


def layer_model(op, x_shape, x_dtype, w, bias, x_scale, x_zero_point, w_scale, y_scale, y_zero_point, *,
                w_zero_point=0, strides=(1, 1), padding="VALID", dilations=(1, 1), activation=None,
                depth_multiplier=None, version=None) -> bytes:
    x_dtype, w = np.dtype(x_dtype), np.asarray(w)
    w_scale = np.asarray(w_scale, np.float32).reshape(-1)
    channel_axis = 3 if op == "DEPTHWISE_CONV_2D" else 0
    out_channels = w.shape[channel_axis]
    tensors, buffers = [], [schema.BufferT()]

    def add(shape, dtype, scale=None, zero_point=0, axis=0, data=None):
        t = schema.TensorT()
        t.shape, t.type, t.name = np.asarray(shape, np.int32), _TYPES[np.dtype(dtype)], f"t{len(tensors)}"
        if scale is not None:
            t.quantization = schema.QuantizationParametersT()
            t.quantization.scale = np.asarray(scale, np.float32).reshape(-1)
            t.quantization.zeroPoint = np.broadcast_to(np.asarray(zero_point, np.int64),
                                                       t.quantization.scale.shape).copy()
            t.quantization.quantizedDimension = axis
        if data is not None:
            buffer = _AlignedBufferT()
            buffer.data = np.ascontiguousarray(data, np.dtype(dtype)).tobytes()
            buffers.append(buffer)
            t.buffer = len(buffers) - 1
        tensors.append(t)
        return len(tensors) - 1

    x_index = add(x_shape, x_dtype, x_scale, x_zero_point)
    # per-tensor weights keep quantized_dimension 0, as converters write them (XNNPACK declines uint8
    # weights with another one)
    w_index = add(w.shape, w.dtype, w_scale, w_zero_point, channel_axis if w_scale.size > 1 else 0, w)
    inputs = [x_index, w_index]
    if bias is not None:
        bias = np.asarray(bias)
        bias_scale = (np.float32(x_scale) * w_scale).astype(np.float32)
        inputs.append(add(bias.shape, bias.dtype, bias_scale, 0, 0, bias))

    sixteen = x_dtype == np.int16
    if op == "FULLY_CONNECTED":
        options = schema.FullyConnectedOptionsT()
        options.keepNumDims = True
        y_shape = tuple(x_shape[:-1]) + (out_channels,)
    else:
        options = schema.Conv2DOptionsT() if op == "CONV_2D" else schema.DepthwiseConv2DOptionsT()
        options.padding = getattr(schema.Padding, padding)
        options.strideH, options.strideW = strides
        options.dilationHFactor, options.dilationWFactor = dilations
        if op == "DEPTHWISE_CONV_2D":
            options.depthMultiplier = depth_multiplier or out_channels // x_shape[3]
        y_shape = (x_shape[0],) + tuple(_output_size(x_shape[1 + i], w.shape[1 + i], strides[i], dilations[i], padding)
                                        for i in range(2)) + (out_channels,)
    if sixteen and bias is not None and op != "DEPTHWISE_CONV_2D":
        options.quantizedBiasType = _TYPES[bias.dtype]
    options.fusedActivationFunction = _ACTIVATIONS[activation]
    y_index = add(y_shape, x_dtype, y_scale, y_zero_point)

    operator = schema.OperatorT()
    operator.inputs = np.asarray(inputs, np.int32)
    operator.outputs = np.asarray([y_index], np.int32)
    operator.builtinOptionsType = getattr(schema.BuiltinOptions, type(options).__name__[:-1])
    operator.builtinOptions = options
    subgraph = schema.SubGraphT()
    subgraph.tensors, subgraph.operators = tensors, [operator]
    subgraph.inputs, subgraph.outputs = np.asarray([x_index], np.int32), np.asarray([y_index], np.int32)
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = getattr(schema.BuiltinOperator, op)
    code.version = version or _VERSIONS[op, bool(sixteen)]
    model = schema.ModelT()
    model.version, model.operatorCodes, model.subgraphs, model.buffers = 3, [code], [subgraph], buffers
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


class Runner:
    """One interpreter for one model under one kernel family."""

    def __init__(self, model: bytes, kernel: str):
        self.interpreter = Interpreter(model_content=model, experimental_op_resolver_type=KERNELS[kernel])
        self.interpreter.allocate_tensors()
        self._input = self.interpreter.get_input_details()[0]
        self._output = self.interpreter.get_output_details()[0]

    @property
    def delegated(self) -> bool:
        return any("DELEGATE" in d["op_name"].upper() for d in self.interpreter._get_ops_details())

    def __call__(self, x: np.ndarray) -> np.ndarray:
        it, index = self.interpreter, self._input["index"]
        if tuple(it.get_tensor(index).shape) != x.shape:
            it.resize_tensor_input(index, x.shape, strict=False)
            it.allocate_tensors()
        it.set_tensor(index, np.ascontiguousarray(x))
        it.invoke()
        return it.get_tensor(self._output["index"]).copy()
