"""Which requantization each TFLite kernel family applies to CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED,
by activation type: the dispatch of the LiteRT kernels, transcribed (sources as in
:mod:`qlinear.reference.tflite_requantize`; file:line at LiteRT f6745779).

The accumulator is the exact ``sum((w - w_zp) * (x - x_zp)) + bias`` (channels on the last axis); the
kernels hold it in int32 (8-bit activations, and 16x8 with an int32 bias), wrapping on overflow, or in int64
(16x8 with an int64 bias). Then ``y = clamp(requantize(acc) + y_zero_point, act_min, act_max)``.

``kernel="reference"`` (``BuiltinRefOpResolver``):
    CONV_2D, DEPTHWISE_CONV_2D: MultiplyByQuantizedMultiplier (reference/integer_ops/conv.h:125,
    depthwise_conv.h:109, reference/conv.h:192, depthwiseconv_uint8.h:183); 16x8 with an int64 bias: its
    int64 overload (conv.h:226, depthwise_conv.h:195). uint8 DEPTHWISE keeps double rounding in a
    single-rounding build (``DepthwiseConvRound<kAwayFromZero>``).
    FULLY_CONNECTED: ``round(double(acc) * in_s * w_s / out_s)``, every type (LiteRT 9213607, 2025-04-14:
    reference/integer_ops/fully_connected.h:119-123, 221-225, reference/fully_connected.h:262-266), or
    before that change (``reference_double_requantize=False``) MultiplyByQuantizedMultiplier.
``kernel="optimized"`` (``BuiltinOpResolver`` without the default delegate, the x86-64 wheels):
    CONV_2D and FULLY_CONNECTED go through cpu_backend_gemm to ruy (or the custom GEMV for one column), both
    ``multiply_by_quantized_multiplier_upward``; a grouped CONV_2D runs the reference kernel (conv.cc:809, 899);
    16x8 with an int64 bias runs the reference kernel (conv.cc:1044, fully_connected.cc:1754).
    DEPTHWISE_CONV_2D int8 (optimized/integer_ops/depthwise_conv.h:1610-1800, ``optimized_ops::Quantize``,
    optimized_ops.h:5348-5437): output channels in whole blocks of 8 take the NEON path (vqrdmulh + vrshl:
    upward), the last ``C % 8`` channels the scalar MultiplyByQuantizedMultiplier. uint8
    (optimized/depthwiseconv_uint8.h:1888-2024): vqrdmulh + gemmlowp's RoundingDivideByPOT, i.e. the double
    rounding MultiplyByQuantizedMultiplier throughout (in a single-rounding build, only the elements the
    vector loop leaves over use the single rounding). 16x8: the reference kernel. The 8-bit kernels
    copy the bias unconditionally: without one the interpreter crashes (qlinear.tflite.conv refuses).
``kernel="xnnpack"`` (``AUTO``: the default XNNPACK delegate, then the optimized kernels for what it leaves):
    int8 and uint8 with a bias take XNNPACK's fp32 requantization (``requantize_xnnpack``) with its own
    activation bounds; 16x8, a DEPTHWISE_CONV_2D without bias and a non-normal scale are declined by the
    delegate and run ``"optimized"``; a requantization scale >= 256 makes the interpreter fail.

The real multiplier is ``double(in_s) * double(w_s[c]) / double(out_s)`` for the per-channel parameters
(every int8/int16 CONV and DEPTHWISE, per-tensor weights broadcast: kernel_util.cc:258; FULLY_CONNECTED with
per-channel weights: fully_connected.cc:552-563; the reference FULLY_CONNECTED's double requantization), and
``double(float(in_s * w_s)) / double(out_s)`` (the product in float32: GetQuantizedConvolutionMultipler,
kernel_util.cc:334) for uint8 CONV/DEPTHWISE and the fixed-point per-tensor FULLY_CONNECTED.
"""

from __future__ import annotations

import numpy as np

from qlinear.reference import tflite_requantize as rq

OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")
KERNELS = ("reference", "optimized", "xnnpack")
_NEON_BLOCK = 8  # channels per iteration of optimized_ops::Quantize's NEON loop
_ACC_BUFFER = 2048  # int32 accumulators per chunk of the optimized depthwise kernels (kAccBufferMaxSize)


def real_multipliers(x_scale, w_scale, y_scale, *, float32_product: bool) -> np.ndarray:
    """The real multiplier(s) QuantizeMultiplier receives: the per-channel form (product in double) or
    GetQuantizedConvolutionMultipler's (product in float32, then widened)."""
    w = np.asarray(w_scale, np.float32)
    if float32_product:
        with np.errstate(over="ignore", under="ignore"):
            product = (np.float32(x_scale) * w).astype(np.float64)
    else:
        product = np.float64(np.float32(x_scale)) * w.astype(np.float64)
    return product / np.float64(np.float32(y_scale))


def xnnpack_delegates(op: str, x_dtype, has_bias: bool, x_scale, w_scale, y_scale) -> bool:
    """Whether the XNNPACK delegate takes the node (tflite/delegates/xnnpack/xnnpack_delegate.cc:3983-4440,
    4933-5140): 8-bit types only; a bias for CONV_2D and DEPTHWISE_CONV_2D; normal (not subnormal) scales
    for x, y, the weights and the bias (XNNPACK's xnn_validate_quantized_tensor, src/tensor.c:338-364; the
    bias's scale is taken to be ``float32(x_scale * w_scale)``, as converters write it). A declined node runs
    the optimized kernel.

    Raises ValueError where the delegate takes the node but XNNPACK then refuses it, which makes the
    interpreter fail: a requantization scale of 256 or more (src/operators/convolution-nhwc.c:1010-1115)."""
    if np.dtype(x_dtype) not in (np.dtype(np.int8), np.dtype(np.uint8)):
        return False
    if op != "FULLY_CONNECTED" and not has_bias:
        return False
    x_scale, y_scale = np.float32(x_scale), np.float32(y_scale)
    w_scale = np.atleast_1d(np.asarray(w_scale, np.float32))
    with np.errstate(over="ignore", under="ignore"):
        bias_scale = x_scale * w_scale if has_bias else x_scale
    scales = np.concatenate([np.atleast_1d(s).ravel() for s in (x_scale, w_scale, y_scale, bias_scale)])
    if not np.all(np.isfinite(scales) & (scales >= np.finfo(np.float32).tiny)):
        return False
    if np.any(rq.xnnpack_scale(x_scale, w_scale, y_scale) >= np.float32(256.0)):
        raise ValueError("kernel='xnnpack': XNNPACK refuses a requantization scale x_scale * w_scale / y_scale "
                         ">= 256, and the interpreter then fails to prepare the delegate")
    return True


def _optimized_dw_uint8_single_mask(out_width: int, channels: int) -> np.ndarray:
    """Which outputs of one output row the uint8 optimized depthwise kernel leaves to its scalar loop: the row
    is cut into chunks of ``2048 // C`` pixels (one pixel when C > 2048), and in each chunk the vector loops
    take whole groups of 4 of its ``pixels * C`` values."""
    pixels = max(1, _ACC_BUFFER // channels)
    mask = np.zeros((out_width, channels), bool)
    for start in range(0, out_width, pixels):
        stop = min(out_width, start + pixels)
        n = (stop - start) * channels
        flat = np.zeros(n, bool)
        flat[n - n % 4:] = True
        mask[start:stop] = flat.reshape(stop - start, channels)
    return mask


def requantize(op: str, kernel: str, acc: np.ndarray, *, x_dtype, x_scale, w_scale, y_scale, y_zero_point,
               activation=None, bias_dtype=None, has_bias: bool = True, groups: int = 1,
               single_rounding: bool = False, reference_double_requantize: bool = True) -> np.ndarray:
    """TFLite's output of ``op`` under ``kernel`` for the exact accumulator ``acc`` (int64, channels last;
    conv outputs are NHWC so the width axis is ``acc.shape[-2]``).

    ``w_scale`` is a scalar (per-tensor weights) or one float32 per output channel; ``bias_dtype`` (int32 or
    int64; None without bias) selects the 16x8 paths; ``groups`` > 1 marks a grouped CONV_2D. The flags are
    the build and version variants described in the module docstring.
    """
    if op not in OPS:
        raise ValueError(f"requantize: op must be one of {OPS}, got {op!r}")
    if kernel not in KERNELS:
        raise ValueError(f"requantize: kernel must be one of {KERNELS}, got {kernel!r}")
    x_dtype = np.dtype(x_dtype)
    per_channel = np.size(w_scale) > 1
    channels = acc.shape[-1]
    w_scale = np.broadcast_to(np.asarray(w_scale, np.float32).reshape(-1), (channels,))
    zp = int(y_zero_point)
    acc64 = np.asarray(acc, np.int64)
    acc32 = rq.wrap_int32(acc64)  # the int32 accumulator of every kernel but the int64-bias 16x8 ones
    sixteen = x_dtype == np.dtype(np.int16)
    int64_bias = bias_dtype is not None and np.dtype(bias_dtype) == np.dtype(np.int64)

    if kernel == "xnnpack":
        if xnnpack_delegates(op, x_dtype, has_bias, x_scale, w_scale, y_scale):
            lo, hi = rq.activation_range_xnnpack(activation, y_scale, zp, x_dtype)
            y = rq.requantize_xnnpack(acc32, rq.xnnpack_scale(x_scale, w_scale, y_scale), zp, lo, hi)
            return np.clip(y, lo, hi).astype(x_dtype)
        kernel = "optimized"

    lo, hi = rq.activation_range(activation, y_scale, zp, x_dtype)
    legacy_real = real_multipliers(x_scale, w_scale, y_scale, float32_product=True)
    double_real = real_multipliers(x_scale, w_scale, y_scale, float32_product=False)

    def fixed(real):
        return rq.quantize_multipliers(real, single_rounding)

    def mbqm(values, real, single=single_rounding):
        return rq.multiply_by_quantized_multiplier(values, *fixed(real), single_rounding=single)

    def mbqm64(values, real):
        return rq.multiply_by_quantized_multiplier_int64(values, *fixed(real))

    def upward(values, real):
        return rq.multiply_by_quantized_multiplier_upward(values, *fixed(real))

    if op == "FULLY_CONNECTED":
        # fully_connected.cc:1255-1315, 1385-1420, 1697-1780: the 16x8 reference kernels accumulate in the
        # bias's type (int64 without bias); the optimized 16x8 kernel (ruy) runs unless the bias is int64.
        fixed_real = double_real if per_channel else legacy_real
        acc_ref = acc64 if sixteen and (bias_dtype is None or int64_bias) else acc32
        if kernel == "optimized" and not int64_bias:
            scaled = upward(acc32, fixed_real)
        elif reference_double_requantize:
            scaled = rq.requantize_double(acc_ref, double_real)
        elif acc_ref is acc64:
            scaled = mbqm64(acc64, fixed_real)
        else:
            scaled = mbqm(acc32, fixed_real)
    elif op == "CONV_2D":
        # conv.cc:786-1010: ruy unless grouped (reference only) or 16x8 with an int64 bias
        real = legacy_real if x_dtype == np.dtype(np.uint8) else double_real
        if int64_bias:
            scaled = mbqm64(acc64, real)
        elif kernel == "optimized" and groups == 1:
            scaled = upward(acc32, real)
        else:
            scaled = mbqm(acc32, real)
    elif sixteen:
        scaled = mbqm64(acc64, double_real)  # depthwise_conv.cc:505-531, every resolver
    elif x_dtype == np.dtype(np.uint8):
        # DepthwiseConvRound<kAwayFromZero> (reference) and the uint8 optimized kernel's vector loops keep
        # the double rounding in a single-rounding build; the optimized scalar leftovers do not.
        scaled = mbqm(acc32, legacy_real, single=False)
        if kernel == "optimized" and single_rounding:
            mask = _optimized_dw_uint8_single_mask(acc32.shape[-2], channels)
            scaled = np.where(mask, mbqm(acc32, legacy_real, single=True), scaled)
    elif kernel == "optimized":
        block = channels - channels % _NEON_BLOCK
        m, s = fixed(double_real)
        neon = (rq.multiply_by_quantized_multiplier_neon_single if single_rounding
                else rq.multiply_by_quantized_multiplier_upward)
        scaled = np.concatenate([
            neon(acc32[..., :block], m[:block], s[:block]),
            rq.multiply_by_quantized_multiplier(acc32[..., block:], m[block:], s[block:],
                                                single_rounding=single_rounding),
        ], axis=-1)
    else:
        scaled = mbqm(acc32, double_real)
    y = rq.wrap_int32(np.asarray(scaled, np.int64) + zp)
    return np.clip(y, lo, hi).astype(x_dtype)
