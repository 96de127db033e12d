"""onnx.reference operator classes that run qlinear's kernels.

Each class is named after its ONNX operator (``ReferenceEvaluator(new_ops=[...])`` looks classes up by
``(op_domain, class name)``, so the names must be the operator names) and maps the node's attributes,
and the model's opset where the operator has versions, to the public qlinear function:

    >>> from onnx.reference import ReferenceEvaluator          # doctest: +SKIP
    >>> ReferenceEvaluator(model, new_ops=qlinear.onnx.ops.OPS)  # doctest: +SKIP

The classes in this module requantize QLinearConv/QLinearMatMul with ``requantize="float64"`` (the onnx
reference evaluator's arithmetic); `op_classes` gives the same classes for ``"float32"``
(onnxruntime's arithmetic). See docs/onnx.md and docs/semantics.md.
"""

from __future__ import annotations

import functools

import numpy as np
from onnx.reference.op_run import OpRun

import qlinear
from qlinear.reference.requantize import REQUANTIZE_MODES

__all__ = [
    "QuantizeLinear",
    "DequantizeLinear",
    "QLinearConv",
    "QLinearMatMul",
    "ConvInteger",
    "MatMulInteger",
    "DynamicQuantizeLinear",
    "GatherBlockQuantized",
    "BatchNormalization",
    "OPS",
    "PEER_FIXES",
    "op_classes",
]

# TensorProto.UNDEFINED: a dtype attribute set to 0 means "not given" (the spec's default).
_UNSET_WHEN_ZERO = frozenset({"output_dtype", "precision"})


class _QlinearOp(OpRun):
    """Shared plumbing: the node's explicit attributes, the model's opset, errors naming the node."""

    op_domain = ""
    requantize = "float64"

    def _node_attributes(self, attributes: dict) -> dict:
        # OpRun fills in every attribute of the operator's *latest* schema with its default; pass only
        # those the node sets, so that each qlinear function applies the defaults of the model's version
        # (and rejects an attribute the model's version lacks). Linked attributes (inside a function)
        # arrive with their resolved values in `attributes`.
        explicit = self.__dict__.get("_explicit")
        if explicit is None:  # the node's own attribute names: reading the protobuf on every run cost ~2 us
            explicit = self.__dict__["_explicit"] = frozenset(a.name for a in self.onnx_node.attribute)
        given = {name: value for name, value in attributes.items() if name in explicit}
        for name in _UNSET_WHEN_ZERO & given.keys():
            if given[name] == 0:
                del given[name]
        return given

    def _opset(self) -> int:
        opsets = self.run_params["opsets"]
        version = opsets.get("", opsets.get("ai.onnx"))
        if version is None:
            raise ValueError(f"{self._where()}: the model imports no ai.onnx opset")
        return int(version)

    def _where(self) -> str:
        name = self.onnx_node.name
        return f"node {name!r} ({self.op_type})" if name else f"{self.op_type} node -> {list(self.onnx_node.output)}"

    def run(self, *args, **kwargs):
        # A node without linked attributes (any node outside a function) gets from OpRun.run the same
        # attributes on every run: they are read once, and _run is called directly (OpRun.run's checks and
        # logging cost ~10 us a node, as much as a small convolution's kernel).
        if not kwargs and not self.has_linked_attribute and not self.has_subgraph:
            fixed = self.__dict__.get("_fixed_attributes")
            if fixed is None:
                fixed = self.__dict__["_fixed_attributes"] = {name: getattr(self, name)
                                                              for name in self.attributes_names_}
            try:
                res = self._run(*args, **fixed)
            except (TypeError, AttributeError) as error:
                if getattr(error, "_qlinear_node_error", False):
                    raise
                # not qlinear's: OpRun.run below runs the node again and raises its own error, as it always did
            else:
                if type(res) is tuple and res and all(type(value) is np.ndarray for value in res):
                    return res
                return self._check_and_fix_outputs(res)
        # OpRun.run rewraps a TypeError from _run into a generic one ("Issues with types ..."); give the
        # caller qlinear's own error (already prefixed with the node) instead.
        try:
            return super().run(*args, **kwargs)
        except TypeError as error:
            cause = error.__cause__
            if getattr(cause, "_qlinear_node_error", False):
                raise cause  # keeps its own __cause__: the error as the qlinear function raised it
            raise

    def _call(self, function, *inputs, **keywords):
        try:
            return function(*inputs, **keywords)
        except (TypeError, ValueError) as error:
            try:
                wrapped = type(error)(f"{self._where()}: {error}")
            except Exception:  # an exception type that cannot be rebuilt from a message: keep it as is
                raise error from None
            wrapped._qlinear_node_error = True
            raise wrapped from error


def _optional(inputs: tuple, count: int) -> list:
    """The node's inputs padded with None to ``count`` (trailing optional inputs may be absent)."""
    return list(inputs) + [None] * (count - len(inputs))


class QuantizeLinear(_QlinearOp):
    def _run(self, *inputs, **attributes):
        x, y_scale, y_zero_point = _optional(inputs, 3)
        return (self._call(qlinear.quantize_linear, x, y_scale, y_zero_point, opset=self._opset(),
                           **self._node_attributes(attributes)),)


class DequantizeLinear(_QlinearOp):
    def _run(self, *inputs, **attributes):
        x, x_scale, x_zero_point = _optional(inputs, 3)
        return (self._call(qlinear.dequantize_linear, x, x_scale, x_zero_point, opset=self._opset(),
                           **self._node_attributes(attributes)),)


class _ConvWeights:
    """Packs a convolution's constant weights once (`qlinear.prepack_conv`), as runtimes do.

    Only an array that is read-only and owns its data is treated as constant: `QlinearEvaluator` makes the
    initializers it feeds to QLinearConv/ConvInteger such arrays, so the same object with the same content
    arrives on every run. Anything else (weights computed at run time, a user's writeable arrays) is
    passed through unpacked. qlinear_conv/conv_integer also reject packed weights whose zero point or group
    differ from the node's.
    """

    _packed: tuple | None = None  # (w, w_zero_point copy, group, PackedConv)

    def _weights(self, w, w_zero_point, attributes: dict):
        if not isinstance(w, np.ndarray) or w.flags.writeable or w.base is not None:
            return w
        group = attributes.get("group", 1)
        cached = self._packed
        if (cached is not None and cached[0] is w and cached[2] == group
                and _same_value(cached[1], w_zero_point)):
            return cached[3]
        try:
            packed = qlinear.prepack_conv(w, w_zero_point, group=group)
        except (TypeError, ValueError):  # qlinear_conv reports the problem with every argument in view
            return w
        self._packed = (w, None if w_zero_point is None else np.array(w_zero_point, copy=True), group, packed)
        return packed


def _same_value(a, b) -> bool:
    if a is None or b is None:
        return a is b
    b = np.asarray(b)
    # the same bytes: a zero point has no NaN, and comparing bytes costs a fifth of np.array_equal on a small array
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


class QLinearConv(_ConvWeights, _QlinearOp):
    def _run(self, *inputs, **attributes):
        given = self._node_attributes(attributes)
        args = _optional(inputs, 9)
        args[3] = self._weights(args[3], args[5], given)
        return (self._call(qlinear.qlinear_conv, *args, requantize=self.requantize, **given),)


class QLinearMatMul(_QlinearOp):
    def _run(self, *inputs, **attributes):
        return (self._call(qlinear.qlinear_matmul, *inputs, opset=self._opset(), requantize=self.requantize,
                           **self._node_attributes(attributes)),)


class ConvInteger(_ConvWeights, _QlinearOp):
    def _run(self, *inputs, **attributes):
        given = self._node_attributes(attributes)
        args = _optional(inputs, 4)
        args[1] = self._weights(args[1], args[3], given)
        return (self._call(qlinear.conv_integer, *args, **given),)


class MatMulInteger(_QlinearOp):
    def _run(self, *inputs, **attributes):
        return (self._call(qlinear.matmul_integer, *_optional(inputs, 4), **self._node_attributes(attributes)),)


class DynamicQuantizeLinear(_QlinearOp):
    def _run(self, *inputs, **attributes):
        y, y_scale, y_zero_point = self._call(qlinear.dynamic_quantize_linear, *inputs,
                                              **self._node_attributes(attributes))
        return (y, np.asarray(y_scale), np.asarray(y_zero_point))


class GatherBlockQuantized(_QlinearOp):
    """onnxruntime's contrib ``com.microsoft.GatherBlockQuantized`` on int4/uint4 tables (what ``qlinear quantize
    --target onnxruntime`` writes for 4-bit Gather tables): its CPU kernel computes ``float(q - zero_point) *
    scale`` for each gathered element, DequantizeLinear's blocked arithmetic, and writes zeros for an index out
    of range. So: DequantizeLinear of the table, then Gather, zeros where an index falls outside. The packed
    uint8 form (MatMulNBits' layout, ``bits`` 2/4/8) and the float8/float4 tables are not transcribed."""

    op_domain = "com.microsoft"

    def _run(self, data, indices, scales, zero_points=None, gather_axis=None, quantize_axis=None, block_size=None,
             bits=None):
        given = self._node_attributes({"gather_axis": gather_axis, "quantize_axis": quantize_axis,
                                       "block_size": block_size, "bits": bits})
        gather_axis, quantize_axis = given.get("gather_axis", 0), given.get("quantize_axis", 1)
        block_size, bits = given.get("block_size", 128), given.get("bits", 4)
        dtype = np.asarray(data).dtype
        if dtype.name not in ("int4", "uint4") or bits != 4:
            raise TypeError(f"{self._where()}: qlinear runs GatherBlockQuantized on int4 and uint4 tables (bits 4), "
                            f"got {dtype.name} with bits {bits}")
        if block_size < 16 or block_size & (block_size - 1):
            raise ValueError(f"{self._where()}: block_size must be a power of 2 and at least 16, got {block_size}")
        rank = np.ndim(data)
        if not -rank <= gather_axis < rank:
            raise ValueError(f"{self._where()}: gather_axis {gather_axis} is outside the table's rank {rank}")
        table = self._call(qlinear.dequantize_linear, data, scales, zero_points, axis=quantize_axis,
                           block_size=block_size, opset=21)
        gather_axis %= rank
        size = table.shape[gather_axis]
        indices = np.asarray(indices, np.int64)
        outside = (indices < -size) | (indices >= size)
        if size == 0:  # every index is outside: zeros of the gathered shape
            shape = table.shape[:gather_axis] + indices.shape + table.shape[gather_axis + 1:]
            return (np.zeros(shape, table.dtype),)
        rows = np.take(table, np.where(outside, 0, indices), axis=gather_axis)
        if outside.any():
            mask = outside.reshape((1,) * gather_axis + outside.shape + (1,) * (rank - gather_axis - 1))
            rows = np.where(mask, np.zeros((), table.dtype), rows)
        return (rows,)


class BatchNormalization(OpRun):
    """Peer fix, not a qlinear kernel: onnx 1.23's reference runs BatchNormalization-9 in training mode
    (the batch's own mean and variance) whenever the node has a ``momentum`` attribute, which exporters
    always write. Before version 14 the mode is the number of outputs: one output is inference, with the
    running mean and variance given (docs/semantics.md). Version 14 and later have ``training_mode`` and
    onnx's class is right, so this one runs only nodes of a model whose opset is below 14."""

    op_domain = ""

    def _run(self, x, scale, bias, mean, var, epsilon=None, momentum=None, training_mode=None, is_test=None,
             spatial=None):
        from onnx.reference.ops import op_batch_normalization as onnx_ops

        opsets = self.run_params["opsets"]
        opset = opsets.get("", opsets.get("ai.onnx", 1))
        if opset >= 14 or len(self.onnx_node.output) > 1:
            if opset >= 14:
                return onnx_ops.BatchNormalization_14._run(self, x, scale, bias, mean, var, epsilon=epsilon,
                                                           momentum=momentum, training_mode=training_mode)
            return onnx_ops.BatchNormalization_9._run(self, x, scale, bias, mean, var, epsilon=epsilon,
                                                      momentum=momentum)
        # onnx's own inference formula, so that the result is bit for bit the reference's where it is right
        return (onnx_ops._batchnorm_test_mode(x, scale, bias, mean, var, epsilon=1e-5 if epsilon is None else epsilon),)


OPS: tuple[type[OpRun], ...] = (
    QuantizeLinear, DequantizeLinear, QLinearConv, QLinearMatMul, ConvInteger, MatMulInteger,
    DynamicQuantizeLinear, GatherBlockQuantized,
)
# Ordinary operators whose onnx reference class contradicts the spec on real exports; `qlinear.onnx.run`
# uses these classes beside OPS.
PEER_FIXES: tuple[type[OpRun], ...] = (BatchNormalization,)


def op_classes(requantize: str = "float64") -> tuple[type[OpRun], ...]:
    """The operator classes, for ``ReferenceEvaluator(model, new_ops=op_classes(...))``.

    ``requantize`` is the QLinearConv/QLinearMatMul requantization arithmetic: ``"float64"`` (default; the
    onnx reference evaluator's), ``"float32"`` (onnxruntime's), ``"tflite"``, ``"tflite-single"`` or ``"xnnpack"``
    (TFLite's kernel families); the other operators do not depend on it.
    """
    if not isinstance(requantize, str) or requantize not in REQUANTIZE_MODES:
        raise ValueError(
            f"op_classes: requantize must be one of {', '.join(map(repr, REQUANTIZE_MODES))}, got {requantize!r}"
        )
    return _op_classes(requantize)


@functools.cache
def _op_classes(requantize: str) -> tuple[type[OpRun], ...]:
    if requantize == _QlinearOp.requantize:
        return OPS
    # Same class names (the evaluator's lookup key), a different class attribute.
    return tuple(type(cls.__name__, (cls,), {"requantize": requantize, "__module__": __name__}) for cls in OPS)
