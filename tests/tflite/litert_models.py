"""One-operator LiteRT (TFLite) models, built and run in the tests: the oracle of ``qlinear.tflite``.

A model is written directly with the flatbuffer object API of ``ai_edge_litert.schema_py_generated`` (no
converter), so every scale and zero point is exactly the float32 / int the test chose. It is then run by
the LiteRT ``Interpreter`` under the op resolver that selects one kernel family.

Interface
---------
``Tensor(shape, dtype, scale=None, zero_point=None, quantized_dimension=0, data=None, name=None)``
    One tensor of the model. ``dtype`` is a NumPy dtype or its name ("float32", "int8", "uint8", "int16",
    "int32", "int64", ...). ``scale``/``zero_point``: None (not quantized), a scalar (per-tensor) or a 1-D
    sequence (per-channel along ``quantized_dimension``; a single zero point beside several scales is
    stored as one value, which TFLite broadcasts). Scales are stored as float32, zero points as int64, as
    the schema holds them. ``data``: an array of ``shape`` makes the tensor a constant (its own buffer,
    16-byte aligned), e.g. CONV_2D weights and bias; without it the tensor is a model input or output.

``build_model(op, inputs, outputs, *, options=None, version=1) -> bytes``
    A model with one subgraph holding one builtin operator. ``op`` is a ``BuiltinOperator`` name
    ("QUANTIZE", "CONV_2D", ...) or code. ``inputs``: the operator's inputs in order, each a ``Tensor``
    (a constant when it has ``data``, else a subgraph input) or None for an omitted optional input (index
    -1, e.g. a CONV_2D without bias). ``outputs``: the operator's output ``Tensor`` s (subgraph outputs).
    ``options``: the operator's options object, e.g. ``schema.Conv2DOptionsT()`` with its fields set; the
    union type is taken from the class name (``BuiltinOptions`` or ``BuiltinOptions2``). ``version``: the
    operator code's version (kernels are registered for ranges of versions; 1 is always registered).

``pack(model) -> bytes``: the flatbuffer of a ``schema.ModelT`` (e.g. one read with ``InitFromPackedBuf`` and
edited). Its buffers are packed 16-byte aligned when they are ``_AlignedBufferT`` s holding bytes.

``layer_model(op, x_shape, x_dtype, w, bias, x_scale, x_zero_point, w_scale, y_scale, y_zero_point, *,
w_zero_point=0, strides=(1, 1), padding="VALID", dilations=(1, 1), activation=None, depth_multiplier=None,
version=None) -> bytes``
    A quantized CONV_2D (w OHWI), DEPTHWISE_CONV_2D (w 1HWO) or FULLY_CONNECTED (w [out, in],
    keep_num_dims=True) ``build_model``: the oracle of ``qlinear.tflite.conv``, whose functions' arguments
    these are. The weights and the bias are constants, the activation the only graph input; ``bias`` may be
    None (the operator then has two inputs). A 1-D ``w_scale`` makes the weights per channel (dimension 0,
    or 3 for depthwise); the bias's scales are ``float32(x_scale) * w_scale``, and every zero point is stored
    once per scale. The output's shape and the options (padding, strides, dilations, fused activation: None,
    "relu", "relu6" or "relu_n1_to_1"; for int16 activations ``quantized_bias_type``, the bias's type) are
    computed here; ``version`` defaults to one that every resolver registers for the activation type.

``Runner(model, kernel, *, num_threads=None, preserve_all_tensors=False)``
    An interpreter for ``model`` (bytes from ``build_model``, or any model) under one kernel family;
    ``kernel`` is one of ``KERNELS``: "reference" (``OpResolverType.BUILTIN_REF``: the reference kernels, no
    delegate), "optimized" (``BUILTIN_WITHOUT_DEFAULT_DELEGATES``: the optimized kernels of the wheel, no
    XNNPACK), "xnnpack" (``AUTO``: the optimized kernels with the XNNPACK delegate applied, what a default
    ``Interpreter`` runs), or an ``OpResolverType``. ``num_threads`` and ``preserve_all_tensors`` go to the
    ``Interpreter`` (``experimental_preserve_all_tensors``: every intermediate tensor of a whole model stays
    readable, and no delegate is applied). ``runner(*arrays)`` sets the non-constant inputs in order (an
    input of another shape resizes the tensor and reallocates), invokes, and returns copies of the outputs
    (one array, or a list when the model has several); ``runner.set_inputs(*arrays)``, ``runner.invoke()``
    and ``runner.outputs()`` are its three steps (time ``invoke`` alone), ``runner.input_details`` /
    ``runner.output_details`` the interpreter's, and ``runner.tensor(index)`` any tensor's value.
    ``runner.op_names`` lists the nodes after delegation: ``["DELEGATE"]``-like names mean XNNPACK took the
    operator, the builtin name (e.g. "QUANTIZE") that it did not; ``runner.delegated`` says which.

``run(model, kernel, *arrays)``: ``Runner(model, kernel)(*arrays)`` for one call.

Reuse one ``Runner`` across many cases (one big input holding them all) rather than building a model per
case: creating an interpreter costs far more than invoking it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.interpreter import Interpreter, OpResolverType

KERNELS = {
    "reference": OpResolverType.BUILTIN_REF,
    "optimized": OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
    "xnnpack": OpResolverType.AUTO,
}

_TENSOR_TYPES = {
    np.dtype(np.float32): schema.TensorType.FLOAT32,
    np.dtype(np.float16): schema.TensorType.FLOAT16,
    np.dtype(np.float64): schema.TensorType.FLOAT64,
    np.dtype(np.int8): schema.TensorType.INT8,
    np.dtype(np.uint8): schema.TensorType.UINT8,
    np.dtype(np.int16): schema.TensorType.INT16,
    np.dtype(np.uint16): schema.TensorType.UINT16,
    np.dtype(np.int32): schema.TensorType.INT32,
    np.dtype(np.uint32): schema.TensorType.UINT32,
    np.dtype(np.int64): schema.TensorType.INT64,
    np.dtype(np.bool_): schema.TensorType.BOOL,
}

# BuiltinOperator codes >= 127 are stored beside the deprecated int8 field's placeholder.
_PLACEHOLDER_FOR_GREATER_OP_CODES = 127


@dataclass
class Tensor:
    shape: tuple[int, ...]
    dtype: Any
    scale: Any = None
    zero_point: Any = None
    quantized_dimension: int = 0
    data: np.ndarray | None = None
    name: str | None = None


class _AlignedBufferT(schema.BufferT):
    """A BufferT whose bytes are packed 16-byte aligned (the schema's ``force_align: 16``, which the Python
    object API ignores), so that int32/int64 constants such as a bias are aligned for the kernels."""

    def Pack(self, builder):
        raw = self.data
        builder.StartVector(1, len(raw), 16)
        builder.head = builder.head - len(raw)
        builder.Bytes[builder.head : builder.head + len(raw)] = raw
        builder.vectorNumElems = len(raw)
        data = builder.EndVector()
        schema.BufferStart(builder)
        schema.BufferAddData(builder, data)
        return schema.BufferEnd(builder)


def _quantization(t: Tensor):
    if t.scale is None:
        if t.zero_point is not None:
            raise ValueError(f"tensor {t.name}: a zero_point needs a scale")
        return None
    q = schema.QuantizationParametersT()
    q.scale = np.atleast_1d(np.asarray(t.scale, dtype=np.float32)).ravel()
    zp = 0 if t.zero_point is None else t.zero_point
    q.zeroPoint = np.atleast_1d(np.asarray(zp, dtype=np.int64)).ravel()
    q.quantizedDimension = int(t.quantized_dimension)
    return q


def _operator_code(op) -> schema.OperatorCodeT:
    code = getattr(schema.BuiltinOperator, op) if isinstance(op, str) else int(op)
    oc = schema.OperatorCodeT()
    oc.builtinCode = code
    oc.deprecatedBuiltinCode = min(code, _PLACEHOLDER_FOR_GREATER_OP_CODES)
    return oc


def build_model(op, inputs, outputs, *, options=None, version: int = 1) -> bytes:
    """A one-operator model (see the module docstring); returns the flatbuffer's bytes."""
    empty = schema.BufferT()  # buffer 0: the schema's empty sentinel, used by every non-constant tensor
    buffers = [empty]
    tensors: list[schema.TensorT] = []
    graph_inputs: list[int] = []
    op_inputs: list[int] = []

    def add(t: Tensor, default_name: str) -> int:
        tt = schema.TensorT()
        tt.shape = np.asarray(t.shape, dtype=np.int32)
        tt.type = _TENSOR_TYPES[np.dtype(t.dtype)]
        tt.name = t.name or default_name
        tt.quantization = _quantization(t)
        tt.buffer = 0
        if t.data is not None:
            data = np.ascontiguousarray(np.asarray(t.data, dtype=np.dtype(t.dtype)))
            if data.shape != tuple(t.shape):
                raise ValueError(f"tensor {tt.name}: data of shape {data.shape}, tensor shape {tuple(t.shape)}")
            buf = _AlignedBufferT()
            buf.data = data.tobytes()
            buffers.append(buf)
            tt.buffer = len(buffers) - 1
        tensors.append(tt)
        return len(tensors) - 1

    for i, t in enumerate(inputs):
        if t is None:
            op_inputs.append(-1)
            continue
        index = add(t, f"input{i}")
        op_inputs.append(index)
        if t.data is None:
            graph_inputs.append(index)
    op_outputs = [add(t, f"output{i}") for i, t in enumerate(outputs)]

    operator = schema.OperatorT()
    operator.opcodeIndex = 0
    operator.inputs = np.asarray(op_inputs, dtype=np.int32)
    operator.outputs = np.asarray(op_outputs, dtype=np.int32)
    if options is not None:
        kind = type(options).__name__.removesuffix("T")
        if hasattr(schema.BuiltinOptions, kind):
            operator.builtinOptionsType = getattr(schema.BuiltinOptions, kind)
            operator.builtinOptions = options
        else:
            operator.builtinOptions2Type = getattr(schema.BuiltinOptions2, kind)
            operator.builtinOptions2 = options

    subgraph = schema.SubGraphT()
    subgraph.tensors = tensors
    subgraph.inputs = np.asarray(graph_inputs, dtype=np.int32)
    subgraph.outputs = np.asarray(op_outputs, dtype=np.int32)
    subgraph.operators = [operator]
    subgraph.name = "main"

    code = _operator_code(op)
    code.version = int(version)
    model = schema.ModelT()
    model.version = 3
    model.operatorCodes = [code]
    model.subgraphs = [subgraph]
    model.buffers = buffers
    model.description = "qlinear tests: one-op model"
    return pack(model)


def pack(model: schema.ModelT) -> bytes:
    """The flatbuffer of ``model`` (a ``schema.ModelT``, built here or read with ``InitFromPackedBuf``)."""
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


_ACTIVATIONS = {None: schema.ActivationFunctionType.NONE, "relu": schema.ActivationFunctionType.RELU,
                "relu6": schema.ActivationFunctionType.RELU6,
                "relu_n1_to_1": schema.ActivationFunctionType.RELU_N1_TO_1}
# Versions registered by every resolver for these types (int16 activations need the 16x8 versions).
_LAYER_VERSIONS = {("CONV_2D", False): 3, ("CONV_2D", True): 4, ("DEPTHWISE_CONV_2D", False): 3,
                   ("DEPTHWISE_CONV_2D", True): 5, ("FULLY_CONNECTED", False): 4, ("FULLY_CONNECTED", True): 7}


def _output_size(size, kernel, stride, dilation, padding):
    extent = dilation * (kernel - 1) + 1
    return -(-size // stride) if padding == "SAME" else -(-(size - extent + 1) // stride)


def layer_model(op, x_shape, x_dtype, w, bias, x_scale, x_zero_point, w_scale, y_scale, y_zero_point, *,
                w_zero_point=0, strides=(1, 1), padding="VALID", dilations=(1, 1), activation=None,
                depth_multiplier=None, version=None) -> bytes:
    """A one-operator CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED model (see the module docstring)."""
    x_dtype, w = np.dtype(x_dtype), np.asarray(w)
    w_scale = np.asarray(w_scale, np.float32).reshape(-1)
    channel_axis = 3 if op == "DEPTHWISE_CONV_2D" else 0
    out_channels = w.shape[channel_axis]
    # per-tensor weights keep quantized_dimension 0, as converters write them (XNNPACK declines uint8
    # weights with another one)
    inputs = [Tensor(tuple(x_shape), x_dtype, x_scale, x_zero_point),
              Tensor(w.shape, w.dtype, w_scale, np.full(w_scale.shape, w_zero_point),
                     channel_axis if w_scale.size > 1 else 0, data=w)]
    if bias is not None:
        bias = np.asarray(bias)
        bias_scale = (np.float32(x_scale) * w_scale).astype(np.float32)
        inputs.append(Tensor(bias.shape, bias.dtype, bias_scale, np.zeros(bias_scale.shape, np.int64), data=bias))

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
        options.quantizedBiasType = _TENSOR_TYPES[bias.dtype]
    options.fusedActivationFunction = _ACTIVATIONS[activation]
    return build_model(op, inputs, [Tensor(y_shape, x_dtype, y_scale, y_zero_point)], options=options,
                       version=version or _LAYER_VERSIONS[op, bool(sixteen)])


class Runner:
    """One interpreter for one model under one kernel family (see the module docstring)."""

    def __init__(self, model: bytes, kernel, *, num_threads: int | None = None, preserve_all_tensors: bool = False):
        resolver = KERNELS[kernel] if isinstance(kernel, str) else kernel
        self.model = model
        self.interpreter = Interpreter(model_content=model, experimental_op_resolver_type=resolver,
                                       num_threads=num_threads,
                                       experimental_preserve_all_tensors=preserve_all_tensors)
        self.interpreter.allocate_tensors()
        self.input_details = self.interpreter.get_input_details()
        self.output_details = self.interpreter.get_output_details()
        self._shapes = [tuple(int(n) for n in d["shape"]) for d in self.input_details]

    @property
    def op_names(self) -> list[str]:
        return [d["op_name"] for d in self.interpreter._get_ops_details()]

    @property
    def delegated(self) -> bool:
        return any("DELEGATE" in name.upper() for name in self.op_names)

    def set_inputs(self, *arrays) -> None:
        it = self.interpreter
        if len(arrays) != len(self.input_details):
            raise ValueError(f"the model has {len(self.input_details)} non-constant inputs, got {len(arrays)} arrays")
        arrays = [np.ascontiguousarray(a, dtype=d["dtype"]) for d, a in zip(self.input_details, arrays)]
        resized = False
        for i, (detail, array) in enumerate(zip(self.input_details, arrays)):
            if self._shapes[i] != array.shape:
                it.resize_tensor_input(detail["index"], array.shape, strict=False)
                self._shapes[i] = array.shape
                resized = True
        if resized:
            it.allocate_tensors()
        for detail, array in zip(self.input_details, arrays):
            it.set_tensor(detail["index"], array)

    def invoke(self) -> None:
        self.interpreter.invoke()

    def outputs(self):
        results = [self.tensor(d["index"]) for d in self.output_details]
        return results[0] if len(results) == 1 else results

    def tensor(self, index: int) -> np.ndarray:
        """A copy of tensor ``index`` (with ``preserve_all_tensors``, any tensor of the model after ``invoke``)."""
        return self.interpreter.get_tensor(index).copy()

    def __call__(self, *arrays):
        self.set_inputs(*arrays)
        self.invoke()
        return self.outputs()


def run(model: bytes, kernel, *arrays):
    """``Runner(model, kernel)(*arrays)``."""
    return Runner(model, kernel)(*arrays)
