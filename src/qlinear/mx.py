"""Microscaling formats: MXFP8, MXFP6, MXFP4, MXINT8 (OCP MX v1.0) and NVFP4.

    >>> import numpy as np, qlinear.mx as mx
    >>> x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
    >>> codes, scales = mx.quantize(x, "mxfp4")
    >>> codes.dtype.name, scales.dtype.name, scales.shape
    ('float4_e2m1fn', 'float8_e8m0fnu', (2, 1))
    >>> float(scales[0, 0])                 # floor(log2(1)) - 2: the OCP rule
    0.25
    >>> y = mx.dequantize(codes, scales)
    >>> float(y[0, 0]), float(y[1, 31])     # 1.0 / 0.25 = 4 is an E2M1 value
    (-1.0, 1.0)
    >>> codes, block_scales, g = mx.quantize(x, "nvfp4")
    >>> block_scales.shape, g.dtype.name
    ((2, 2), 'float32')

Blocks run along ``axis`` (32 elements, 16 for NVFP4); a partial last block is allowed, as ONNX's
blocked DequantizeLinear allows it. The rules for zeros, subnormals, Inf and NaN are in
docs/semantics.md ("Microscaling").
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from . import dask_adapter
from .dask_adapter import is_dask_array
from .kernels import mx as _kernels
from .reference import mx as ref
from .reference.mx import FORMATS, NVFP4_RULES, SCALE_RULES, MXFormat

DEFAULT_SCALE_RULE = "floor"  # OCP MX v1.0's

__all__ = ["FORMATS", "SCALE_RULES", "NVFP4_RULES", "MXFormat", "quantize", "dequantize", "onnx_scales", "format_of"]

_INPUT_TYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float64))


def _format(fmt, function: str) -> MXFormat:
    if isinstance(fmt, MXFormat):
        return fmt
    if not isinstance(fmt, str):
        raise TypeError(f"{function}: fmt must be a format name such as 'mxfp4', got {type(fmt).__name__}")
    try:
        return FORMATS[fmt.lower()]
    except KeyError:
        raise ValueError(f"{function}: fmt={fmt!r} is not a microscaling format (known: {', '.join(FORMATS)})") from None


def _axis(axis, ndim: int, argument: str, function: str) -> int:
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{function}: {argument} must be an int, got {axis!r}")
    if ndim == 0:
        raise ValueError(f"{function}: x must have at least one dimension to block along")
    if not -ndim <= axis < ndim:
        raise ValueError(f"{function}: {argument}={axis} is out of range for an array of {ndim} dimensions")
    return int(axis) % ndim


def _moved(a: np.ndarray, source: int, destination: int) -> np.ndarray:
    """np.moveaxis, skipped when the blocking axis is already the last (about 10 us a call on small arrays)."""
    if source % a.ndim == destination % a.ndim:
        return a
    return np.moveaxis(a, source, destination)


def _lazy(x, function: str):
    """A dask array, kept lazy; its sizes must be known (a chunk's blocks are found from them)."""
    if any(np.isnan(d) for d in x.shape):
        raise ValueError(f"{function}: a dask array with chunks of unknown size; call compute_chunk_sizes() first")
    return x


def _float32(x, function: str) -> np.ndarray:
    x = _lazy(x, function) if is_dask_array(x) else np.asarray(x)
    if x.dtype not in _INPUT_TYPES:
        raise TypeError(f"{function}: x must be float32, float16, bfloat16 or float64, got {x.dtype}")
    # float16/bfloat16 widen exactly; float64 is rounded to float32 (nearest even) first: the formats
    # are defined on float32 inputs.
    return x.astype(np.float32, copy=False)


def _global_scale(value, function: str):
    lazy = is_dask_array(value)  # the tensor scale of a dask quantize: a 0-d dask array, left lazy
    g = value if lazy else np.asarray(value)
    if g.size != 1 or g.dtype != np.float32:
        raise TypeError(f"{function}: global_scale must be one float32 value, got {g.dtype} of shape {g.shape}")
    return g.reshape(()) if lazy else np.float32(g.reshape(()))


def quantize(x, fmt: str, axis: int = -1, scale_rule: str | None = None, global_scale=None):
    """Quantize ``x`` to a microscaling format in blocks along ``axis``.

    MX formats ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4", "mxint8") return
    ``(codes, scales)``: codes of the element type (int8 for MXINT8, whose value is code * 2^-6 *
    scale), x's shape; scales float8_e8m0fnu, x's shape with ``axis`` divided by 32 (rounded up).
    ``scale_rule`` is "floor" (the default: OCP MX v1.0), "ceil" (the block maximum never clips:
    cuBLAS, CUDA's e8m0 casts, torchao RCEIL) or "even" (torchao EVEN).

    "nvfp4" returns ``(codes, block_scales, global_scale)``: float4_e2m1fn codes, float8_e4m3fn block
    scales (blocks of 16) and a 0-d float32 tensor scale amax / (448 * 6); the codes are rounded
    against the stored (rounded) block scale times the tensor scale, by exact comparison with the
    midpoints (ties to even). ``scale_rule="modelopt"`` gives NVFP4 as TensorRT Model Optimizer 0.47
    computes it instead, bit for bit (block scale amax / float32(6 * g), clamped into [2^-9, 448];
    codes from the float32 quotient x / d: docs/mx.md). ``global_scale`` (NVFP4 only; one positive,
    finite float32 value) gives the tensor scale instead, as for activations quantized with a calibrated
    amax: x is read once instead of twice, and block scales that would exceed 448 saturate there (their
    codes at 6).
    """
    function = "qlinear.mx.quantize"
    f = _format(fmt, function)
    x = _float32(x, function)
    axis = _axis(axis, x.ndim, "axis", function)
    if f.name == "nvfp4":
        if scale_rule is not None and scale_rule not in NVFP4_RULES:
            raise ValueError(f"{function}: nvfp4's scale_rule is None (the exact rule) or one of "
                             f"{', '.join(NVFP4_RULES)}, got {scale_rule!r}")
        if global_scale is not None:
            global_scale = _global_scale(global_scale, function)
            if is_dask_array(global_scale):
                raise TypeError(
                    f"{function}: global_scale must be a float32 value, not a dask array (compute it first)")
            if not (np.isfinite(global_scale) and global_scale > 0):
                raise ValueError(f"{function}: global_scale must be positive and finite, got {global_scale!r}")
    elif global_scale is not None:
        raise ValueError(f"{function}: global_scale is NVFP4's tensor scale; {f.name} takes none")
    elif scale_rule is None:
        scale_rule = DEFAULT_SCALE_RULE
    elif scale_rule not in SCALE_RULES:
        raise ValueError(f"{function}: scale_rule must be one of {', '.join(SCALE_RULES)}, got {scale_rule!r}")
    if is_dask_array(x):  # lazily, chunk by chunk, each chunk through this function
        return dask_adapter.mx_quantize(quantize, x, f, axis, scale_rule, global_scale, ref.nvfp4_amax,
                                        ref.nvfp4_scale_from_amax)
    moved = _moved(x, axis, -1)
    # the kernels (qlinear.kernels.mx), bit-identical to the reference, which runs when they are switched off
    # (and for the few inputs a kernel leaves to it)
    if f.name == "nvfp4":
        result = _kernels.quantize_nvfp4(moved, global_scale, scale_rule)
        codes, scales, g = result if result is not None else ref.quantize_nvfp4(moved, global_scale, scale_rule)
        return _moved(codes, -1, axis), _moved(scales, -1, axis), np.asarray(g, np.float32)
    result = _kernels.quantize_mx(moved, f, scale_rule)
    codes, scales = result if result is not None else ref.quantize_mx(moved, f, scale_rule)
    return _moved(codes, -1, axis), _moved(scales, -1, axis)


def format_of(codes, scales) -> MXFormat:
    """The format a (codes, scales) pair is in, from their dtypes."""
    function = "qlinear.mx.dequantize"
    codes, scales = (a if is_dask_array(a) else np.asarray(a) for a in (codes, scales))
    if scales.dtype == np.dtype(ml_dtypes.float8_e4m3fn):
        if codes.dtype != np.dtype(ml_dtypes.float4_e2m1fn):
            raise TypeError(f"{function}: float8_e4m3fn block scales are NVFP4's, whose codes are float4_e2m1fn, got {codes.dtype}")
        return FORMATS["nvfp4"]
    if scales.dtype != np.dtype(ml_dtypes.float8_e8m0fnu):
        raise TypeError(f"{function}: scales must be float8_e8m0fnu (MX) or float8_e4m3fn (NVFP4), got {scales.dtype}")
    for f in FORMATS.values():
        if f.name != "nvfp4" and f.element.dtype == codes.dtype:
            return f
    known = ", ".join(f.element.dtype.name for f in FORMATS.values() if f.name != "nvfp4")
    raise TypeError(f"{function}: codes of dtype {codes.dtype} are no MX element type (known: {known})")


def dequantize(codes, scales, axis: int = -1, global_scale=None) -> np.ndarray:
    """float32 values of MX or NVFP4 codes; the format follows from the dtypes (e8m0 scales: MX, the
    element type from the codes; float8_e4m3fn block scales: NVFP4, which needs ``global_scale``).

    NVFP4 is computed as its ONNX graph computes it: codes * float32(float32(block scale) * global).
    """
    function = "qlinear.mx.dequantize"
    lazy = is_dask_array(codes)
    codes = _lazy(codes, function) if lazy else np.asarray(codes)
    # dask scales (or tensor scale) beside NumPy codes are small: computed here
    scales = _lazy(scales, function) if lazy and is_dask_array(scales) else np.asarray(scales)
    f = format_of(codes, scales)
    axis = _axis(axis, codes.ndim, "axis", function)
    expected = list(codes.shape)
    expected[axis] = -(-codes.shape[axis] // f.block_size)
    if scales.shape != tuple(expected):
        raise ValueError(
            f"{function}: scales has shape {scales.shape}; codes of shape {codes.shape} in blocks of {f.block_size} "
            f"along axis {axis} need {tuple(expected)}")
    if f.name == "nvfp4":
        if global_scale is None:
            raise ValueError(f"{function}: NVFP4 codes need global_scale (the float32 tensor scale quantize returned)")
        g = _global_scale(global_scale, function)
        if is_dask_array(g) and not lazy:
            g = np.float32(np.asarray(g))
    elif global_scale is not None:
        raise ValueError(f"{function}: global_scale is NVFP4's; {f.name} codes take none")
    if lazy:  # lazily, chunk by chunk, each chunk through this function
        return dask_adapter.mx_dequantize(dequantize, codes, scales, f, axis, g if f.name == "nvfp4" else None)
    codes_last, scales_last = _moved(codes, axis, -1), _moved(scales, axis, -1)
    if f.name == "nvfp4":
        y = _kernels.dequantize_nvfp4(codes_last, scales_last, g)
        if y is None:
            y = ref.dequantize_nvfp4(codes_last, scales_last, g)
    else:
        y = _kernels.dequantize_mx(codes_last, scales_last, f)
        if y is None:
            y = ref.dequantize_mx(codes_last, scales_last, f)
    return _moved(y, -1, axis)


def onnx_scales(codes, scales, fmt) -> tuple[np.ndarray, np.ndarray]:
    """(codes, scales) as ONNX's DequantizeLinear takes them: y = codes * scale.

    Only MXINT8 changes: its implicit 2^-6 is folded into the E8M0 scale (exponent - 6). A block
    whose exponent is below -121 cannot take the fold (2^-127 is E8M0's smallest); ``ValueError``
    names how many, since such weights (a block maximum under 2^-121) are better left unquantized."""
    f = _format(fmt, "qlinear.mx.onnx_scales")
    if not f.is_int:
        return np.asarray(codes), np.asarray(scales)
    e, nan = ref.exponents_from_e8m0(scales)
    low = (e - ref.MXINT8_FRACTION_BITS < ref.E8M0_MIN_EXPONENT) & ~nan
    if low.any():
        raise ValueError(
            f"qlinear.mx.onnx_scales: {int(low.sum())} MXINT8 block(s) have a scale below 2^-121, which "
            "ONNX's E8M0 scale cannot hold once the implicit 2^-6 is folded in")
    return np.asarray(codes), ref.e8m0_from_exponents(e - ref.MXINT8_FRACTION_BITS, nan)
