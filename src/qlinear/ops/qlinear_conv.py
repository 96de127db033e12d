"""ONNX QLinearConv-10 and ConvInteger-10: arguments, attribute and shape rules, geometry, dispatch.

Both operators share the accumulator ``sum((x - x_zero_point) * (w - w_zero_point)) (+ B)``. The exact
integer kernels (:mod:`qlinear.kernels.im2col`) compute it for 1-, 2- and 3-D convolutions, with
QLinearConv's requantization fused into their store; more spatial dimensions run the int64 NumPy reference
(:mod:`qlinear.reference.conv`, :mod:`qlinear.reference.requantize`), which the kernels equal bit for bit.
`prepack_conv` packs weights once for repeated calls.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qlinear.ops import _quant_args as qa
from qlinear.ops._quant_args import AccumulatorOverflowError
from qlinear.reference.conv import conv_accumulate as _reference_conv_accumulate
from qlinear.reference.requantize import FUSED_MODES, REQUANTIZE_MODES, arithmetic, requantize_multiplier
from qlinear.reference.requantize import requantize as _requantize

__all__ = ["qlinear_conv", "conv_integer", "prepack_conv", "AccumulatorOverflowError", "ConvGeometry", "conv_geometry"]

_KERNEL_SPATIAL_DIMS = 3  # the im2col kernels handle 1-D, 2-D and 3-D convolutions

AUTO_PAD_MODES = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


@dataclass(frozen=True)
class ConvGeometry:
    """Everything about a convolution except the data: resolved attributes and the output shape."""

    group: int
    kernel_shape: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    output_shape: tuple[int, ...]  # (N, M, O1..On)


def conv_geometry(func, x_shape, w_shape, *, auto_pad, dilations, group, kernel_shape, pads, strides) -> ConvGeometry:
    """Validate the attributes against x's and w's shapes and resolve auto_pad into explicit pads."""
    if len(x_shape) < 3:
        raise ValueError(f"{func}: x must have at least 3 dimensions (N, C, D1, ...), got shape {tuple(x_shape)}")
    if len(w_shape) != len(x_shape):
        raise ValueError(
            f"{func}: w must have the rank of x ({len(x_shape)}: M, C/group, k1, ...), got shape {tuple(w_shape)}"
        )
    n_spatial = len(x_shape) - 2
    in_spatial = tuple(x_shape[2:])
    out_channels, group_channels = w_shape[:2]

    if isinstance(group, bool) or not isinstance(group, (int, np.integer)):
        raise TypeError(f"{func}: group must be an integer, got {type(group).__name__}")
    group = int(group)
    if group < 1:
        raise ValueError(f"{func}: group must be >= 1, got {group}")
    if x_shape[1] != group_channels * group:
        raise ValueError(
            f"{func}: x.shape[1] must equal w.shape[1] * group (C == C/group * group), got "
            f"x.shape[1]={x_shape[1]}, w.shape[1]={group_channels}, group={group}"
        )
    if out_channels % group != 0:
        raise ValueError(f"{func}: w.shape[0] (M={out_channels}) must be a multiple of group ({group})")

    kernel = tuple(int(k) for k in w_shape[2:])
    if any(k < 1 for k in kernel):
        raise ValueError(f"{func}: w's spatial dimensions must be >= 1, got shape {tuple(w_shape)}")
    given_kernel = qa.int_list(func, "kernel_shape", kernel_shape, n_spatial, 1)
    if given_kernel is not None and given_kernel != kernel:
        raise ValueError(f"{func}: kernel_shape must equal w.shape[2:] {kernel}, got {given_kernel}")
    strides = qa.int_list(func, "strides", strides, n_spatial, 1) or (1,) * n_spatial
    dilations = qa.int_list(func, "dilations", dilations, n_spatial, 1) or (1,) * n_spatial
    pads = qa.int_list(func, "pads", pads, 2 * n_spatial, 0)

    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode("ascii", "replace")
    if not isinstance(auto_pad, str):
        raise TypeError(f"{func}: auto_pad must be a string, got {type(auto_pad).__name__}")
    if auto_pad not in AUTO_PAD_MODES:
        raise ValueError(f"{func}: auto_pad must be one of {', '.join(AUTO_PAD_MODES)}, got {auto_pad!r}")
    if auto_pad != "NOTSET" and pads is not None:
        raise ValueError(f"{func}: pads cannot be used together with auto_pad={auto_pad!r}")

    extent = tuple(d * (k - 1) + 1 for k, d in zip(kernel, dilations))
    if auto_pad == "NOTSET":
        pads = pads or (0,) * (2 * n_spatial)
        pads_begin, pads_end = pads[:n_spatial], pads[n_spatial:]
    elif auto_pad == "VALID":
        pads_begin = pads_end = (0,) * n_spatial
    else:
        # output = ceil(input / stride); the total padding that achieves it, odd unit at the end (UPPER) or
        # at the beginning (LOWER).
        totals = [
            max(0, (-(-size // s) - 1) * s + e - size) for size, s, e in zip(in_spatial, strides, extent)
        ]
        small = tuple(t // 2 for t in totals)
        large = tuple(t - t // 2 for t in totals)
        pads_begin, pads_end = (small, large) if auto_pad == "SAME_UPPER" else (large, small)

    out_spatial = tuple(
        (size + b + e - ext) // s + 1
        for size, b, e, ext, s in zip(in_spatial, pads_begin, pads_end, extent, strides)
    )
    for axis, (size, b, e, ext) in enumerate(zip(in_spatial, pads_begin, pads_end, extent)):
        if size + b + e < ext:
            raise ValueError(
                f"{func}: the dilated kernel ({ext}) is larger than the padded input ({size + b + e}) on "
                f"spatial axis {axis}: the output would be empty"
            )
    return ConvGeometry(
        group=group,
        kernel_shape=kernel,
        strides=strides,
        dilations=dilations,
        pads_begin=tuple(pads_begin),
        pads_end=tuple(pads_end),
        output_shape=(x_shape[0], out_channels) + out_spatial,
    )


def _conv_accumulate(x, x_zero_point, w, w_zero_point, B, geometry: ConvGeometry, packed=None) -> np.ndarray:
    """The exact accumulator of shape geometry.output_shape (int32 from the kernels, int64 values from
    the reference for more than 3 spatial dimensions).

    x: (N, C, D..) int8/uint8; x_zero_point: 0-d of x's dtype; w: (M, C/group, k..) int8/uint8;
    w_zero_point: 0-d or (M,) of w's dtype; B: (M,) int32 or None; packed: w's PackedConv, if any.
    """
    if len(geometry.kernel_shape) <= _KERNEL_SPATIAL_DIMS:
        im2col = _im2col()
        if packed is None:
            packed = _packed_raw(im2col, w, w_zero_point, geometry.group)
        return im2col.conv(x, x_zero_point, packed, B, geometry)
    return _reference_conv_accumulate(
        x,
        x_zero_point,
        w,
        w_zero_point,
        B,
        group=geometry.group,
        strides=geometry.strides,
        dilations=geometry.dilations,
        pads_begin=geometry.pads_begin,
        pads_end=geometry.pads_end,
    )


def _packed_raw(im2col, w, w_zero_point, group):
    """The packing of raw weights ``w``: the one an earlier call made of an equal array when there is one
    (kernels/packing_cache.py says how that stays safe), else a new one."""
    from qlinear.kernels import packing_cache

    zp = np.asarray(w_zero_point)
    return packing_cache.packed("conv", w, (zp.dtype.str, zp.shape, zp.tobytes(), group),
                                lambda copy: im2col.prepack_conv(copy, zp, group))


def _im2col():
    """The kernel module, imported on first use: it imports numba, which `import qlinear` must not."""
    from qlinear.kernels import im2col

    return im2col


def prepack_conv(w, w_zero_point=None, *, group=1):
    """Pack convolution weights once, for repeated `qlinear_conv` / `conv_integer` calls.

    Pass the result as ``w`` (with the same ``w_zero_point`` and ``group``); the packing, and the
    per-input-shape plan, are then reused, as runtimes do with constant weights.

    >>> import numpy as np, qlinear
    >>> w = np.ones((4, 3, 3, 3), np.int8)
    >>> packed = qlinear.prepack_conv(w, np.int8(0))
    >>> x = np.full((1, 3, 5, 5), 2, np.uint8)
    >>> qlinear.conv_integer(x, packed, np.uint8(0), np.int8(0))[0, 0]
    array([[54, 54, 54],
           [54, 54, 54],
           [54, 54, 54]], dtype=int32)
    """
    func = "prepack_conv"
    w = qa.quantized_tensor(func, "w", w)
    if w.ndim < 3:
        raise ValueError(f"{func}: w must have shape (M, C/group, k1, ...), got {w.shape}")
    w_zero_point = _per_output_channel(func, "w_zero_point", qa.zero_point(func, "w_zero_point", w_zero_point, w.dtype, "w"), w.shape[0])
    if isinstance(group, bool) or not isinstance(group, (int, np.integer)) or group < 1 or w.shape[0] % group:
        raise ValueError(f"{func}: group must be a positive divisor of M={w.shape[0]}, got {group!r}")
    return _im2col().prepack_conv(w, w_zero_point, int(group))


def _unpack_weights(func: str, w, w_zero_point, group):
    """``w`` as an array, and its PackedConv when the caller passed one (whose zero point and group must
    be the ones given now)."""
    if type(w).__name__ != "PackedConv" or type(w).__module__ != "qlinear.kernels.im2col":
        return w, None
    packed = w
    given = np.asarray(w_zero_point if w_zero_point is not None else 0)
    if given.size == 1 and packed.uniform_zero_point is not None:  # the common case, without array temporaries
        same = int(given.reshape(-1)[0]) == packed.uniform_zero_point
    else:
        same = np.array_equal(np.broadcast_to(given, (packed.out_channels,)).astype(np.int64),
                              packed.w_zero_point.astype(np.int64))
    if not same:
        raise ValueError(f"{func}: w_zero_point differs from the one the weights were packed with (prepack_conv)")
    if group != packed.group:
        raise ValueError(f"{func}: group={group!r} but the weights were packed with group={packed.group}")
    return packed.w, packed


def _per_output_channel(func: str, name: str, value: np.ndarray, out_channels: int) -> np.ndarray:
    """w's scale or zero point: per tensor (returned 0-d) or 1-D of length M (per output channel)."""
    if qa.is_per_tensor(value):
        return value.reshape(())
    if value.ndim != 1 or value.shape[0] != out_channels:
        raise ValueError(
            f"{func}: {name} must be a scalar (per tensor) or a 1-D tensor of M={out_channels} elements "
            f"(per output channel), got shape {value.shape}"
        )
    return value


def _check_requantize_mode(func: str, requantize_mode) -> None:
    if not isinstance(requantize_mode, str) or requantize_mode not in REQUANTIZE_MODES:
        raise ValueError(f"{func}: requantize must be one of {', '.join(map(repr, REQUANTIZE_MODES))}, got {requantize_mode!r}")


def _repeated(func: str, x, w, arguments: tuple):
    """``(launch, key)``: the `ConvLaunch` of an earlier call on prepacked weights ``w`` with these arguments
    (first the last call's, `LastCall`: the same argument objects; then the one kept under the arguments' key,
    which becomes the last call) or None, and the arguments' key where it was built (None where it was not, or
    an argument has none). A call whose launch is found runs it without the checks and the set-up: repeated
    inference on small layers spent more there (~100 us) than in the kernel."""
    packed = _prepacked(w)
    if packed is None or type(x) is not np.ndarray:
        return None, None
    head = (func, x.shape, x.dtype)
    last = packed.last_call
    if last is not None:
        launch = last.matches(head, arguments)
        if launch is not None:
            return launch, None
    key = qa.call_key(head, arguments)
    launch = None if key is None else packed.calls.get(key)
    if launch is not None and (last is None or last.value is not launch):
        # not renewed for the same launch: a caller that builds new argument objects each call (pads=[1, 1, 1, 1])
        # would pay for a LastCall it never uses
        packed.last_call = qa.LastCall(head, key[-2], arguments, launch)
    return launch, key


def _prepacked(w):
    """``w`` if it is a `prepack_conv` result, else None."""
    kind = type(w)
    return w if kind.__name__ == "PackedConv" and kind.__module__ == "qlinear.kernels.im2col" else None


_KEPT_CALLS = 16  # launches kept per packed weights (one per input shape, scales, attributes... in use)


def qlinear_conv(
    x,
    x_scale,
    x_zero_point,
    w,
    w_scale,
    w_zero_point,
    y_scale,
    y_zero_point,
    B=None,
    *,
    auto_pad="NOTSET",
    dilations=None,
    group=1,
    kernel_shape=None,
    pads=None,
    strides=None,
    requantize="float64",
) -> np.ndarray:
    """ONNX QLinearConv-10: quantized N-D convolution with int8/uint8 x, w and y.

    ``y = saturate(round(acc * x_scale * w_scale / y_scale) + y_zero_point)`` where ``acc`` is the exact
    int32 sum of ``(x - x_zero_point) * (w - w_zero_point)`` over each receptive field plus ``B``.
    ``w_scale`` and ``w_zero_point`` are per tensor or per output channel (1-D of length M, zero points
    may differ). ``requantize="float64"`` (default) reproduces the onnx reference evaluator's
    arithmetic, ``"float32"`` onnxruntime's, ``"tflite"`` / ``"tflite-single"`` TFLite's reference
    CONV_2D (QuantizeMultiplier and the fixed-point multiply, in the default and the single-rounding build),
    ``"xnnpack"`` XNNPACK's (equal to "float32"); see docs/semantics.md and docs/tflite_conv.md.
    Raises AccumulatorOverflowError (a ValueError and OverflowError) when the exact accumulator leaves int32.
    """
    func = "qlinear_conv"
    arguments = (x_scale, x_zero_point, w_scale, w_zero_point, y_scale, y_zero_point, B, auto_pad, dilations, group,
                 kernel_shape, pads, strides, requantize)
    launch, key = _repeated(func, x, w, arguments)
    if launch is not None:
        return qa.int32_kernel(func, "sum of (x - x_zero_point) * (w - w_zero_point) plus B", launch.run, x)
    _check_requantize_mode(func, requantize)
    x = qa.quantized_tensor(func, "x", x)
    w, packed = _unpack_weights(func, w, w_zero_point, group)
    w = qa.quantized_tensor(func, "w", w)
    geometry = conv_geometry(
        func, x.shape, w.shape, auto_pad=auto_pad, dilations=dilations, group=group,
        kernel_shape=kernel_shape, pads=pads, strides=strides,
    )
    out_channels = w.shape[0]
    scale_types = (np.float32,)
    x_scale = qa.require_per_tensor(func, "x_scale", qa.scale(func, "x_scale", x_scale, scale_types))
    w_scale = _per_output_channel(func, "w_scale", qa.scale(func, "w_scale", w_scale, scale_types), out_channels)
    y_scale = qa.require_per_tensor(func, "y_scale", qa.scale(func, "y_scale", y_scale, scale_types))
    x_zero_point = qa.require_per_tensor(func, "x_zero_point", qa.zero_point(func, "x_zero_point", x_zero_point, x.dtype, "x"))
    w_zero_point = _per_output_channel(
        func, "w_zero_point", qa.zero_point(func, "w_zero_point", w_zero_point, w.dtype, "w"), out_channels
    )
    y_zero_point = qa.require_per_tensor(func, "y_zero_point", qa.output_zero_point(func, "y_zero_point", y_zero_point))
    if B is not None:
        B = qa.quantized_tensor(func, "B", B, allowed=(np.dtype(np.int32),))
        if B.shape != (out_channels,):
            raise ValueError(f"{func}: B must be a 1-D tensor of M={out_channels} elements, got shape {B.shape}")

    channel_shape = (1, out_channels) + (1,) * (x.ndim - 2)
    requantize = arithmetic(requantize)
    with np.errstate(over="ignore", under="ignore"):  # an infinite multiplier is reported just below
        multiplier = requantize_multiplier(x_scale, w_scale.reshape(channel_shape) if w_scale.ndim else w_scale, y_scale,
                                           requantize, x.dtype)
    qa.check_multiplier(func, multiplier, "x_scale * w_scale / y_scale")
    if len(geometry.kernel_shape) <= _KERNEL_SPATIAL_DIMS and requantize in FUSED_MODES:
        # the kernels fuse the requantization into their store (same arithmetic as the reference's)
        im2col = _im2col()
        if packed is None:
            packed = _packed_raw(im2col, w, w_zero_point, geometry.group)
        requant = (multiplier.reshape(-1), y_zero_point, y_zero_point.dtype, requantize)
        launch = im2col.prepare(x.shape, x.dtype, x_zero_point, packed, None if B is None else B.copy(), geometry,
                                requant)
        qa.keep(packed.calls, key, launch, _KEPT_CALLS)
        return qa.int32_kernel(func, "sum of (x - x_zero_point) * (w - w_zero_point) plus B", launch.run, x)
    acc = qa.int32_kernel(func, "sum of (x - x_zero_point) * (w - w_zero_point) plus B", _conv_accumulate,
                          x, x_zero_point, w, w_zero_point, B, geometry, packed)
    qa.check_int32(func, acc, "sum of (x - x_zero_point) * (w - w_zero_point) plus B")
    return _requantize(acc, multiplier, y_zero_point, requantize)


def conv_integer(
    x,
    w,
    x_zero_point=None,
    w_zero_point=None,
    *,
    auto_pad="NOTSET",
    dilations=None,
    group=1,
    kernel_shape=None,
    pads=None,
    strides=None,
) -> np.ndarray:
    """ONNX ConvInteger-10: the exact int32 convolution of ``x - x_zero_point`` and ``w - w_zero_point``.

    Zero points default to 0; ``w_zero_point`` may be per output channel. Raises AccumulatorOverflowError
    (a ValueError and an OverflowError) when the exact sum leaves int32, the spec's accumulator type,
    instead of wrapping.
    """
    func = "conv_integer"
    launch, key = _repeated(func, x, w, (x_zero_point, w_zero_point, auto_pad, dilations, group, kernel_shape, pads,
                                         strides))
    if launch is not None:
        return qa.int32_kernel(func, "sum of (x - x_zero_point) * (w - w_zero_point)", launch.run, x)
    x = qa.quantized_tensor(func, "x", x)
    w, packed = _unpack_weights(func, w, w_zero_point, group)
    w = qa.quantized_tensor(func, "w", w)
    geometry = conv_geometry(
        func, x.shape, w.shape, auto_pad=auto_pad, dilations=dilations, group=group,
        kernel_shape=kernel_shape, pads=pads, strides=strides,
    )
    x_zero_point = qa.require_per_tensor(func, "x_zero_point", qa.zero_point(func, "x_zero_point", x_zero_point, x.dtype, "x"))
    w_zero_point = _per_output_channel(
        func, "w_zero_point", qa.zero_point(func, "w_zero_point", w_zero_point, w.dtype, "w"), w.shape[0]
    )
    if packed is not None and len(geometry.kernel_shape) <= _KERNEL_SPATIAL_DIMS:
        launch = _im2col().prepare(x.shape, x.dtype, x_zero_point, packed, None, geometry)
        qa.keep(packed.calls, key, launch, _KEPT_CALLS)
        return qa.int32_kernel(func, "sum of (x - x_zero_point) * (w - w_zero_point)", launch.run, x)
    acc = qa.int32_kernel(func, "sum of (x - x_zero_point) * (w - w_zero_point)", _conv_accumulate,
                          x, x_zero_point, w, w_zero_point, None, geometry, packed)
    qa.check_int32(func, acc, "sum of (x - x_zero_point) * (w - w_zero_point)")
    return acc.astype(np.int32)
