"""Calibration: the scale and zero point of a tensor from its range, per tensor, per axis or per block.

Two steps, kept apart so that a large tensor can be reduced chunk by chunk:

1. `ranges(x, granularity)` reduces x to its min and max per group (one group for per-tensor, one per
   index along the axis for per-axis, one per block for blocked), in the parameter shape that
   `qlinear.granularity` defines. It uses only ``.min``/``.max(axis=...)``, slicing, reshape and
   ``np.concatenate``, so it works on NumPy arrays, memory maps and dask arrays alike.
2. `parameters(lo, hi, qtype, symmetric)` turns the ranges into a scale and zero point:

   - integer types, asymmetric: the range is widened to include 0 (so 0.0 is exact), then
     ``scale = (hi - lo) / (qmax - qmin)`` and ``zero_point = round(qmin - lo / scale)`` clamped into
     [qmin, qmax];
   - integer types, symmetric: ``absmax = max(|lo|, |hi|)``; signed types use zero point 0 and
     ``scale = absmax / qmax`` (the range [-qmax, qmax], so +-absmax are both exact); unsigned types use
     the middle code ``zero_point = (qmax + 1) / 2`` and ``scale = absmax / (qmax - zero_point)``;
   - float8/float6/float4: ``scale = absmax / max_finite(type)``, zero point 0 (these formats are
     symmetric, and ONNX allows only a zero zero point for them).

   A group whose range is empty (a constant zero tensor) gets scale 1, and a scale that underflows
   to 0 in its storage type gets that type's smallest normal number: scales are always > 0 and finite.
"""

from __future__ import annotations

import numpy as np

from .dtypes import ElementType
from .granularity import Granularity


def ranges(x, granularity: Granularity):
    """(min, max) of x per group, each of shape ``granularity.param_shape`` (float64 NumPy arrays).

    ``granularity`` must describe x's shape. Empty tensors have no range (ValueError).
    """
    if any(d == 0 for d in x.shape):
        raise ValueError(f"calibrate.ranges: x has no elements (shape {tuple(x.shape)})")
    kind = granularity.kind
    if kind == "tensor":
        return _as_f64(x.min()), _as_f64(x.max())
    return reduce_groups(x, granularity, "min"), reduce_groups(x, granularity, "max")


def reduce_groups(x, granularity: Granularity, how: str) -> np.ndarray:
    """x reduced with its ``how`` method ("min", "max", "sum") over each group of the granularity:
    a float64 array of shape ``granularity.param_shape``."""
    if granularity.kind == "tensor":
        return _as_f64(getattr(x, how)())
    axis = granularity.axis
    if granularity.kind == "axis":
        others = tuple(i for i in range(x.ndim) if i != axis)
        return _as_f64(getattr(x, how)(axis=others))
    return _block_reduce(x, axis, granularity.block_size, how)


def _as_f64(value) -> np.ndarray:
    return np.asarray(value).astype(np.float64)


def _block_reduce(x, axis: int, block_size: int, how: str) -> np.ndarray:
    """``how`` over blocks of ``block_size`` along ``axis``; the last block may be short."""
    length = x.shape[axis]
    whole = length // block_size
    parts = []
    if whole:
        head = x[_along(x.ndim, axis, slice(0, whole * block_size))]
        blocked = head.reshape(x.shape[:axis] + (whole, block_size) + x.shape[axis + 1:])
        parts.append(getattr(blocked, how)(axis=axis + 1))
    if whole * block_size < length:
        tail = x[_along(x.ndim, axis, slice(whole * block_size, length))]
        parts.append(getattr(tail, how)(axis=axis, keepdims=True))
    reduced = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=axis)
    return _as_f64(reduced)


def _along(ndim: int, axis: int, index) -> tuple:
    key = [slice(None)] * ndim
    key[axis] = index
    return tuple(key)


def parameters(lo, hi, qtype: ElementType, symmetric: bool = False, scale_dtype=np.float32):
    """The scale (``scale_dtype``) and zero point (``qtype``'s dtype) for groups with range [lo, hi].

    ``lo`` and ``hi`` must be finite. Returns NumPy arrays of lo's shape.
    """
    lo = np.asarray(lo, np.float64)
    hi = np.asarray(hi, np.float64)
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
        raise ValueError("calibrate.parameters: the range must be finite (the tensor holds NaN or infinity)")
    absmax = np.maximum(np.abs(lo), np.abs(hi))
    if qtype.is_small_float:
        scale = storable_scale(absmax / qtype.max_finite, scale_dtype)
        return scale, np.zeros(lo.shape, qtype.dtype)
    if not qtype.is_integer:
        raise ValueError(f"calibrate.parameters: {qtype.onnx_name} is not a quantized type")
    qmin, qmax = qtype.qmin, qtype.qmax
    if symmetric:
        if qmin < 0:
            zero = 0
            scale = storable_scale(absmax / qmax, scale_dtype)
        else:
            zero = (qmax + 1) // 2
            scale = storable_scale(absmax / (qmax - zero), scale_dtype)
        return scale, np.full(lo.shape, zero, dtype=qtype.dtype)
    lo = np.minimum(lo, 0.0)
    hi = np.maximum(hi, 0.0)
    scale = storable_scale((hi - lo) / (qmax - qmin), scale_dtype)
    # The zero point is computed with the scale as stored, so that lo and hi land on qmin and qmax
    # up to one rounding step.
    zero = np.clip(np.rint(qmin - lo / scale.astype(np.float64)), qmin, qmax)
    return scale, zero.astype(np.int64).astype(qtype.dtype)


def storable_scale(scale: np.ndarray, scale_dtype) -> np.ndarray:
    scale_dtype = np.dtype(scale_dtype)
    scale = np.where(scale > 0, scale, 1.0)  # an all-zero group: any positive scale is exact
    stored = scale.astype(scale_dtype)
    tiny = np.asarray(_smallest_normal(scale_dtype), dtype=scale_dtype)
    return np.where(stored > 0, stored, tiny).astype(scale_dtype)


def _smallest_normal(dtype: np.dtype) -> float:
    import ml_dtypes

    return float(ml_dtypes.finfo(dtype).smallest_normal)
