"""The numba half of `qlinear.kernels.tf_quantize_extra`: strict QuantizeV2/Dequantize, Dequantize to bfloat16.

Strict element functions are the per-element part of the ``*_strict`` functions of
`qlinear.reference.tf_quantize`: float64, the same operations in the same order, one rounding, saturation.
The bfloat16 Dequantize reuses the float32 element function of `_tf_quantize_numba` (TensorFlow's kernel
arithmetic) and rounds its result to bfloat16 bits in the same pass, as ``astype(bfloat16)`` would.

Every kernel takes ``(..., start, stop)`` over items for `threads.run_chunked`: elements when there is one
slice, rows of the slice axis when the axis is last (``post == 1``), else rows of ``post`` elements.
"""

from __future__ import annotations

import numpy as np
from qlinear.kernels import ensure_fresh_numba_cache

ensure_fresh_numba_cache()  # before any cached kernel loads
from numba import njit  # noqa: E402

from ._vector_width import use_512_bit_vectors

from ._tf_quantize_numba import DQ_COMBINED, _dequantize_one
from .small_float import f32_to_bf16_bits

_JIT = dict(cache=True, nogil=True, error_model="numpy")

# strict quantize modes
QS_COMBINED, QS_FIRST, QS_SCALED_EVEN, QS_SCALED_AWAY = 0, 1, 2, 3
# strict dequantize modes
DQS_LINEAR, DQS_SCALED = 0, 1


@njit(**_JIT)
def _round_half_away64(v):
    whole = np.trunc(v)
    frac = v - whole  # exact
    step = 1.0 if frac >= 0.5 else (-1.0 if frac <= -0.5 else 0.0)
    return whole + step


@njit(**_JIT)
def _quantize_strict_one(v, mode, p0, p1, p2, p3, q_min, q_max):
    """One float64 element -> the saturated integral value, float64.

    QS_COMBINED: p0=min, p1=max, p2=max-min (0 when not > 0), p3=range(T); q_min=min T.
    QS_FIRST: p0=range_scale (0 for a zero-width range), p1=round(min * range_scale); q_min=min T.
    QS_SCALED_*: p0=scale; q_min=min T + narrow_range."""
    if mode == QS_COMBINED:
        clamped = min(max(v, p0), p1)  # np.clip; strict inputs have no NaN
        scaled = (clamped - p0) * p3 / p2 if p2 > 0.0 else 0.0
        q = np.floor(scaled + 0.5) + q_min
    elif mode == QS_FIRST:
        q = _round_half_away64(v * p0 if p0 > 0.0 else 0.0) - p1 + q_min
    elif mode == QS_SCALED_EVEN:
        q = np.rint(v * p0)
    else:
        q = _round_half_away64(v * p0)
    return min(max(q, q_min), q_max)


@njit(**_JIT)
def _quantize_strict_span(x, out, p, s, mode, q_min, q_max):
    """x/out spans that all belong to slice s."""
    use_512_bit_vectors()
    p0, p1, p2, p3 = p[s, 0], p[s, 1], p[s, 2], p[s, 3]
    for k in range(x.size):
        out[k] = _quantize_strict_one(np.float64(x[k]), mode, p0, p1, p2, p3, q_min, q_max)


@njit(**_JIT)
def quantize_strict(x, out, p, slices, post, mode, q_min, q_max, start, stop):
    """x: float32 [pre, slices, post] flattened; out: T; p: float64 [slices, 4] per-slice constants."""
    use_512_bit_vectors()
    if slices == 1:
        _quantize_strict_span(x[start:stop], out[start:stop], p, 0, mode, q_min, q_max)
    elif post == 1:
        for r in range(start, stop):
            xs = x[r * slices:(r + 1) * slices]
            os = out[r * slices:(r + 1) * slices]
            for k in range(slices):
                os[k] = _quantize_strict_one(np.float64(xs[k]), mode, p[k, 0], p[k, 1], p[k, 2], p[k, 3], q_min, q_max)
    else:
        for r in range(start, stop):
            _quantize_strict_span(x[r * post:(r + 1) * post], out[r * post:(r + 1) * post], p, r % slices, mode,
                                  q_min, q_max)


@njit(**_JIT)
def _dequantize_strict_one(q, mode, p0, p1, q_min):
    """DQS_LINEAR: min + (q - min T) * step, p0=min, p1=step. DQS_SCALED: q * scale, p0=scale. float32."""
    qd = np.float64(q)
    if mode == DQS_LINEAR:
        return np.float32(p0 + (qd - q_min) * p1)
    return np.float32(qd * p0)


@njit(**_JIT)
def _store(out, k, v, bf16):
    if bf16:
        out[k] = f32_to_bf16_bits(v)
    else:
        out[k] = v


@njit(**_JIT)
def dequantize_strict(q, out, p, slices, post, mode, q_min, bf16, start, stop):
    """q: T [pre, slices, post] flattened; out: float32, or uint16 bfloat16 bits when bf16; p: float64 [slices, 2]."""
    use_512_bit_vectors()
    if slices == 1 or post != 1:
        span = stop - start if slices == 1 else post
        first_row, last_row = (0, 1) if slices == 1 else (start, stop)
        for r in range(first_row, last_row):
            base = start if slices == 1 else r * post
            s = 0 if slices == 1 else r % slices
            p0, p1 = p[s, 0], p[s, 1]
            qs = q[base:base + span]
            os = out[base:base + span]
            if bf16:
                for k in range(span):
                    os[k] = f32_to_bf16_bits(_dequantize_strict_one(qs[k], mode, p0, p1, q_min))
            else:
                for k in range(span):
                    os[k] = _dequantize_strict_one(qs[k], mode, p0, p1, q_min)
    else:
        for r in range(start, stop):
            qs = q[r * slices:(r + 1) * slices]
            os = out[r * slices:(r + 1) * slices]
            for k in range(slices):
                _store(os, k, _dequantize_strict_one(qs[k], mode, p[k, 0], p[k, 1], q_min), bf16)


@njit(**_JIT)
def dequantize_bf16(q, out, a, b, half, slices, post, start, stop):
    """TensorFlow's MIN_COMBINED Dequantize (float32, `_tf_quantize_numba._dequantize_one`) rounded to
    bfloat16 bits. a: scale, b: min, per slice (float32)."""
    use_512_bit_vectors()
    if slices == 1 or post != 1:
        span = stop - start if slices == 1 else post
        first_row, last_row = (0, 1) if slices == 1 else (start, stop)
        for r in range(first_row, last_row):
            base = start if slices == 1 else r * post
            s = 0 if slices == 1 else r % slices
            av, bv = a[s], b[s]
            qs = q[base:base + span]
            os = out[base:base + span]
            for k in range(span):
                os[k] = f32_to_bf16_bits(_dequantize_one(qs[k], DQ_COMBINED, av, bv, half))
    else:
        for r in range(start, stop):
            qs = q[r * slices:(r + 1) * slices]
            os = out[r * slices:(r + 1) * slices]
            for k in range(slices):
                os[k] = f32_to_bf16_bits(_dequantize_one(qs[k], DQ_COMBINED, a[k], b[k], half))
