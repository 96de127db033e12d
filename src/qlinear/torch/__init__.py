"""PyTorch's quantize and fake-quantize operators, bit for bit as torch computes them on an x86 CPU.

NumPy arrays in, NumPy arrays out; ``qlinear.torch`` never imports torch. The arithmetic is transcribed in
`qlinear.reference.torch_quantize`; these functions validate the arguments (torch's own checks, plus the few
qlinear adds, each named in its message) and dispatch to it. docs/torch.md has the examples and the list of
differences from ONNX QuantizeLinear.
"""

from __future__ import annotations

import math
import operator

import numpy as np

from qlinear import _validate
from qlinear.reference import torch_quantize as _ref

__all__ = [
    "TORCH_QUANTIZED_TYPES",
    "fake_quantize_per_channel_affine",
    "fake_quantize_per_tensor_affine",
    "quantize_per_channel",
    "quantize_per_tensor",
]

# torch's quantized types -> the NumPy dtype of their integer representation (what .int_repr() holds).
TORCH_QUANTIZED_TYPES: dict[str, np.dtype] = {
    "qint8": np.dtype(np.int8),
    "quint8": np.dtype(np.uint8),
    "qint32": np.dtype(np.int32),
}
_NAME_OF = {dtype: name for name, dtype in TORCH_QUANTIZED_TYPES.items()}
_INT32 = (-(2**31), 2**31 - 1)


# ---------------------------------------------------------------------------------------------
# Argument normalisation
# ---------------------------------------------------------------------------------------------
def _dtype(func, value) -> np.dtype:
    """"qint8" | "quint8" | "qint32", torch.qint8 & co. (recognised by their str(), "torch.qint8": torch is not
    imported), or a NumPy dtype of the same storage (int8, uint8, int32)."""
    name = value if isinstance(value, str) else str(value) if type(value).__module__ == "torch" else None
    if name is not None:
        name = name.removeprefix("torch.")
        if name in TORCH_QUANTIZED_TYPES:
            return TORCH_QUANTIZED_TYPES[name]
    try:
        dtype = np.dtype(value)
    except (TypeError, ValueError):
        dtype = None
        if name is None:
            raise TypeError(
                f"{func}: dtype must be a name (qint8, quint8, qint32) or a NumPy dtype (int8, uint8, int32), "
                f"got {type(value).__name__}") from None
    if dtype is not None and dtype in _NAME_OF:
        return dtype
    raise ValueError(
        f"{func}: dtype must be one of qint8, quint8, qint32 (or the NumPy dtypes int8, uint8, int32), got {value!r}")


def _int(func, argument, value) -> int:
    """A Python or NumPy integer (not a bool, not a float: torch's argument parser takes ints only)."""
    if isinstance(value, (bool, np.bool_, float, np.floating)):
        raise TypeError(f"{func}: {argument} must be an int, got {type(value).__name__}")
    if isinstance(value, np.ndarray) and value.ndim == 0 and np.issubdtype(value.dtype, np.integer):
        return int(value)
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{func}: {argument} must be an int, got {type(value).__name__}") from None


def _is_real(dtype: np.dtype) -> bool:
    return (np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.integer)) and dtype != np.bool_


def _float_input(func, value) -> np.ndarray:
    arr = _validate.as_array(func, "x", value, "a real array-like")
    if not _is_real(arr.dtype):
        raise TypeError(f"{func}: x must be a real array-like (it is converted to float32), got dtype {arr.dtype}")
    return arr.astype(np.float32, copy=False)


def _check_scales(func, argument, s: np.ndarray, raw) -> None:
    """Every float32 scale positive, finite, with a finite float32 reciprocal (qlinear's rule: torch checks
    nothing and computes with whatever 1.0f / scale gives)."""
    i = _validate.first_bad_scale(s, finite_reciprocal=True)
    if i is not None:
        where = "" if s.ndim == 0 else f"[{i}]"
        value = float(np.asarray(raw, dtype=np.float64).reshape(-1)[i]) if s.ndim else raw
        raise ValueError(
            f"{func}: {argument}{where} must be positive and finite with a finite float32 reciprocal "
            f"(at least about 2.9e-39), got {value!r}; torch does not check its scales (qlinear does)")


def _scalar_scale(func, value) -> np.float32:
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{func}: scale must be a float, got bool")
    arr = _validate.as_array(func, "scale", value, "a float")
    if arr.ndim != 0 or not _is_real(arr.dtype):
        raise TypeError(f"{func}: scale must be a float (one value for the whole tensor), got "
                        f"{type(value).__name__}" + (f" of shape {arr.shape}" if arr.ndim else f" of dtype {arr.dtype}"))
    with np.errstate(over="ignore"):
        s = np.float32(np.float64(arr))  # torch keeps a double; every kernel uses float(scale)
    _check_scales(func, "scale", np.asarray(s), value)
    return s


def _channel_scales(func, argument, value) -> np.ndarray:
    arr = _validate.as_array(func, argument, value, "a 1-D array of floats")
    if not _is_real(arr.dtype):
        raise TypeError(f"{func}: {argument} must be a 1-D array of floats, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"{func}: {argument} must be a 1-D array (one scale per channel), got shape {arr.shape}")
    with np.errstate(over="ignore"):
        s = arr.astype(np.float64).astype(np.float32)  # torch's double scales, used as float(scales[c])
    _check_scales(func, argument, s, arr)
    return s


def _channel_zero_points(func, argument, value) -> np.ndarray:
    arr = _validate.as_array(func, argument, value, "a 1-D array of ints")
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(
            f"{func}: {argument} must hold integers, got dtype {arr.dtype} (torch's separate arithmetic for "
            "floating-point zero points is not implemented)")
    if arr.ndim != 1:
        raise ValueError(f"{func}: {argument} must be a 1-D array (one zero point per channel), got shape {arr.shape}")
    return arr.astype(np.int64)


def _check_range(func, argument, values, lo, hi, rule) -> None:
    """``values``: one int (the message names the argument) or a 1-D array (it names the index too)."""
    indexed = np.ndim(values) == 1
    values = np.asarray(values, np.int64).reshape(-1)
    bad = (values < lo) | (values > hi)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        where = f"[{i}]" if indexed else ""
        raise ValueError(f"{func}: {argument}{where} must be in [{lo}, {hi}] ({rule}), got {int(values[i])}")


def _axis(func, value, ndim) -> int:
    axis = _validate.integer(func, "axis", value)
    if not 0 <= axis < ndim:
        raise ValueError(
            f"{func}: axis must be in [0, {ndim}) for an input of {ndim} dimension{'s' if ndim != 1 else ''}, got "
            f"{axis} (torch rejects negative axes too)")
    return axis


def _check_channels(func, scale_name, zero_point_name, scales, zero_points, x_shape, axis) -> None:
    """As many scales as zero points (torch's check), and one of each per index of x.shape[axis]."""
    if scales.shape[0] != zero_points.shape[0]:
        raise ValueError(f"{func}: {scale_name} and {zero_point_name} must have the same number of elements "
                         f"(torch's check), got {scales.shape[0]} and {zero_points.shape[0]}")
    if scales.shape[0] != x_shape[axis]:
        raise ValueError(
            f"{func}: {scale_name} must have one value per channel, x.shape[{axis}] = {x_shape[axis]}, got "
            f"{scales.shape[0]}")


def _three_dims(shape, axis):
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])


def _no_nan(func, x) -> None:
    if np.isnan(x).any():
        raise ValueError(f"{func}: x contains NaN, which has no quantized value (strict=True)")


def _quant_range(func, quant_min, quant_max) -> tuple[int, int]:
    qmin = _int(func, "quant_min", quant_min)
    qmax = _int(func, "quant_max", quant_max)
    for argument, v in (("quant_min", qmin), ("quant_max", qmax)):
        if not _INT32[0] <= v <= _INT32[1]:
            raise ValueError(
                f"{func}: {argument} must be in the int32 range [{_INT32[0]}, {_INT32[1]}], got {v} "
                "(a qlinear limit: torch takes any int64)")
    if qmin > qmax:
        raise ValueError(f"{func}: quant_min must be less than or equal to quant_max (torch's check), got "
                         f"quant_min={qmin}, quant_max={qmax}")
    return qmin, qmax


# ---------------------------------------------------------------------------------------------
# quantize_per_tensor / quantize_per_channel
# ---------------------------------------------------------------------------------------------
def quantize_per_tensor(x, scale, zero_point, dtype, *, strict: bool = False, legacy: bool = False) -> np.ndarray:
    """``torch.quantize_per_tensor(x, scale, zero_point, dtype).int_repr()``, bit for bit as on an x86 CPU.

    ``x`` is converted to float32 (torch accepts float32 tensors only). ``scale`` is a positive float, used as
    float32 (torch stores a double, its kernel computes with ``float(scale)``); ``zero_point`` an int in the
    type's range (torch's check). ``dtype`` is "qint8", "quint8", "qint32" (or torch's dtype, or the NumPy
    dtypes int8, uint8, int32). Returns the integer representation, of ``x``'s shape, as int8, uint8 or int32.

    q = clamp(nearbyint(x * float32(1 / scale)) + zero_point), ties to even. NaN, infinities and values beyond
    2^31 follow torch's x86 kernel (docs/torch.md): for qint8/quint8 (FBGEMM's AVX2 path) NaN gives the type's
    maximum, and the int32 addition of the zero point wraps, so +Inf and NaN give 0 when a quint8 zero point is
    128 or more, and -Inf gives 127 when a qint8 zero point is negative; for qint32 NaN gives -2^31 and the
    zero point is added in float32 (rounding above 2^24). ``strict=True`` instead saturates (±Inf and every
    value beyond the range give the type's limit, the zero point is added exactly) and rejects NaN.

    ``legacy=True`` gives torch 2.13.0's arithmetic, which adds the zero point *before* rounding (FBGEMM's
    LEGACY path, fused multiply-add for qint8/quint8): 2.5 with zero point 3 gives 6 there, 5 here.
    """
    func = "quantize_per_tensor"
    xf = _float_input(func, x)
    s = _scalar_scale(func, scale)
    zp = _int(func, "zero_point", zero_point)
    dt = _dtype(func, dtype)
    strict = _validate.flag(func, "strict", strict)
    legacy = _validate.flag(func, "legacy", legacy)
    info = np.iinfo(dt)
    _check_range(func, "zero_point", zp, int(info.min), int(info.max), f"the range of {_NAME_OF[dt]}, torch's check")
    if strict:
        _no_nan(func, xf)
    return _ref.quantize_per_tensor(xf, s, zp, dt, legacy=legacy, strict=strict).reshape(xf.shape)


def quantize_per_channel(x, scales, zero_points, axis, dtype, *, strict: bool = False,
                         legacy: bool = False) -> np.ndarray:
    """``torch.quantize_per_channel(x, scales, zero_points, axis, dtype).int_repr()``, bit for bit (x86 CPU).

    ``scales`` (positive floats, used as float32) and ``zero_points`` (ints in the type's range) are 1-D with
    one value per index of ``x.shape[axis]``; ``0 <= axis < x.ndim`` (torch takes no negative axis).
    q = clamp(nearbyint(x * float32(1 / scales[c])) + zero_points[c]) per channel c. Every element takes
    FBGEMM's scalar path, whose zero point is added in float32 and whose NaN becomes 0 (qint8, quint8) or
    -2^31 (qint32); ±Inf saturate. ``strict`` and ``legacy`` as for `quantize_per_tensor` (legacy's addition
    is not fused here).
    """
    func = "quantize_per_channel"
    xf = _float_input(func, x)
    ax = _axis(func, axis, xf.ndim)
    s = _channel_scales(func, "scales", scales)
    zps = _channel_zero_points(func, "zero_points", zero_points)
    dt = _dtype(func, dtype)
    strict = _validate.flag(func, "strict", strict)
    legacy = _validate.flag(func, "legacy", legacy)
    _check_channels(func, "scales", "zero_points", s, zps, xf.shape, ax)
    info = np.iinfo(dt)
    _check_range(func, "zero_points", zps, int(info.min), int(info.max), f"the range of {_NAME_OF[dt]}, torch's check")
    if strict:
        _no_nan(func, xf)
    x3 = xf.reshape(_three_dims(xf.shape, ax))
    return _ref.quantize_per_channel(x3, s, zps, dt, legacy=legacy, strict=strict).reshape(xf.shape)


# ---------------------------------------------------------------------------------------------
# fake_quantize_per_tensor_affine / fake_quantize_per_channel_affine
# ---------------------------------------------------------------------------------------------
def fake_quantize_per_tensor_affine(x, scale, zero_point, quant_min, quant_max, *, strict: bool = False) -> np.ndarray:
    """``torch.fake_quantize_per_tensor_affine`` on a float32 tensor: quantize, then dequantize, float32 out.

    out = (clamp(nearbyint(x * float32(1 / scale)) + zero_point, quant_min, quant_max) - zero_point) * scale,
    the zero point added *after* rounding (every torch version). torch's checks: ``quant_min <= quant_max``
    and ``quant_min <= zero_point <= quant_max``; qlinear also wants a positive finite scale and the range
    within int32. NaN gives quant_min's value, ±Inf the range's ends; the zero point is added in float32 and
    ``q - zero_point`` converted to float32 before the product (both exact unless beyond 2^24).
    ``strict=True`` rejects NaN and computes the sum and the product exactly (the product rounded once).
    """
    func = "fake_quantize_per_tensor_affine"
    xf = _float_input(func, x)
    s = _scalar_scale(func, scale)
    zp = _int(func, "zero_point", zero_point)
    qmin, qmax = _quant_range(func, quant_min, quant_max)
    strict = _validate.flag(func, "strict", strict)
    _check_range(func, "zero_point", zp, qmin, qmax, "between quant_min and quant_max, torch's check")
    if strict:
        _no_nan(func, xf)
    return _ref.fake_quantize_per_tensor(xf, s, zp, qmin, qmax, strict=strict).reshape(xf.shape)


def fake_quantize_per_channel_affine(x, scale, zero_point, axis, quant_min, quant_max, *,
                                     strict: bool = False) -> np.ndarray:
    """``torch.fake_quantize_per_channel_affine`` on a float32 tensor with integer zero points; float32 out.

    ``scale`` and ``zero_point`` are 1-D, one value per index of ``x.shape[axis]`` (torch: a float32 and an
    int32 tensor; float zero points take a different branch in torch, not implemented here: TypeError).
    Same formula as `fake_quantize_per_tensor_affine`, but the product is computed in double, and the
    kernel's int64 conversion sends NaN, ±Inf and |x / scale| >= 2^63 to quant_min: +Inf gives quant_min's
    value here. ``strict=True`` saturates (+Inf -> quant_max) and rejects NaN.
    """
    func = "fake_quantize_per_channel_affine"
    xf = _float_input(func, x)
    ax = _axis(func, axis, xf.ndim)
    s = _channel_scales(func, "scale", scale)
    zps = _channel_zero_points(func, "zero_point", zero_point)
    qmin, qmax = _quant_range(func, quant_min, quant_max)
    strict = _validate.flag(func, "strict", strict)
    _check_channels(func, "scale", "zero_point", s, zps, xf.shape, ax)
    _check_range(func, "zero_point", zps, qmin, qmax, "between quant_min and quant_max, torch's check")
    if strict:
        _no_nan(func, xf)
    x3 = xf.reshape(_three_dims(xf.shape, ax))
    return _ref.fake_quantize_per_channel(x3, s, zps, qmin, qmax, strict=strict).reshape(xf.shape)
