"""ONNX QuantizeLinear and DequantizeLinear: argument handling, the opset rules, dispatch.

The public functions validate and normalise their arguments against the schema version in force
(`qlinear.schemas`), resolve the granularity (`qlinear.granularity`), then run the fast kernel when
one exists for the case, else the NumPy reference (`qlinear.reference.quantize_linear`).
"""

from __future__ import annotations

import numbers

import numpy as np

from .. import _out, dtypes, granularity as granularity_mod, schemas
from .. import dask_adapter
from ..dask_adapter import is_dask_array
from ..dtypes import ElementType
from ..kernels import quantize_linear as kernels
from ..reference import quantize_linear as reference

_Q = "quantize_linear"
_DQ = "dequantize_linear"


def _label(schema: schemas.Schema) -> str:
    return schema.label


def _has_dtype(value) -> bool:
    return isinstance(value, (np.ndarray, np.generic)) or hasattr(value, "dtype")


def _array(value, function: str, name: str, default: ElementType | None, allowed: tuple[str, ...], schema,
           keep_lazy: bool = False) -> tuple[np.ndarray, ElementType]:
    """Convert an argument to an array whose type is one of ``allowed``.

    Values without a dtype (Python scalars and lists) take ``default``; arrays keep their dtype,
    which must be allowed (no silent conversions of a float64 array, for instance). A dask array
    stays lazy with ``keep_lazy`` (x); scales and zero points are small and are computed.
    """
    if type(value) is np.ndarray or isinstance(value, np.generic):
        # The common case, decided without the general path's tests; anything it would reject (or a
        # dtype outside the table) falls through to the general path, which raises its error.
        array = value if type(value) is np.ndarray else np.asarray(value)
        kind = _TYPE_OF_DTYPE.get(array.dtype)
        if kind is not None and kind.onnx_name in allowed:
            return array, kind
    if value is None:
        raise TypeError(f"{function}: {name} is required, got None")
    if _has_dtype(value):
        array = value if keep_lazy and is_dask_array(value) else np.asarray(value)
        if any(isinstance(d, float) for d in array.shape):  # dask marks unknown sizes with NaN
            raise ValueError(
                f"{function}: {name} has unknown dimensions (a dask array with chunks of unknown size); "
                f"call .compute_chunk_sizes() first"
            )
        kind = dtypes.element_type_of(array)
        if kind is None or kind.onnx_name not in allowed:
            raise TypeError(
                f"{function}: {name} has dtype {array.dtype}; {_label(schema)} accepts {', '.join(allowed)} for {name}"
            )
        return array, kind
    if default is None:
        raise TypeError(
            f"{function}: {name} must be an array with a dtype ({', '.join(allowed)}), got {type(value).__name__}"
        )
    array = np.asarray(value)
    if array.dtype.kind not in "biuf":
        raise TypeError(f"{function}: {name} must be numeric, got {type(value).__name__} of {array.dtype}")
    return _exact_convert(array, default, function, name), default


def _exact_convert(array: np.ndarray, target: ElementType, function: str, name: str) -> np.ndarray:
    """Convert Python-supplied numbers to ``target``; integer targets must hold every value exactly."""
    if target.is_integer:
        if array.dtype.kind == "f" and not np.all(np.isfinite(array) & (array == np.round(array))):
            raise ValueError(f"{function}: {name} must hold integers for type {target.onnx_name}, got {array.tolist()}")
        if array.size and (array.min() < target.qmin or array.max() > target.qmax):
            raise ValueError(
                f"{function}: {name} must lie in [{target.qmin}, {target.qmax}] for type {target.onnx_name}, got {array.tolist()}"
            )
    return array.astype(target.dtype)


def _check_attributes(schema: schemas.Schema, function: str, **given) -> None:
    """Reject attributes that the schema version lacks (given here only when not at their default)."""
    for attribute, value in given.items():
        if not schema.allows(attribute):
            raise ValueError(
                f"{function}: {_label(schema)} has no attribute {attribute!r} (got {attribute}={value!r}); "
                f"it needs a newer opset"
            )


def _flag(value, function: str, name: str) -> bool:
    if type(value) is int and 0 <= value <= 1:  # the default 1, without the numbers.Integral test below
        return value == 1
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, numbers.Integral) and int(value) in (0, 1)):
        return bool(value)
    raise ValueError(f"{function}: {name} must be 0 or 1, got {value!r}")


def _division_dtype(scale_type: ElementType) -> np.dtype:
    """The precision of x / y_scale when `precision` is not given: the scale's type.

    Two scale types are not arithmetic types, so they name the precision that computes the same
    thing exactly: an int32 scale divides in float64 (exactly rounded: the quotient of two int32
    values is never close enough to a .5 tie to be misrounded in float64), and a float8e8m0 scale
    (a power of two) divides in float32.
    """
    if scale_type.onnx_name == "int32":
        return np.dtype(np.float64)
    if scale_type.kind == "e8m0":
        return np.dtype(np.float32)
    return scale_type.dtype


_PRECISIONS = ("float", "float16", "bfloat16", "double")
_FLOAT = dtypes.get("float")
_UINT8 = dtypes.get("uint8")
_TYPE_OF_DTYPE = dtypes.BY_DTYPE
# The attributes each operator has; a schema version that has them all has nothing to reject, so the
# operators skip `_check_attributes` (and building its arguments) for it.
_Q_ATTRIBUTES = frozenset({"axis", "block_size", "output_dtype", "saturate", "precision"})
_DQ_ATTRIBUTES = frozenset({"axis", "block_size", "output_dtype"})


def _prepare_quantize(x, y_scale, y_zero_point, axis, block_size, output_dtype, saturate, precision, opset):
    """Validate QuantizeLinear's arguments against the schema version; return them normalised."""
    schema = schemas.schema_for("QuantizeLinear", opset, _Q)
    label = schema.label
    if not _Q_ATTRIBUTES <= schema.attributes:
        _check_attributes(
            schema, _Q,
            **{name: value for name, value, default in (
                ("axis", axis, 1), ("block_size", block_size, 0), ("output_dtype", output_dtype, None),
                ("saturate", saturate, 1), ("precision", precision, None)) if not _same(value, default)},
        )

    x, x_type = _array(x, _Q, "x", _FLOAT, schema.full_precision_types, schema, keep_lazy=True)
    scale_types = schema.scale_types if schema.scale_types is not None else (x_type.onnx_name,)
    if schema.scale_types is None and _has_dtype(y_scale) and np.asarray(y_scale).dtype != x.dtype:
        raise TypeError(
            f"{_Q}: {label} requires y_scale to have x's type ({x_type.onnx_name}), got {np.asarray(y_scale).dtype}"
        )
    # dtypes.get: the schema's names are the table's own (resolve_dtype would return the same row)
    y_scale, scale_type = _array(y_scale, _Q, "y_scale", dtypes.get(scale_types[0]), scale_types, schema)

    requested = None
    if output_dtype is not None and not _same(output_dtype, 0):
        requested = dtypes.resolve_dtype(output_dtype, "output_dtype", _Q)
    if y_zero_point is not None:
        if _has_dtype(y_zero_point):
            zp_array = np.asarray(y_zero_point)
            output = dtypes.element_type_of(zp_array)
            if output is None or output.onnx_name not in schema.quantized_types:
                raise TypeError(
                    f"{_Q}: y_zero_point has dtype {zp_array.dtype}; its type is the output type, and {label} "
                    f"accepts {', '.join(schema.quantized_types)}"
                )
            if requested is not None and requested != output:
                raise ValueError(
                    f"{_Q}: output_dtype ({requested.onnx_name}) must equal y_zero_point's type ({output.onnx_name}) "
                    f"when both are given"
                )
            y_zero_point = zp_array
        elif requested is not None:
            y_zero_point = _exact_convert(np.asarray(y_zero_point), requested, _Q, "y_zero_point")
            output = requested
        else:
            raise TypeError(
                f"{_Q}: y_zero_point's dtype sets the output type, but {y_zero_point!r} has none; pass e.g. "
                f"np.uint8({y_zero_point!r}) or set output_dtype"
            )
    else:
        output = requested or _UINT8
    if output.onnx_name not in schema.quantized_types:
        raise ValueError(f"{_Q}: {label} cannot output {output.onnx_name}; it accepts {', '.join(schema.quantized_types)}")

    if precision is not None and not _same(precision, 0):
        precision_type = dtypes.resolve_dtype(precision, "precision", _Q)
        if precision_type.onnx_name not in _PRECISIONS:
            raise ValueError(f"{_Q}: precision must be a float type ({', '.join(_PRECISIONS)}), got {precision_type.onnx_name}")
        division = precision_type.dtype
    else:
        division = _division_dtype(scale_type)

    saturate = _flag(saturate, _Q, "saturate")
    gran = granularity_mod.resolve(
        _Q, x.shape, y_scale.shape, None if y_zero_point is None else y_zero_point.shape, axis, block_size,
        schema.granularities, "y_scale", "y_zero_point", label,
    )
    return x, y_scale, y_zero_point, gran, output, saturate, division


def quantize_linear(x, y_scale, y_zero_point=None, *, axis=1, block_size=0, output_dtype=None,
                    saturate=1, precision=None, opset=None, out=None) -> np.ndarray:
    """ONNX QuantizeLinear: ``y = saturate(round(x / y_scale) + y_zero_point)``, rounding half to even.

    Args and defaults are those of the ONNX operator; ``opset`` selects the schema version (None: 28).
    The output type is ``y_zero_point``'s dtype, else ``output_dtype``, else uint8. Sub-byte and small
    float outputs are ml_dtypes arrays, one element per byte (see `qlinear.pack`).

    ``out``: optional, keyword-only (NumPy's convention): a numpy.ndarray with exactly the result's shape
    (x's) and dtype (the output type, which ``out`` does not choose), writeable, sharing no memory with x,
    y_scale or y_zero_point; the result is written into it and ``out`` itself is returned. A C-contiguous
    ``out`` is written directly by the kernel, with no result-sized allocation; any other (strided, say) is
    filled by copying the result in. Not for dask inputs (TypeError).

    >>> import numpy as np, qlinear
    >>> qlinear.quantize_linear(np.array([0, 2, 3, 1000, -254, -1000], np.float32), np.float32(2), np.uint8(128))
    array([128, 129, 130, 255,   1,   0], dtype=uint8)
    """
    x, y_scale, y_zero_point, gran, output, saturate, division = _prepare_quantize(
        x, y_scale, y_zero_point, axis, block_size, output_dtype, saturate, precision, opset)
    if type(x) is not np.ndarray and is_dask_array(x):
        if out is not None:
            raise _out.dask_error(_Q)
        return dask_adapter.quantize_linear(quantize_linear, x, y_scale, y_zero_point, gran, output, saturate, division)
    buffer = None
    if out is not None:
        buffer = _out.check(_Q, out, x.shape, output.dtype, {"x": x, "y_scale": y_scale, "y_zero_point": y_zero_point},
                            "the output type is y_zero_point's dtype, else output_dtype, else uint8")
    result = kernels.quantize_linear(x, y_scale, y_zero_point, gran, output, saturate, division, buffer)
    if result is None:  # no kernel for this case (or kernels switched off): the reference
        result = reference.quantize_linear(x, y_scale, y_zero_point, gran, output, saturate, division)
    return result if out is None else _out.deliver(out, buffer, result)


def _prepare_dequantize(x, x_scale, x_zero_point, axis, block_size, output_dtype, opset):
    """Validate DequantizeLinear's arguments against the schema version; return them normalised."""
    schema = schemas.schema_for("DequantizeLinear", opset, _DQ)
    label = schema.label
    if not _DQ_ATTRIBUTES <= schema.attributes:
        _check_attributes(
            schema, _DQ,
            **{name: value for name, value, default in (
                ("axis", axis, 1), ("block_size", block_size, 0), ("output_dtype", output_dtype, None))
               if not _same(value, default)},
        )

    if not _has_dtype(x) and _has_dtype(x_zero_point):
        x = np.asarray(x).astype(np.asarray(x_zero_point).dtype)  # a list of numbers takes the zero point's type
    x, x_type = _array(x, _DQ, "x", None, schema.quantized_types, schema, keep_lazy=True)
    if x_zero_point is not None:
        if _has_dtype(x_zero_point):
            x_zero_point = np.asarray(x_zero_point)
            if x_zero_point.dtype != x.dtype:
                raise TypeError(f"{_DQ}: x_zero_point must have x's type ({x_type.onnx_name}), got {x_zero_point.dtype}")
        else:
            x_zero_point = _exact_convert(np.asarray(x_zero_point), x_type, _DQ, "x_zero_point")
    x_scale, scale_type = _array(x_scale, _DQ, "x_scale", _FLOAT, schema.scale_types, schema)

    if output_dtype is not None and not _same(output_dtype, 0):
        output = dtypes.resolve_dtype(output_dtype, "output_dtype", _DQ)
        if output.onnx_name not in schema.full_precision_types:
            raise ValueError(f"{_DQ}: output_dtype must be one of {', '.join(schema.full_precision_types)}, got {output.onnx_name}")
    else:
        output = scale_type
        if output.onnx_name not in schema.full_precision_types:
            raise ValueError(
                f"{_DQ}: the output type defaults to x_scale's type ({scale_type.onnx_name}), which is not an output "
                f"type ({', '.join(schema.full_precision_types)}); set output_dtype"
            )

    gran = granularity_mod.resolve(
        _DQ, x.shape, x_scale.shape, None if x_zero_point is None else x_zero_point.shape, axis, block_size,
        schema.granularities, "x_scale", "x_zero_point", label,
    )
    return x, x_type, x_scale, x_zero_point, gran, output


def dequantize_linear(x, x_scale, x_zero_point=None, *, axis=1, block_size=0, output_dtype=None,
                      opset=None, out=None) -> np.ndarray:
    """ONNX DequantizeLinear: ``y = (x - x_zero_point) * x_scale``.

    The output type is ``output_dtype`` when given (opset 23+), else the scale's type.

    ``out``: optional, keyword-only, as for `quantize_linear`: a numpy.ndarray of x's shape and the output
    type (which ``out`` does not choose), writeable, sharing no memory with x, x_scale or x_zero_point; filled
    and returned. A C-contiguous ``out`` is written directly by the kernel; any other is filled by a copy.

    >>> import numpy as np, qlinear
    >>> qlinear.dequantize_linear(np.array([0, 3, 128, 255], np.uint8), np.float32(2), np.uint8(128))
    array([-256., -250.,    0.,  254.], dtype=float32)
    """
    x, x_type, x_scale, x_zero_point, gran, output = _prepare_dequantize(
        x, x_scale, x_zero_point, axis, block_size, output_dtype, opset)
    if type(x) is not np.ndarray and is_dask_array(x):
        if out is not None:
            raise _out.dask_error(_DQ)
        return dask_adapter.dequantize_linear(dequantize_linear, x, x_type, x_scale, x_zero_point, gran, output)
    buffer = None
    if out is not None:
        buffer = _out.check(_DQ, out, x.shape, output.dtype, {"x": x, "x_scale": x_scale, "x_zero_point": x_zero_point},
                            "the output type is output_dtype, else x_scale's type")
    result = kernels.dequantize_linear(x, x_type, x_scale, x_zero_point, gran, output, buffer)
    if result is None:
        result = reference.dequantize_linear(x, x_type, x_scale, x_zero_point, gran, output)
    return result if out is None else _out.deliver(out, buffer, result)


def _same(value, default) -> bool:
    """Whether an attribute was left at its default (0 and None both mean "unset" for dtypes)."""
    if value is None or default is None:
        return value is default
    try:
        return bool(value == default) and type(value) is not str
    except Exception:
        return False
