"""tf.raw_ops.QuantizeV2 and tf.raw_ops.Dequantize: arguments, validation, dispatch.

The public functions normalise the arguments TensorFlow's way (attribute names and defaults are the
raw op's), reject everything the TensorFlow CPU kernel rejects with a ValueError carrying the same
meaning, view the data as ``[pre, slices, post]`` and hand it to one kernel function per operator
(``_quantize_kernel`` / ``_dequantize_kernel``). Today those call the NumPy reference; a fast kernel
slots in there without touching validation.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from qlinear import _out, _validate, dask_adapter, dtypes
from qlinear.dask_adapter import is_dask_array
from qlinear.reference import tf_quantize as _ref

__all__ = ["quantize_v2", "dequantize", "TF_QUANTIZED_TYPES"]

# TensorFlow's quantized types and the NumPy storage TensorFlow itself hands back (Tensor.numpy()).
# TensorFlow's quantized types, from the type table: name -> the NumPy dtype of the same width.
TF_QUANTIZED_TYPES: dict[str, np.dtype] = {t.tf_name: t.dtype for t in dtypes.TYPES if t.tf_name}
_TF_NAME_OF = {dtype: name for name, dtype in TF_QUANTIZED_TYPES.items()}

MODES = (_ref.MIN_COMBINED, _ref.MIN_FIRST, _ref.SCALED)
ROUND_MODES = (_ref.HALF_AWAY_FROM_ZERO, _ref.HALF_TO_EVEN)
_OUTPUT_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
_CHOICE_MESSAGE = "{func}: {name} must be {choices}, is '{value}'"


# ---------------------------------------------------------------------------------------------
# Kernels: the one place a faster implementation replaces the reference.
# ---------------------------------------------------------------------------------------------
def _kernel_modules():
    """(tf_quantize, tf_quantize_extra): the fast kernels' wrappers, imported on the first call (an import
    statement costs a microsecond even when the module is loaded)."""
    global _kernel_wrappers
    if _kernel_wrappers is None:
        from qlinear.kernels import tf_quantize as fast  # numba kernels; None when none covers the case
        from qlinear.kernels import tf_quantize_extra as extra  # strict=True, bfloat16 out

        _kernel_wrappers = fast, extra
    return _kernel_wrappers


_kernel_wrappers = None


def _quantize_kernel(x3, min_range, max_range, dtype, mode, round_mode, narrow_range, ensure_minimum_range, strict,
                     out=None):
    """``out``: None, or the C-contiguous array of x3's shape a kernel writes into (the reference's result is
    returned instead when no kernel runs; the caller copies it in)."""
    _fast, _extra = _kernel_modules()

    if strict:
        result = _extra.quantize_v2_strict(x3, min_range, max_range, dtype, mode, round_mode, narrow_range,
                                           ensure_minimum_range, out)
    else:
        result = _fast.quantize_v2(x3, min_range, max_range, dtype, mode, round_mode, narrow_range,
                                   ensure_minimum_range, strict, out)
    if result is None:
        result = _ref.quantize_v2(x3, min_range, max_range, dtype, mode, round_mode, narrow_range, ensure_minimum_range, strict)
    return result


def _dequantize_kernel(q3, min_range, max_range, mode, narrow_range, strict, out_dtype, out=None):
    """float32 or bfloat16 (the float32 result rounded to nearest even, as TensorFlow's kernel does). ``out`` as
    for `_quantize_kernel`."""
    _fast, _extra = _kernel_modules()  # _extra: strict=True, and bfloat16 out in one pass

    if strict or out_dtype != np.float32:
        result = _extra.dequantize(q3, min_range, max_range, mode, narrow_range, strict, out_dtype, out)
    else:
        result = _fast.dequantize(q3, min_range, max_range, mode, narrow_range, strict, out)
    if result is None:
        result = _ref.dequantize(q3, min_range, max_range, mode, narrow_range, strict)
        result = result if out_dtype == np.float32 else result.astype(out_dtype)
    return result


# ---------------------------------------------------------------------------------------------
# Argument normalisation
# ---------------------------------------------------------------------------------------------
def resolve_quantized_type(T, func: str = "quantize_v2", argument: str = "T") -> np.dtype:
    """"qint8".."qint32", a NumPy integer dtype of the same storage, or anything whose ``.name``
    is one of those (a tf.DType). Returns the NumPy storage dtype."""
    name = T if isinstance(T, str) else getattr(T, "name", None)
    if isinstance(name, str) and name in TF_QUANTIZED_TYPES:
        return TF_QUANTIZED_TYPES[name]
    try:
        dtype = np.dtype(T)
    except (TypeError, ValueError):
        dtype = None
    if dtype is not None and dtype in _TF_NAME_OF:
        return dtype
    raise ValueError(
        f"{func}: {argument} must be one of qint8, quint8, qint16, quint16, qint32 (or the NumPy dtypes "
        f"int8, uint8, int16, uint16, int32), got {T!r}"
    )


def _axis(func, value) -> int:
    axis = _validate.integer(func, "axis", value)
    if axis < -1:
        # TensorFlow's eager kernel treats axis < -1 as per-tensor (the graph shape function
        # rejects it); qlinear rejects it (a documented deviation).
        raise ValueError(
            f"{func}: axis must be -1 (per-tensor) or a dimension index >= 0, got {axis}; "
            "negative axes other than -1 are not normalised (TensorFlow's raw op does not either)"
        )
    return axis


# dtypes that passed `_is_real` (a finite set: NumPy's ints and floats, and bfloat16): np.issubdtype is slow
_REAL_DTYPES: set[np.dtype] = set()


def _is_real(dtype: np.dtype) -> bool:
    """Whether an input or a range of this dtype is accepted (it is then converted to float32)."""
    if dtype in _REAL_DTYPES:
        return True
    if np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.integer) or dtype == ml_dtypes.bfloat16:
        _REAL_DTYPES.add(dtype)
        return True
    return False


def _float_input(func, value) -> np.ndarray:
    arr = _validate.as_array(func, "input", value, "a real array-like of floats")
    if not _is_real(arr.dtype):
        raise TypeError(f"{func}: input must be a real array-like of floats (it is converted to float32), got dtype {arr.dtype}")
    return arr.astype(np.float32, copy=False)


def _range_values(func, argument, value) -> np.ndarray:
    arr = _validate.as_array(func, argument, value, "a float or an array of floats")
    if not _is_real(arr.dtype):
        raise TypeError(f"{func}: {argument} must be a float or an array of floats, got dtype {arr.dtype}")
    arr = arr.astype(np.float32)
    # one value (the common case) is tested as a Python float, exactly and without NumPy's reduction calls
    if not (math.isfinite(arr.item()) if arr.size == 1 else np.isfinite(arr).all()):
        # TensorFlow accepts NaN/inf ranges and produces platform-dependent garbage; qlinear rejects
        # them (a documented deviation).
        raise ValueError(f"{func}: {argument} must be finite, got {arr.tolist()}")
    return arr


def _three_dims(shape, axis):
    """[pre, slices, post] around ``axis`` (None: per-tensor -> [1, 1, size])."""
    if axis is None:
        return 1, 1, math.prod(shape)
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :])


# ---------------------------------------------------------------------------------------------
# QuantizeV2
# ---------------------------------------------------------------------------------------------
def quantize_v2(
    input,
    min_range,
    max_range,
    T,
    *,
    mode: str = "MIN_COMBINED",
    round_mode: str = "HALF_AWAY_FROM_ZERO",
    narrow_range: bool = False,
    axis: int = -1,
    ensure_minimum_range: float = 0.01,
    strict: bool = False,
    out: np.ndarray | None = None,
):
    """tf.raw_ops.QuantizeV2, bit for bit equal to TensorFlow's CPU kernel.

    Returns ``(output, output_min, output_max)``: ``output`` has the NumPy storage type of ``T``
    (int8, uint8, int16, uint16, int32) and the shape of ``input``; ``output_min``/``output_max``
    are float32, scalars for per-tensor quantization (``axis=-1``, or an axis of length 1), else of
    shape ``(input.shape[axis],)``.

    ``axis=-1`` means per-tensor (TensorFlow's sentinel); ``axis >= 0`` quantizes each slice along
    that dimension with its own ``min_range[i]``/``max_range[i]``.

    ``strict=True`` evaluates the documented formulas exactly (float64, one rounding, saturation)
    instead of reproducing the kernel's float32 arithmetic, truncation and qint32 wrap-around; see
    docs/semantics.md.

    ``out``: optional, keyword-only (NumPy's convention), the array for ``output`` only (the first element
    of the tuple; ``output_min``/``output_max`` are always new): a numpy.ndarray of ``input``'s shape and
    ``T``'s storage dtype, writeable, sharing no memory with ``input``, ``min_range`` or ``max_range``. The
    tuple's first element is then ``out`` itself. A C-contiguous ``out`` is written directly by the kernel,
    with no result-sized allocation; any other is filled by a copy. Not for dask inputs (TypeError).
    """
    func = "quantize_v2"
    if type(input) is not np.ndarray and is_dask_array(input):
        if out is not None:
            raise _out.dask_error(func, "input")
        return dask_adapter.tf_quantize_v2(
            quantize_v2, input, min_range, max_range, T, mode=mode, round_mode=round_mode, narrow_range=narrow_range, axis=axis,
            ensure_minimum_range=ensure_minimum_range, strict=strict)
    x = _float_input(func, input)
    dtype = resolve_quantized_type(T, func)
    mode = _validate.choice(func, "mode", mode, MODES, message=_CHOICE_MESSAGE)
    round_mode = _validate.choice(func, "round_mode", round_mode, ROUND_MODES, message=_CHOICE_MESSAGE)
    if round_mode == _ref.HALF_TO_EVEN and mode != _ref.SCALED:
        raise ValueError(f"{func}: round_mode 'HALF_TO_EVEN' is only supported for mode 'SCALED', but mode is '{mode}'")
    narrow_range = _validate.flag(func, "narrow_range", narrow_range)
    axis = _axis(func, axis)
    strict = _validate.flag(func, "strict", strict)
    try:
        ensure = np.float32(ensure_minimum_range)
    except (TypeError, ValueError):
        raise TypeError(f"{func}: ensure_minimum_range must be a float, got {type(ensure_minimum_range).__name__}") from None
    # math.isfinite: exact for a float32 scalar, without a ufunc call (np.float32 of a sequence is an array)
    if not (math.isfinite(ensure) if type(ensure) is np.float32 else np.isfinite(ensure)):
        raise ValueError(f"{func}: ensure_minimum_range must be finite, got {ensure_minimum_range!r}")
    mins = _range_values(func, "min_range", min_range)
    maxs = _range_values(func, "max_range", max_range)

    if axis >= 0:
        if axis >= x.ndim:
            raise ValueError(
                f"{func}: axis must be less than the number of input dimensions ({x.ndim}), got axis={axis}"
            )
        slices = x.shape[axis]
        for name, arr in (("min_range", mins), ("max_range", maxs)):
            if arr.ndim != 1 or arr.shape[0] != slices:
                raise ValueError(
                    f"{func}: {name} must be a 1-D array of size input.shape[{axis}] = {slices} when axis={axis}, "
                    f"got shape {arr.shape}"
                )
    else:
        slices = 1
        for name, arr in (("min_range", mins), ("max_range", maxs)):
            if arr.size != 1:
                raise ValueError(f"{func}: {name} must be a single float when axis=-1, got shape {arr.shape}")
    per_tensor = slices == 1  # TensorFlow runs its per-tensor path for an axis of length 1 too
    if not per_tensor and mode == _ref.MIN_FIRST:
        raise ValueError(f"{func}: mode 'MIN_FIRST' is not implemented for per-axis quantization (axis={axis})")
    mins, maxs = mins.reshape(-1), maxs.reshape(-1)
    if mins.size == 1 and maxs.size == 1:  # per-tensor: compared as Python floats (exact), no array calls
        bad = [0] if maxs.item() < mins.item() else []
    else:
        bad = (maxs < mins).nonzero()[0]  # 1-D: flatnonzero without its Python wrapper
    if len(bad):
        i = int(bad[0])
        where = "" if per_tensor else f" at slice {i}"
        raise ValueError(
            f"{func}: max_range must not be less than min_range{where}, got min_range={mins[i]!r}, max_range={maxs[i]!r}"
        )
    if strict and np.isnan(x).any():
        raise ValueError(f"{func}: input contains NaN, which has no quantized value (strict=True)")

    x3 = x.reshape(_three_dims(x.shape, None if per_tensor else axis))
    if out is None:
        q, out_min, out_max = _quantize_kernel(x3, mins, maxs, dtype, mode, round_mode, narrow_range, ensure, strict)
        q = q.reshape(x.shape)
    else:
        buffer = _out.check(func, out, x.shape, dtype, {"input": input, "min_range": min_range, "max_range": max_range},
                            "the output type is T's storage type")
        buffer3 = None if buffer is None else buffer.reshape(x3.shape)  # a view: the kernel writes into out
        q, out_min, out_max = _quantize_kernel(x3, mins, maxs, dtype, mode, round_mode, narrow_range, ensure, strict,
                                               buffer3)
        q = _out.deliver(out, buffer3, q)
    if per_tensor:
        return q, np.float32(out_min[0]), np.float32(out_max[0])
    return q, out_min.reshape(slices), out_max.reshape(slices)


# ---------------------------------------------------------------------------------------------
# Dequantize
# ---------------------------------------------------------------------------------------------
def _output_dtype(func, value) -> np.dtype:
    name = value if isinstance(value, str) else None
    if name is None:
        try:
            name = np.dtype(value).name
        except (TypeError, ValueError):
            name = getattr(value, "name", None)
    if name == "float":
        name = "float32"
    if name not in _OUTPUT_DTYPES:
        raise ValueError(f"{func}: dtype (the output type) must be bfloat16 or float32, is {value!r}")
    return _OUTPUT_DTYPES[name]


def dequantize(
    input,
    min_range,
    max_range,
    *,
    mode: str = "MIN_COMBINED",
    narrow_range: bool = False,
    axis: int = -1,
    dtype="float32",
    strict: bool = False,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """tf.raw_ops.Dequantize, bit for bit equal to TensorFlow's CPU kernel.

    ``input`` is an array of int8, uint8, int16, uint16 or int32 (the storage of qint8 .. qint32;
    its dtype is the op's ``T``). Returns an array of ``dtype`` (float32 or bfloat16) with the
    shape of ``input``. ``min_range``/``max_range`` hold one value per slice along ``axis``
    (one value for ``axis=-1``). ``strict=True`` evaluates the documented formulas in float64 and
    rounds once.

    ``out``: optional, keyword-only (NumPy's convention): a numpy.ndarray of ``input``'s shape and dtype
    ``dtype`` (float32 or bfloat16), writeable, sharing no memory with ``input``, ``min_range`` or
    ``max_range``; the result is written into it and ``out`` itself is returned. A C-contiguous ``out`` is
    written directly by the kernel; any other is filled by a copy. Not for dask inputs (TypeError).
    """
    func = "dequantize"
    if type(input) is not np.ndarray and is_dask_array(input):
        if out is not None:
            raise _out.dask_error(func, "input")
        return dask_adapter.tf_dequantize(dequantize, input, min_range, max_range, mode=mode, narrow_range=narrow_range,
                                          axis=axis, dtype=dtype, strict=strict)
    if not hasattr(input, "dtype"):
        raise TypeError(
            f"{func}: input must be an array of int8, uint8, int16, uint16 or int32 (its dtype is the quantized "
            f"type), got {type(input).__name__}"
        )
    q = np.asarray(input)
    if q.dtype not in _TF_NAME_OF:
        raise TypeError(f"{func}: input must have dtype int8, uint8, int16, uint16 or int32, got {q.dtype}")
    mode = _validate.choice(func, "mode", mode, MODES, message=_CHOICE_MESSAGE)
    out_dtype = _output_dtype(func, dtype)
    if out_dtype != np.float32 and mode != _ref.MIN_COMBINED:
        raise ValueError(f"{func}: when the output type is bfloat16, mode must be 'MIN_COMBINED', is '{mode}'")
    narrow_range = _validate.flag(func, "narrow_range", narrow_range)
    axis = _axis(func, axis)
    strict = _validate.flag(func, "strict", strict)
    mins = _range_values(func, "min_range", min_range)
    maxs = _range_values(func, "max_range", max_range)
    if axis >= q.ndim:
        raise ValueError(f"{func}: axis must be less than the number of input dimensions ({q.ndim}), got axis={axis}")
    slices = q.shape[axis] if axis >= 0 else 1
    for name, arr in (("min_range", mins), ("max_range", maxs)):
        if arr.size != slices:
            raise ValueError(
                f"{func}: {name} must have as many elements as input has along the dequantization axis "
                f"(axis={axis}: {slices}), got {arr.size}"
            )
    per_tensor = slices == 1
    if not per_tensor and mode == _ref.MIN_FIRST:
        raise ValueError(f"{func}: mode 'MIN_FIRST' is not implemented for per-axis dequantization (axis={axis})")
    q3 = q.reshape(_three_dims(q.shape, None if per_tensor else axis))
    if out is None:
        return _dequantize_kernel(q3, mins.reshape(-1), maxs.reshape(-1), mode, narrow_range, strict,
                                  out_dtype).reshape(q.shape)
    buffer = _out.check(func, out, q.shape, out_dtype, {"input": input, "min_range": min_range, "max_range": max_range},
                        "the output type is the dtype argument")
    buffer3 = None if buffer is None else buffer.reshape(q3.shape)  # a view: the kernel writes into out
    result = _dequantize_kernel(q3, mins.reshape(-1), maxs.reshape(-1), mode, narrow_range, strict, out_dtype,
                                buffer3)
    return _out.deliver(out, buffer3, result)
