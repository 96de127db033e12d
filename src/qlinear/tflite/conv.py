"""TFLite's quantized CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED, bit for bit, in its three CPU kernel
families, and the integer helpers of its requantization (QuantizeMultiplier, MultiplyByQuantizedMultiplier).

The public functions take NumPy arrays in TFLite's layouts (activations NHWC, CONV_2D weights OHWI,
DEPTHWISE_CONV_2D weights 1HWO, FULLY_CONNECTED weights [out, in]), validate them as the LiteRT
interpreter's Prepare does (a ValueError or TypeError naming the argument and the rule), compute the exact
accumulator on qlinear's integer core (:func:`qlinear.conv_integer`, :func:`qlinear.matmul_integer`), and
requantize it as the chosen kernel family does (:mod:`qlinear.reference.tflite_conv`). docs/tflite_conv.md
lists each family's arithmetic and where they differ from ONNX QLinearConv.
"""

from __future__ import annotations

import operator

import numpy as np

from qlinear import _validate
from qlinear.ops.qlinear_conv import conv_integer
from qlinear.ops.qlinear_matmul import matmul_integer
from qlinear.reference import tflite_conv as _plan
from qlinear.reference import tflite_requantize as _rq

__all__ = [
    "conv_2d",
    "depthwise_conv_2d",
    "fully_connected",
    "quantize_multiplier",
    "multiply_by_quantized_multiplier",
    "saturating_rounding_doubling_high_mul",
    "rounding_divide_by_pot",
    "KERNELS",
    "ACTIVATIONS",
]

KERNELS = _plan.KERNELS
ACTIVATIONS = _rq.ACTIVATIONS
PADDINGS = ("SAME", "VALID")
_ACTIVATION_TYPES = (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16))


# --------------------------------------------------------------------------------------------------------
# Integer helpers
# --------------------------------------------------------------------------------------------------------
def _integers(func, name, value, lo, hi) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype == np.bool_ or arr.dtype.kind not in "iu":
        raise TypeError(f"{func}: {name} must be integers, got dtype {arr.dtype}")
    if arr.size and (int(arr.min()) < lo or int(arr.max()) > hi):
        raise ValueError(f"{func}: {name} must lie in [{lo}, {hi}], got values in [{int(arr.min())}, {int(arr.max())}]")
    return arr.astype(np.int64)


def quantize_multiplier(real, *, single_rounding: bool = False) -> tuple[int, int]:
    """TFLite's ``QuantizeMultiplier``: ``real ~= multiplier * 2**(shift - 31)`` with an int32 multiplier.

    ``frexp`` splits ``real`` into ``q * 2**shift`` with q in [0.5, 1); ``multiplier = round(q * 2**31)``
    rounding half away from zero; a q that rounds up to 2**31 gives ``(2**30, shift + 1)``; a shift below -31
    (``real`` below about 2**-32) flushes to ``(0, 0)``, as does 0. ``single_rounding`` is the
    ``TFLITE_SINGLE_ROUNDING`` build, where a shift above 30 saturates to ``(2**31 - 1, 30)``.

    >>> quantize_multiplier(0.3)
    (1288490189, -1)
    >>> quantize_multiplier(0.25)     # 0.5 * 2**-1
    (1073741824, -1)
    """
    if isinstance(real, (bool, np.bool_)) or not isinstance(real, (int, float, np.integer, np.floating)):
        raise TypeError(f"quantize_multiplier: real must be a real number, got {type(real).__name__}")
    return _rq.quantize_multiplier(float(real), bool(single_rounding))


def multiply_by_quantized_multiplier(x, multiplier, shift, *, single_rounding: bool = False) -> np.ndarray:
    """TFLite's ``MultiplyByQuantizedMultiplier(int32 x, int32 multiplier, int shift)``, element-wise (int32).

    The default build rounds twice: ``RoundingDivideByPOT(SaturatingRoundingDoublingHighMul(x * 2**left,
    multiplier), right)`` with ``left = max(shift, 0)``, ``right = max(-shift, 0)`` (the first rounding half
    toward +infinity, the second half away from zero; ``x * 2**left`` wraps in int32 as in C++).
    ``single_rounding`` (``TFLITE_SINGLE_ROUNDING``): ``(x * multiplier + 2**(30 - shift)) >> (31 - shift)``,
    one rounding half toward +infinity.

    >>> multiply_by_quantized_multiplier(1, 1 << 30, -1)    # 1 * 0.25: 0.5 rounds up, then 0.5 away from 0
    array(1, dtype=int32)
    >>> multiply_by_quantized_multiplier(1, 1 << 30, -1, single_rounding=True)
    array(0, dtype=int32)
    """
    func = "multiply_by_quantized_multiplier"
    x = _integers(func, "x", x, _rq.INT32_MIN, _rq.INT32_MAX)
    multiplier = _integers(func, "multiplier", multiplier, 0, _rq.INT32_MAX)
    shift = _integers(func, "shift", shift, -31, 30)
    return np.array(_rq.multiply_by_quantized_multiplier(x, multiplier, shift, bool(single_rounding)), np.int32)


def saturating_rounding_doubling_high_mul(a, b) -> np.ndarray:
    """gemmlowp's ``SaturatingRoundingDoublingHighMul`` (ARM's VQRDMULH) of int32 values: ``a * b / 2**31``
    rounded half toward +infinity; ``INT32_MIN * INT32_MIN`` saturates to ``INT32_MAX``.

    >>> saturating_rounding_doubling_high_mul([1, -1, -3], 1 << 30)     # 0.5, -0.5, -1.5
    array([ 1,  0, -1], dtype=int32)
    """
    func = "saturating_rounding_doubling_high_mul"
    a = _integers(func, "a", a, _rq.INT32_MIN, _rq.INT32_MAX)
    b = _integers(func, "b", b, _rq.INT32_MIN, _rq.INT32_MAX)
    return np.array(_rq.saturating_rounding_doubling_high_mul(a, b), np.int32)


def rounding_divide_by_pot(x, exponent) -> np.ndarray:
    """gemmlowp's ``RoundingDivideByPOT``: int32 ``x / 2**exponent`` rounded half away from zero.

    >>> rounding_divide_by_pot([5, -5, -3], 1)
    array([ 3, -3, -2], dtype=int32)
    """
    func = "rounding_divide_by_pot"
    x = _integers(func, "x", x, _rq.INT32_MIN, _rq.INT32_MAX)
    exponent = _integers(func, "exponent", exponent, 0, 31)
    return np.array(_rq.rounding_divide_by_pot(x, exponent), np.int32)


# --------------------------------------------------------------------------------------------------------
# Argument validation
# --------------------------------------------------------------------------------------------------------
def _pair(func, name, value) -> tuple[int, int]:
    items = (value, value) if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else value
    try:
        pair = tuple(operator.index(v) for v in items if not isinstance(v, (bool, np.bool_)))
    except TypeError:
        raise TypeError(f"{func}: {name} must be an int or a pair of ints (height, width), got {value!r}") from None
    if len(pair) != 2 or len(tuple(items)) != 2:
        raise ValueError(f"{func}: {name} must be an int or a pair of ints (height, width), got {value!r}")
    if min(pair) < 1:
        raise ValueError(f"{func}: {name} must be positive (TFLite's Prepare requires > 0), got {pair}")
    return pair


def _tensor(func, name, value, ndim, dtypes) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        value = np.asarray(value)
    if value.dtype not in dtypes:
        raise TypeError(f"{func}: {name} must be " + " or ".join(str(d) for d in dtypes) + f", got dtype {value.dtype}")
    if ndim is not None and value.ndim != ndim:
        raise ValueError(f"{func}: {name} must have {ndim} dimensions, got shape {value.shape}")
    return value


def _scale(func, name, value, length=None) -> np.ndarray:
    """A float32 scale (0-d), or with ``length`` a scalar or 1-D per-channel vector of that length."""
    arr = np.asarray(value)
    if arr.dtype == np.bool_ or arr.dtype.kind not in "fiu":
        raise TypeError(f"{func}: {name} must be a real number (stored as float32), got dtype {arr.dtype}")
    if length is None or arr.size == 1:
        if arr.size != 1:
            raise ValueError(f"{func}: {name} must be a scalar (TFLite's activations are quantized per tensor), "
                             f"got shape {arr.shape}")
        arr = arr.reshape(())
    elif arr.shape != (length,):
        raise ValueError(f"{func}: {name} must be a scalar or a 1-D array of {length} elements (one per output "
                         f"channel), got shape {arr.shape}")
    with np.errstate(over="ignore", under="ignore"):
        arr = arr.astype(np.float32)
    if _validate.first_bad_scale(arr) is not None:
        raise ValueError(f"{func}: {name} must be finite and > 0 as a float32, got {arr.tolist()}")
    return arr


def _zero_point(func, name, value, dtype) -> int:
    if isinstance(value, (bool, np.bool_)) or np.ndim(value) != 0:
        raise TypeError(f"{func}: {name} must be an integer scalar, got {value!r}")
    try:
        zp = operator.index(value)
    except TypeError:
        raise TypeError(f"{func}: {name} must be an integer scalar, got {type(value).__name__}") from None
    info = np.iinfo(dtype)
    if not info.min <= zp <= info.max:
        raise ValueError(f"{func}: {name} must lie in [{info.min}, {info.max}] for {np.dtype(dtype)}, got {zp}")
    if np.dtype(dtype) == np.int16 and zp != 0:
        raise ValueError(f"{func}: {name} must be 0 for int16 activations (TFLite's 16x8 kernels are symmetric), "
                         f"got {zp}")
    return zp


def _weights_and_bias(func, x, w, bias, w_zero_point, out_channels, bias_required, int16_bias):
    """The rules shared by the three ops: weight type by activation type, weight zero point, bias type."""
    wanted = np.dtype(np.uint8) if x.dtype == np.uint8 else np.dtype(np.int8)
    if w.dtype != wanted:
        family = "legacy uint8" if x.dtype == np.uint8 else "int8 and 16x8"
        raise TypeError(f"{func}: w must be {wanted} for {x.dtype} activations (TFLite's {family} kernels), "
                        f"got {w.dtype}")
    w_zp = _zero_point(func, "w_zero_point", w_zero_point, w.dtype)
    if w.dtype == np.int8 and w_zp != 0:
        raise ValueError(f"{func}: w_zero_point must be 0 for int8 weights (TFLite's quantization spec; Prepare "
                         f"checks it), got {w_zp}")
    if bias is None:
        if bias_required:
            raise ValueError(f"{func}: bias is required (TFLite's CONV_2D Prepare rejects a node without bias)")
        return w_zp, None
    allowed = int16_bias if x.dtype == np.int16 else (np.dtype(np.int32),)
    bias = _tensor(func, "bias", bias, 1, allowed)
    if bias.shape != (out_channels,):
        raise ValueError(f"{func}: bias must have one element per output channel ({out_channels}), "
                         f"got shape {bias.shape}")
    return w_zp, bias


def _common(func, x, x_scale, x_zero_point, y_scale, y_zero_point, activation, kernel, single_rounding):
    _validate.choice(func, "kernel", kernel, KERNELS)  # None is no kernel: a TypeError, as in quantize
    _validate.choice(func, "activation", activation, ACTIVATIONS, optional=True)
    _validate.flag(func, "single_rounding", single_rounding)
    x_scale = _scale(func, "x_scale", x_scale)
    y_scale = _scale(func, "y_scale", y_scale)
    x_zp = _zero_point(func, "x_zero_point", x_zero_point, x.dtype)
    y_zp = _zero_point(func, "y_zero_point", y_zero_point, x.dtype)
    _rq.activation_range(activation, y_scale, y_zp, x.dtype)  # raises where Prepare fails
    return x_scale, y_scale, x_zp, y_zp


def _w_scale(func, w, w_scale, out_channels) -> np.ndarray:
    w_scale = _scale(func, "w_scale", w_scale, out_channels)
    if w_scale.ndim and out_channels > 1 and w.dtype == np.uint8:
        raise ValueError(f"{func}: per-channel w_scale needs int8 weights (TFLite quantizes uint8 weights per tensor)")
    return w_scale


def _padding(func, padding) -> str:
    if not isinstance(padding, str):
        raise TypeError(f"{func}: padding must be 'SAME' or 'VALID', got {type(padding).__name__}")
    if padding not in PADDINGS:
        raise ValueError(f"{func}: padding must be 'SAME' or 'VALID', got {padding!r}")
    return padding


def _conv_arguments(func, x, w, x_scale, x_zero_point, y_scale, y_zero_point, strides, padding, dilations,
                    activation, kernel, single_rounding):
    """The checks CONV_2D and DEPTHWISE_CONV_2D share: (x, w, x_scale, y_scale, x_zp, y_zp, strides, dilations,
    padding), validated."""
    x = _tensor(func, "x", x, 4, _ACTIVATION_TYPES)
    w = _tensor(func, "w", w, 4, (np.dtype(np.int8), np.dtype(np.uint8)))
    x_scale, y_scale, x_zp, y_zp = _common(func, x, x_scale, x_zero_point, y_scale, y_zero_point, activation,
                                           kernel, single_rounding)
    strides, dilations = _pair(func, "strides", strides), _pair(func, "dilations", dilations)
    padding = _padding(func, padding)
    if min(x.shape) < 1 or min(w.shape) < 1:
        raise ValueError(f"{func}: x and w must have no empty dimension, got shapes {x.shape} and {w.shape}")
    return x, w, x_scale, y_scale, x_zp, y_zp, strides, dilations, padding


def _geometry(func, in_hw, kernel_hw, strides, dilations, padding):
    """TFLite's ComputePaddingHeightWidth (tflite/kernels/padding.h): output size and (top, left, bottom,
    right) padding; SAME puts the odd unit at the bottom/right."""
    out, pads_begin, pads_end = [], [], []
    for size, k, s, d in zip(in_hw, kernel_hw, strides, dilations):
        extent = d * (k - 1) + 1
        n = (size + s - 1) // s if padding == "SAME" else (size - extent + s) // s
        if n < 1:
            raise ValueError(f"{func}: the dilated filter ({extent}) is larger than the input ({size}) with padding "
                             f"'VALID': the output would be empty")
        total = max(0, (n - 1) * s + extent - size)
        out.append(n)
        pads_begin.append(total // 2)
        pads_end.append(total - total // 2)
    return tuple(out), tuple(pads_begin) + tuple(pads_end)


# --------------------------------------------------------------------------------------------------------
# Exact accumulators on qlinear's integer core
# --------------------------------------------------------------------------------------------------------
def _by_byte_planes(accumulate, x, x_zp) -> np.ndarray:
    """``accumulate(x, x_zp)`` (int64), and for int16 x, whose 8-bit operands the integer core takes, the sum
    ``256 * accumulate(high, 0) + accumulate(low, 0)`` over x = 256 * high + low (int8 high byte, uint8 low
    byte; int16 activations have zero point 0)."""
    if x.dtype != np.int16:
        return accumulate(x, x_zp)
    return accumulate((x >> 8).astype(np.int8), 0) * 256 + accumulate((x & 0xFF).astype(np.uint8), 0)


def _conv_accumulate(x, w_oihw, w_zp, x_zp, *, group, strides, dilations, pads) -> np.ndarray:
    """Exact NHWC int64 accumulator (without bias) of an NHWC x and an OIHW w."""

    def one(plane, plane_zp):
        x_nchw = np.ascontiguousarray(plane.transpose(0, 3, 1, 2))
        acc = conv_integer(x_nchw, w_oihw, np.array(plane_zp, plane.dtype), np.array(w_zp, w_oihw.dtype),
                           group=group, strides=strides, dilations=dilations, pads=pads)
        return acc.transpose(0, 2, 3, 1).astype(np.int64)

    return _by_byte_planes(one, x, x_zp)


def _matmul_accumulate(x2, w, w_zp, x_zp) -> np.ndarray:
    def one(plane, plane_zp):
        return matmul_integer(plane, w.T, np.array(plane_zp, plane.dtype), np.array(w_zp, w.dtype)).astype(np.int64)

    return _by_byte_planes(one, x2, x_zp)


def _with_bias(acc, bias):
    return acc if bias is None else acc + bias.astype(np.int64)


# --------------------------------------------------------------------------------------------------------
# The operators
# --------------------------------------------------------------------------------------------------------
def conv_2d(x, w, bias, x_scale, x_zero_point, w_scale, y_scale, y_zero_point, *, strides=(1, 1),
            padding="VALID", dilations=(1, 1), activation=None, kernel="reference", w_zero_point=0,
            single_rounding=False) -> np.ndarray:
    """TFLite CONV_2D, quantized: ``x`` (N, H, W, C) int8, uint8 or int16; ``w`` (O, KH, KW, C / groups)
    int8 (uint8 for uint8 ``x``); ``bias`` (O,) int32 (int32 or int64 for int16 ``x``), required.

    Returns the (N, OH, OW, O) output of ``x``'s type. ``w_scale`` is a scalar or one scale per output
    channel (int8 weights); ``w_zero_point`` is 0 for int8 weights, any uint8 for uint8 weights. A filter
    with fewer input channels than ``x`` is a grouped convolution (``groups = C / w.shape[3]``).
    ``padding`` is "SAME" or "VALID"; ``strides`` and ``dilations`` are (height, width) or one int;
    ``activation`` is None, "relu", "relu6" or "relu_n1_to_1" (its clamp computed from ``y_scale`` and
    ``y_zero_point`` as the kernel family does). ``kernel``: "reference", "optimized" or "xnnpack" (see
    docs/tflite_conv.md). ``single_rounding`` emulates a build with ``TFLITE_SINGLE_ROUNDING=1`` (the
    installed wheels are built without it).
    """
    func = "conv_2d"
    x, w, x_scale, y_scale, x_zp, y_zp, strides, dilations, padding = _conv_arguments(
        func, x, w, x_scale, x_zero_point, y_scale, y_zero_point, strides, padding, dilations, activation, kernel,
        single_rounding)
    out_channels, channels = w.shape[0], x.shape[3]
    if channels % w.shape[3]:
        raise ValueError(f"{func}: x's channels ({channels}) must be a multiple of w.shape[3] ({w.shape[3]}), "
                         "the filter's input channels")
    groups = channels // w.shape[3]
    if out_channels % groups:
        raise ValueError(f"{func}: w.shape[0] ({out_channels}) must be a multiple of the number of groups ({groups})")
    w_zp, bias = _weights_and_bias(func, x, w, bias, w_zero_point, out_channels, True,
                                   (np.dtype(np.int32), np.dtype(np.int64)))
    w_scale = _w_scale(func, w, w_scale, out_channels)
    _, pads = _geometry(func, x.shape[1:3], w.shape[1:3], strides, dilations, padding)
    acc = _conv_accumulate(x, w.transpose(0, 3, 1, 2), w_zp, x_zp, group=groups, strides=strides,
                           dilations=dilations, pads=pads)
    return _plan.requantize("CONV_2D", kernel, _with_bias(acc, bias), x_dtype=x.dtype, x_scale=x_scale,
                            w_scale=w_scale, y_scale=y_scale, y_zero_point=y_zp, activation=activation,
                            bias_dtype=bias.dtype, has_bias=True, groups=groups, single_rounding=bool(single_rounding))


def depthwise_conv_2d(x, w, bias, x_scale, x_zero_point, w_scale, y_scale, y_zero_point, *, strides=(1, 1),
                      padding="VALID", dilations=(1, 1), depth_multiplier=None, activation=None,
                      kernel="reference", w_zero_point=0, single_rounding=False) -> np.ndarray:
    """TFLite DEPTHWISE_CONV_2D, quantized: ``x`` (N, H, W, C); ``w`` (1, KH, KW, C * depth_multiplier)
    (output channel ``c * depth_multiplier + m`` reads input channel ``c``); ``bias`` (O,) int32 (int64 for
    int16 ``x``) or None. ``depth_multiplier`` defaults to ``w.shape[3] // C`` and must equal it when given.
    The other arguments are as for :func:`conv_2d`. Without bias only ``kernel="reference"`` runs: the
    optimized 8-bit kernels (where XNNPACK, declining the node, leaves it) crash the interpreter.
    """
    func = "depthwise_conv_2d"
    x, w, x_scale, y_scale, x_zp, y_zp, strides, dilations, padding = _conv_arguments(
        func, x, w, x_scale, x_zero_point, y_scale, y_zero_point, strides, padding, dilations, activation, kernel,
        single_rounding)
    if w.shape[0] != 1:
        raise ValueError(f"{func}: w must have shape (1, KH, KW, O), got {w.shape}")
    out_channels, channels = w.shape[3], x.shape[3]
    if out_channels % channels:
        raise ValueError(f"{func}: w.shape[3] ({out_channels}) must be a multiple of x's channels ({channels})")
    if depth_multiplier is not None:
        if isinstance(depth_multiplier, (bool, np.bool_)) or not isinstance(depth_multiplier, (int, np.integer)):
            raise TypeError(f"{func}: depth_multiplier must be None or an int, got {type(depth_multiplier).__name__}")
        dm = int(depth_multiplier)
        if dm * channels != out_channels:
            raise ValueError(f"{func}: depth_multiplier ({dm}) times x's channels ({channels}) must equal "
                             f"w.shape[3] ({out_channels})")
    w_zp, bias = _weights_and_bias(func, x, w, bias, w_zero_point, out_channels, False, (np.dtype(np.int64),))
    if bias is None and kernel != "reference" and x.dtype != np.int16:
        raise ValueError(f"{func}: kernel={kernel!r} needs a bias: the optimized 8-bit depthwise kernels copy the "
                         "bias unconditionally and crash without one (XNNPACK declines such a node and leaves it "
                         "to them); only kernel='reference' runs a DEPTHWISE_CONV_2D without bias")
    w_scale = _w_scale(func, w, w_scale, out_channels)
    _, pads = _geometry(func, x.shape[1:3], w.shape[1:3], strides, dilations, padding)
    w_oihw = w.reshape(w.shape[1:]).transpose(2, 0, 1)[:, None]
    acc = _conv_accumulate(x, w_oihw, w_zp, x_zp, group=channels, strides=strides, dilations=dilations, pads=pads)
    return _plan.requantize("DEPTHWISE_CONV_2D", kernel, _with_bias(acc, bias), x_dtype=x.dtype, x_scale=x_scale,
                            w_scale=w_scale, y_scale=y_scale, y_zero_point=y_zp, activation=activation,
                            bias_dtype=None if bias is None else bias.dtype, has_bias=bias is not None,
                            single_rounding=bool(single_rounding))


def fully_connected(x, w, bias, x_scale, x_zero_point, w_scale, y_scale, y_zero_point, *, activation=None,
                    kernel="reference", w_zero_point=0, single_rounding=False,
                    reference_double_requantize=True) -> np.ndarray:
    """TFLite FULLY_CONNECTED, quantized: ``x`` (..., IN) int8, uint8 or int16; ``w`` (OUT, IN); ``bias``
    (OUT,) int32 (int32 or int64 for int16 ``x``) or None. Returns (..., OUT) of ``x``'s type (TFLite's
    ``keep_num_dims=True``; with False the interpreter returns the same values reshaped to 2-D).

    ``reference_double_requantize`` (``kernel="reference"`` only): the reference kernel requantizes in double
    precision, ``round(acc * x_scale * w_scale / y_scale)`` halves away from zero, since LiteRT 9213607
    (2025-04-14; the installed ai-edge-litert 2.3.0 and tensorflow 2.21 behave so); False gives the
    fixed-point MultiplyByQuantizedMultiplier of earlier releases. The other arguments are as for
    :func:`conv_2d`.
    """
    func = "fully_connected"
    x = _tensor(func, "x", x, None, _ACTIVATION_TYPES)
    w = _tensor(func, "w", w, 2, (np.dtype(np.int8), np.dtype(np.uint8)))
    x_scale, y_scale, x_zp, y_zp = _common(func, x, x_scale, x_zero_point, y_scale, y_zero_point, activation,
                                           kernel, single_rounding)
    _validate.flag(func, "reference_double_requantize", reference_double_requantize)
    if x.ndim < 1 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"{func}: x's last dimension must equal w.shape[1] ({w.shape[1]}, the input depth), got "
                         f"x of shape {x.shape}")
    out_channels = w.shape[0]
    w_zp, bias = _weights_and_bias(func, x, w, bias, w_zero_point, out_channels, False,
                                   (np.dtype(np.int32), np.dtype(np.int64)))
    w_scale = _w_scale(func, w, w_scale, out_channels)
    x2 = x.reshape(-1, w.shape[1])
    if x2.shape[0] == 0 or out_channels == 0:
        return np.zeros(x.shape[:-1] + (out_channels,), x.dtype)
    acc = _matmul_accumulate(x2, w, w_zp, x_zp)
    y = _plan.requantize("FULLY_CONNECTED", kernel, _with_bias(acc, bias), x_dtype=x.dtype, x_scale=x_scale,
                         w_scale=w_scale, y_scale=y_scale, y_zero_point=y_zp, activation=activation,
                         bias_dtype=None if bias is None else bias.dtype, has_bias=bias is not None,
                         single_rounding=bool(single_rounding),
                         reference_double_requantize=bool(reference_double_requantize))
    return y.reshape(x.shape[:-1] + (out_channels,))
