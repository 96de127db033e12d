"""Run ONNX models with qlinear's kernels for the quantization operators.

`run` executes a model with ``onnx.reference.ReferenceEvaluator`` for the ordinary operators and qlinear
for QuantizeLinear, DequantizeLinear, QLinearConv, QLinearMatMul, ConvInteger, MatMulInteger and
DynamicQuantizeLinear (and, for a QDQ model's float Conv and MaxPool, vectorised classes with the reference's
results bit for bit: `float_ops`); `evaluator` returns that evaluator for repeated runs; `qlinear.onnx.ops` holds the
operator classes for users who build their own ReferenceEvaluator. Needs onnx (``pip install
'qlinear[onnx]'``); ``import qlinear`` alone never imports it.
"""

from __future__ import annotations

try:
    import onnx
    from onnx.reference import ReferenceEvaluator
except ImportError as _error:  # pragma: no cover - exercised in a subprocess without onnx
    raise ImportError(
        "qlinear.onnx needs the onnx package, which is not installed: pip install 'qlinear[onnx]'"
    ) from _error

import functools
import os
from collections.abc import Mapping

import numpy as np

from qlinear.onnx import ops
from qlinear.onnx.float_ops import FLOAT_OPS
from qlinear.onnx.ops import op_classes

__all__ = ["run", "evaluator", "ops", "op_classes", "QlinearEvaluator"]


def _load(model, function: str) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (str, os.PathLike)):
        return onnx.load(os.fspath(model))
    if isinstance(model, (bytes, bytearray)):
        return onnx.load_from_string(bytes(model))
    raise TypeError(f"{function}: model must be an onnx.ModelProto, a path or serialized bytes, got {type(model).__name__}")


class QlinearEvaluator(ReferenceEvaluator):
    """ReferenceEvaluator with qlinear's operator classes (`default_new_ops`) after any ``new_ops`` given.

    onnx builds the evaluators of a model's local functions (FunctionProto) as ``self.__class__(function)``,
    without ``new_ops``; a class-level default reaches them, so a QuantizeLinear inside a function runs
    qlinear too (onnx's own has no DequantizeLinear before opset 19).
    """

    default_new_ops: tuple = ops.OPS + ops.PEER_FIXES + FLOAT_OPS

    def __init__(self, proto, *args, new_ops=None, **kwargs):
        # The evaluator keeps the first class given per operator: a caller's own classes win over qlinear's.
        super().__init__(proto, *args, new_ops=[*(new_ops or ()), *self.default_new_ops], **kwargs)

    # Nodes computed once when the evaluator is built, where every input is a constant: a QDQ model's weights are
    # DequantizeLinear nodes of initializers, which a run would otherwise dequantize again every time. Their float
    # results are held beside the codes, so at most FOLD_BYTES of them (a large model's weights stay per run).
    FOLDED_OPS = frozenset({"Constant", "DequantizeLinear"})
    FOLD_BYTES = 256 << 20

    def _init(self) -> None:
        super()._init()
        _fold_constants_of(self)
        # Convolution weights that are initializers become read-only arrays owning their data, which the op
        # classes may pack once and reuse (ops._ConvWeights): nothing can change them between runs.
        weights = {node.input[i] for node in self.nodes_ for op_type, i in (("QLinearConv", 3), ("ConvInteger", 1))
                   if node.op_type == op_type and node.domain in ("", "ai.onnx") and len(node.input) > i}
        for name in weights & self.rt_inits_.keys():
            value = self.rt_inits_[name]
            if isinstance(value, np.ndarray):
                frozen = np.array(value, copy=True)
                frozen.flags.writeable = False
                self.rt_inits_[name] = frozen


def _fold_constants_of(session: QlinearEvaluator) -> None:
    """Run `QlinearEvaluator.FOLDED_OPS` nodes whose inputs are all constants once, in graph order, and keep
    their outputs as read-only initializers (the same arrays a run would compute: the same classes, once)."""
    known = dict(session.rt_inits_)
    kept, budget = [], session.FOLD_BYTES
    for node in session.rt_nodes_:
        foldable = (node.op_type in session.FOLDED_OPS and node.onnx_node.domain in ("", "ai.onnx")
                    and not node.has_linked_attribute and all(name in known for name in node.input if name))
        if foldable:
            try:
                outputs = node.run(*[known.get(name) if name else None for name in node.input])
            except Exception:  # noqa: BLE001 - the node raises again, where it always did: in a run
                outputs = None
            size = sum(getattr(value, "nbytes", 0) for value in outputs or ())
            if outputs is not None and size <= budget:
                budget -= size
                for name, value in zip(node.output, outputs):
                    if isinstance(value, np.ndarray):
                        value.flags.writeable = False
                    known[name] = session.rt_inits_[name] = value
                continue
        kept.append(node)
    session.rt_nodes_ = kept


@functools.cache
def _evaluator_class(requantize: str) -> type[QlinearEvaluator]:
    return type("QlinearEvaluator", (QlinearEvaluator,),
                {"default_new_ops": op_classes(requantize) + ops.PEER_FIXES + FLOAT_OPS, "__module__": __name__})


def evaluator(model, *, requantize: str = "float64", verbose: int = 0) -> ReferenceEvaluator:
    """A ReferenceEvaluator for ``model`` (ModelProto, path or bytes) with qlinear's operator classes.

    ``requantize`` selects QLinearConv/QLinearMatMul's requantization arithmetic: ``"float64"`` (default)
    is the onnx reference evaluator's, ``"float32"`` onnxruntime's, ``"tflite"`` / ``"tflite-single"`` /
    ``"xnnpack"`` those of TFLite's kernel families (docs/semantics.md, docs/tflite_conv.md).
    """
    op_classes(requantize)  # validates the mode before it is used as a cache key
    return _evaluator_class(requantize)(_load(model, "evaluator"), verbose=verbose)


def _declared_dtype(type_proto) -> np.dtype | None:
    if not type_proto.HasField("tensor_type") or not type_proto.tensor_type.elem_type:
        return None
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(type_proto.tensor_type.elem_type))
    except (KeyError, TypeError, ValueError):
        return None


def _declared_dims(type_proto) -> tuple[int | None, ...] | None:
    """The declared shape, None per symbolic dimension; None when the shape is not declared. Some
    exporters (Paddle) write a dynamic dimension as dim_value -1: that is not a size either."""
    if not type_proto.HasField("tensor_type") or not type_proto.tensor_type.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else None
                 for d in type_proto.tensor_type.shape.dim)


def _input_spec(session: ReferenceEvaluator) -> tuple[dict, list[str]]:
    """{input name: (dtype or None, dims or None)} and the names the caller must feed; computed once per
    evaluator (reading the protobuf graph costs more than the checks)."""
    spec = session.__dict__.get("_qlinear_input_spec")
    if spec is None:
        graph = session.proto_.graph
        initialized = {init.name for init in graph.initializer} | {s.values.name for s in graph.sparse_initializer}
        declared = {value.name: (_declared_dtype(value.type), _declared_dims(value.type)) for value in graph.input}
        spec = declared, [name for name in declared if name not in initialized]
        session.__dict__["_qlinear_input_spec"] = spec
    return spec


def _check_input(function: str, name: str, value: np.ndarray, expected: np.dtype | None, dims) -> None:
    if expected is not None and value.dtype != expected:
        raise TypeError(f"{function}: input {name!r} must have the model's type {expected}, got {value.dtype}")
    if dims is None:
        return
    if len(dims) != value.ndim:
        raise ValueError(f"{function}: input {name!r} must have rank {len(dims)} (the model's), got shape {value.shape}")
    for axis, (dim, size) in enumerate(zip(dims, value.shape)):
        if dim is not None and dim != size:
            raise ValueError(
                f"{function}: input {name!r} must have size {dim} along axis {axis} (the model's), got shape {value.shape}"
            )


def run(model, inputs: Mapping[str, np.ndarray], *, requantize: str | None = None,
        outputs: list[str] | None = None) -> dict[str, np.ndarray]:
    """Run an ONNX model; return ``{output name: array}`` in the model's output order.

    ``model`` is an onnx.ModelProto, a path or serialized bytes (or an evaluator from `evaluator`, reused
    across calls); ``inputs`` maps every graph input that is not an initializer to a NumPy array of its
    declared type and shape. ``requantize`` is QLinearConv/QLinearMatMul's requantization arithmetic:
    ``"float64"`` (None means this; bit-identical to onnx's ReferenceEvaluator) or ``"float32"``
    (bit-identical to onnxruntime); an evaluator keeps the mode it was built with. ``outputs`` restricts
    the results to these names.
    """
    function = "qlinear.onnx.run"
    if isinstance(model, ReferenceEvaluator):
        if requantize is not None:
            raise ValueError(f"{function}: requantize is chosen when the evaluator is built: qlinear.onnx.evaluator(model, requantize=...)")
        session = model
    else:
        session = evaluator(_load(model, function), requantize="float64" if requantize is None else requantize)
    if not isinstance(inputs, Mapping):
        raise TypeError(f"{function}: inputs must be a mapping of input names to arrays, got {type(inputs).__name__}")

    declared, required = _input_spec(session)
    unknown = sorted(set(inputs) - declared.keys())
    if unknown:
        raise ValueError(f"{function}: unknown input {unknown[0]!r}; the model's inputs are {required}")
    missing = [name for name in required if name not in inputs]
    if missing:
        raise ValueError(f"{function}: missing input {missing[0]!r}; the model's inputs are {required}")
    feeds = {}
    for name, value in inputs.items():
        if not isinstance(value, (np.ndarray, np.generic)):
            raise TypeError(f"{function}: input {name!r} must be a NumPy array, got {type(value).__name__}")
        value = np.asarray(value)
        _check_input(function, name, value, *declared[name])
        feeds[name] = value

    names = list(session.output_names) if outputs is None else list(outputs)
    absent = [name for name in names if name not in session.output_names]
    if absent:
        raise ValueError(f"{function}: {absent[0]!r} is not an output of the model; its outputs are {list(session.output_names)}")
    results = session.run(names, feeds)
    return {name: np.asarray(value) for name, value in zip(names, results)}
