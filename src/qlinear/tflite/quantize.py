"""TFLite QUANTIZE (float32 -> int8/uint8/int16) and DEQUANTIZE: arguments, validation, dispatch.

The public functions normalise the arguments the way a TFLite model stores them (a float32 scale and an
integer zero point per tensor, or one per channel along ``quantized_dimension``), reject what the LiteRT
interpreter rejects (or crashes on) with a ValueError naming the rule, and hand the data to the kernel
family's function in `qlinear.reference.tflite_quantize`. Which function a family runs for a tensor is
decided here, as the interpreter decides it:

========================  ==================  =====================  ===================================
tensor                    kernel="reference"  kernel="optimized"     kernel="xnnpack" (AUTO resolver)
========================  ==================  =====================  ===================================
per-tensor int8 / uint8   reference           optimized (8-blocks)   XNNPACK convert
per-tensor int16          reference           optimized (8-blocks)   optimized (the delegate declines)
per-channel               reference per-ch.   reference per-ch.      reference per-ch. (declined)
========================  ==================  =====================  ===================================
"""

from __future__ import annotations

import numpy as np

from qlinear import _validate, dtypes
from qlinear.reference import tflite_quantize as _ref

__all__ = ["quantize", "dequantize", "KERNELS"]

KERNELS = ("reference", "optimized", "xnnpack")
# The integer types of TFLite QUANTIZE's float32 input / DEQUANTIZE's output that qlinear.tflite covers.
_TYPES = {name: dtypes.get(name) for name in ("int8", "uint8", "int16")}
_BY_DTYPE = {t.dtype: t for t in _TYPES.values()}
_XNNPACK_TYPES = ("int8", "uint8")  # the delegate's qs8 / qu8 converts; it declines int16 nodes
_FLT_MIN = float(np.finfo(np.float32).tiny)


# ---------------------------------------------------------------------------------------------
# Argument normalisation
# ---------------------------------------------------------------------------------------------
def _output_type(func, value) -> dtypes.ElementType:
    t = dtypes.resolve_dtype(value, "dtype", func)
    if t.onnx_name not in _TYPES:
        raise ValueError(f"{func}: dtype must be int8, uint8 or int16 (the types of TFLite's float32 QUANTIZE that "
                         f"qlinear.tflite implements), got {t.name}")
    return t


def _real_array(func, argument, value) -> np.ndarray:
    arr = _validate.as_array(func, argument, value, "a real array-like")
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"{func}: {argument} must hold real numbers (it is converted to float32), got dtype {arr.dtype}")
    return arr


def _axis(func, value, ndim: int) -> int | None:
    if value is None:
        return None
    axis = _validate.integer(func, "axis", value, "None or an int")
    if not -ndim <= axis < ndim:
        raise ValueError(f"{func}: axis (the quantized dimension) must be in [-{ndim}, {ndim}) for an input of "
                         f"{ndim} dimensions, got {axis}")
    return axis % ndim


def _parameters(func, shape, axis, scale, zero_point, t: dtypes.ElementType):
    """(scale float32 array, zero point int64 array, axis or None for per-tensor), TFLite's rules.

    A tensor is per-channel when it has more than one scale (``IsQuantizedPerChannel``: ``scale->size >
    1``), so one scale is per-tensor even with an axis; per-channel scales number
    ``shape[quantized_dimension]``; one zero point beside several scales is broadcast, as the kernels
    do (``zero_point->size != scale->size``).
    """
    with np.errstate(over="ignore"):  # a scale beyond float32 becomes inf, refused below
        s = _real_array(func, "scale", scale).astype(np.float32)  # the flatbuffer stores float32 scales
    if s.ndim > 1:
        raise ValueError(f"{func}: scale must be a scalar or a 1-D array, got shape {s.shape}")
    s = s.reshape(-1)
    zp_in = np.asarray(zero_point)
    if zp_in.dtype == object and all(isinstance(v, int) and not isinstance(v, bool) for v in zp_in.ravel()):
        # Python ints beyond int64 (NumPy keeps them as objects): clipped, they fail the range check below
        zp_in = np.array([min(max(v, -(2**62)), 2**62) for v in zp_in.ravel()], np.int64).reshape(zp_in.shape)
    if zp_in.dtype.kind not in "iu":
        raise TypeError(f"{func}: zero_point must be an integer or an array of integers, got "
                        f"{zp_in.dtype if isinstance(zero_point, np.ndarray) else type(zero_point).__name__}")
    if zp_in.ndim > 1:
        raise ValueError(f"{func}: zero_point must be a scalar or a 1-D array, got shape {zp_in.shape}")
    lo, hi = t.qmin, t.qmax
    outside = (zp_in < lo) | (zp_in > hi)
    if outside.any():
        raise ValueError(f"{func}: zero_point must lie in the range of {t.name}, [{lo}, {hi}] (TFLite's quantization "
                         f"spec; the XNNPACK delegate crashes on others), got {int(zp_in[outside].ravel()[0])}")
    zp = zp_in.astype(np.int64).reshape(-1)
    if s.size == 0 or zp.size == 0:
        raise ValueError(f"{func}: scale and zero_point must not be empty")
    if s.size > 1:
        if axis is None:
            raise ValueError(f"{func}: {s.size} scales given but no axis: per-channel quantization needs axis "
                             "(the tensor's quantized_dimension)")
        if s.size != shape[axis]:
            raise ValueError(f"{func}: per-channel scale must have shape[axis] = {shape[axis]} values (axis={axis}), "
                             f"got {s.size}")
        if zp.size != 1 and zp.size != s.size:
            raise ValueError(f"{func}: zero_point must have one value or as many as scale ({s.size}), got {zp.size}")
        zp = np.broadcast_to(zp, s.shape)
    else:
        if zp.size != 1:
            raise ValueError(f"{func}: one scale (per-tensor) needs one zero_point, got {zp.size}")
        axis = None
    bad = _validate.first_bad_scale(s)
    if bad is not None:
        raise ValueError(f"{func}: scale must be positive and finite once rounded to float32 (TFLite's quantization "
                         f"spec), got {float(s[bad])!r}")
    return s, zp, axis


def _check_xnnpack_scale(func, s: np.ndarray, kernel: str, delegated: bool):
    if kernel == "xnnpack" and delegated and float(s[0]) < _FLT_MIN:
        raise ValueError(f"{func}: kernel='xnnpack' needs a normal float32 scale (>= 2**-126): the XNNPACK delegate "
                         f"rejects a subnormal scale and the interpreter then fails; got {float(s[0])!r}")


# ---------------------------------------------------------------------------------------------
# QUANTIZE
# ---------------------------------------------------------------------------------------------
def quantize(x, scale, zero_point, dtype, *, axis=None, kernel: str = "reference", strict: bool = False) -> np.ndarray:
    """TFLite QUANTIZE from float32 to ``dtype`` (int8, uint8, int16), as the chosen kernel family computes it.

    ``x``: a real array (converted to float32, the op's input type). ``scale``/``zero_point``: one value
    (per-tensor), or 1-D arrays along ``axis`` (per-channel; the tensor's ``quantized_dimension``). Scales
    are rounded to float32 as a model stores them and must be positive and finite; zero points must lie in
    ``dtype``'s range.

    ``kernel``: "reference" (``reference_ops::AffineQuantize``: ``round_half_away(fl32(x / s)) + zp``),
    "optimized" (``optimized_ops::AffineQuantize`` of the x86 wheels: ``rint(fl32(x * fl32(1/s))) + zp`` on
    the first ``8 * (x.size // 8)`` elements in C order, ``round_half_away(double(x) / s) + zp`` on the
    rest, so the result of one element depends on the tensor's size) or "xnnpack" (the default
    interpreter: XNNPACK's convert, ``clamp(rint(fl32(x * fl32(1/s))) + zp)`` with denormals read as zero,
    for per-tensor int8/uint8; the optimized kernel for int16). Per-channel tensors run
    ``reference_ops::PerChannelQuantize`` in every family.

    NaN, infinities and quotients beyond int32 give what the kernel gives on x86 (the reference and
    optimized kernels: INT32_MIN, plus the zero point with int32 wrap-around, clamped; XNNPACK:
    saturation, NaN -> the type's maximum). ``strict=True`` gives the documented
    ``clamp(round(x / s) + zp)`` for those instead: saturation, and a ValueError for NaN. Returns a new
    array of ``x``'s shape and ``dtype``.
    """
    func = "tflite.quantize"
    arr = _real_array(func, "x", x)
    x32 = arr.astype(np.float32, copy=False)
    t = _output_type(func, dtype)
    kernel = _validate.choice(func, "kernel", kernel, KERNELS)
    strict = _validate.flag(func, "strict", strict)
    ax = _axis(func, axis, x32.ndim)
    s, zp, ax = _parameters(func, x32.shape, ax, scale, zero_point, t)
    delegated = ax is None and t.onnx_name in _XNNPACK_TYPES
    _check_xnnpack_scale(func, s, kernel, delegated)
    if strict and np.isnan(x32).any():
        raise ValueError(f"{func}: x contains NaN, which has no quantized value (strict=True)")

    if ax is not None:
        return _ref.per_channel_quantize(x32, s, zp, ax, t.dtype, strict)
    scale0, zp0 = s[0], int(zp[0])
    if kernel == "reference":
        return _ref.affine_quantize(x32, scale0, zp0, t.dtype, strict)
    if kernel == "xnnpack" and delegated:
        return _ref.xnnpack_quantize(x32, scale0, zp0, t.dtype, strict)
    return _ref.optimized_affine_quantize(x32, scale0, zp0, t.dtype, strict)


# ---------------------------------------------------------------------------------------------
# DEQUANTIZE
# ---------------------------------------------------------------------------------------------
def dequantize(q, scale, zero_point, *, axis=None, kernel: str = "reference") -> np.ndarray:
    """TFLite DEQUANTIZE of an int8, uint8 or int16 array to float32, as the chosen kernel family computes it.

    ``q``'s dtype is the tensor's type. ``scale``/``zero_point`` and ``axis`` as for `quantize`.

    ``kernel``: "reference" (``fl32(s * (q - zp))``, the product exact in double), "optimized"
    (``optimized_ops::Dequantize`` on x86: ``fl32(fl32(q * s) + fl32(-zp * s))`` on the first
    ``8 * (q.size // 8)`` elements in C order, the reference formula on the rest) or "xnnpack" (XNNPACK's
    ``fl32(fl32(q - zp) * s)``, equal to the reference, for per-tensor int8/uint8; the optimized kernel for
    int16). Per-channel tensors (uint8 and int8 only) run ``reference_ops::PerChannelDequantize`` in every
    family. int16 needs zero_point 0 (DEQUANTIZE's Prepare). Returns a new float32 array of ``q``'s shape.
    """
    func = "tflite.dequantize"
    if not hasattr(q, "dtype"):
        raise TypeError(f"{func}: q must be an array of int8, uint8 or int16 (its dtype is the tensor's type), "
                        f"got {type(q).__name__}")
    q = np.asarray(q)
    if q.dtype not in _BY_DTYPE:
        raise TypeError(f"{func}: q must have dtype int8, uint8 or int16, got {q.dtype}")
    t = _BY_DTYPE[q.dtype]
    kernel = _validate.choice(func, "kernel", kernel, KERNELS)
    ax = _axis(func, axis, q.ndim)
    s, zp, ax = _parameters(func, q.shape, ax, scale, zero_point, t)
    if t.onnx_name == "int16" and (zp != 0).any():
        raise ValueError(f"{func}: an int16 input needs zero_point 0 (TFLite DEQUANTIZE's Prepare: "
                         f"input->params.zero_point == 0), got {int(zp[zp != 0][0])}")
    if ax is not None and t.onnx_name == "int16":
        raise ValueError(f"{func}: per-channel DEQUANTIZE takes uint8 and int8 only (int16 fails in TFLite's "
                         "Eval: 'Type 7 not supported for per-channel')")
    delegated = ax is None and t.onnx_name in _XNNPACK_TYPES
    _check_xnnpack_scale(func, s, kernel, delegated)

    if ax is not None:
        return _ref.per_channel_dequantize(q, s, zp, ax)
    scale0, zp0 = s[0], int(zp[0])
    if kernel == "reference":
        return _ref.dequantize(q, scale0, zp0)
    if kernel == "xnnpack" and delegated:
        return _ref.xnnpack_dequantize(q, scale0, zp0)
    return _ref.optimized_dequantize(q, scale0, zp0)
