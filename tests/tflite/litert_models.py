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

``Runner(model, kernel)``
    An interpreter for ``model`` (bytes from ``build_model``) under one kernel family; ``kernel`` is one of
    ``KERNELS``: "reference" (``OpResolverType.BUILTIN_REF``: the reference kernels, no delegate),
    "optimized" (``BUILTIN_WITHOUT_DEFAULT_DELEGATES``: the optimized kernels of the wheel, no XNNPACK),
    "xnnpack" (``AUTO``: the optimized kernels with the XNNPACK delegate applied, what a default
    ``Interpreter`` runs), or an ``OpResolverType``. ``runner(*arrays)`` sets the non-constant inputs in
    order (an input of another shape resizes the tensor and reallocates), invokes, and returns copies of
    the outputs (one array, or a list when the operator has several). ``runner.op_names`` lists the nodes
    after delegation: ``["DELEGATE"]``-like names mean XNNPACK took the operator, the builtin name (e.g.
    "QUANTIZE") that it did not; ``runner.delegated`` says which.

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

    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


class Runner:
    """One interpreter for one model under one kernel family (see the module docstring)."""

    def __init__(self, model: bytes, kernel):
        resolver = KERNELS[kernel] if isinstance(kernel, str) else kernel
        self.model = model
        self.interpreter = Interpreter(model_content=model, experimental_op_resolver_type=resolver)
        self.interpreter.allocate_tensors()
        self._inputs = self.interpreter.get_input_details()
        self._outputs = self.interpreter.get_output_details()
        self._shapes = [tuple(int(n) for n in d["shape"]) for d in self._inputs]

    @property
    def op_names(self) -> list[str]:
        return [d["op_name"] for d in self.interpreter._get_ops_details()]

    @property
    def delegated(self) -> bool:
        return any("DELEGATE" in name.upper() for name in self.op_names)

    def __call__(self, *arrays):
        it = self.interpreter
        if len(arrays) != len(self._inputs):
            raise ValueError(f"the model has {len(self._inputs)} non-constant inputs, got {len(arrays)} arrays")
        arrays = [np.ascontiguousarray(a, dtype=d["dtype"]) for d, a in zip(self._inputs, arrays)]
        resized = False
        for i, (detail, array) in enumerate(zip(self._inputs, arrays)):
            if self._shapes[i] != array.shape:
                it.resize_tensor_input(detail["index"], array.shape, strict=False)
                self._shapes[i] = array.shape
                resized = True
        if resized:
            it.allocate_tensors()
        for detail, array in zip(self._inputs, arrays):
            it.set_tensor(detail["index"], array)
        it.invoke()
        results = [it.get_tensor(d["index"]).copy() for d in self._outputs]
        return results[0] if len(results) == 1 else results


def run(model: bytes, kernel, *arrays):
    """``Runner(model, kernel)(*arrays)``."""
    return Runner(model, kernel)(*arrays)
