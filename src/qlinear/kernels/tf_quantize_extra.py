"""Fast kernels for the TensorFlow cases `qlinear.kernels.tf_quantize` does not cover.

Internal API, called at the dispatch point of `qlinear.tf.quantize` with the reference's arguments:

``quantize_v2_strict(x3, min_range, max_range, dtype, mode, round_mode, narrow_range, ensure_minimum_range, out=None)``
    ``strict=True`` QuantizeV2: the documented formulas (float64, one rounding, saturation), bit-identical to
    the ``*_strict`` functions of `qlinear.reference.tf_quantize`.
``dequantize(q3, min_range, max_range, mode, narrow_range, strict, out_dtype, out=None)``
    ``strict=True`` Dequantize (float32 or bfloat16 out), and the kernel-arithmetic Dequantize to bfloat16:
    the float32 result rounded to nearest even in the same pass (no float32 temporary of the full size).

Each returns None when no kernel runs (numba missing, kernels switched off with
`qlinear.kernels.quantize_linear.use_kernels(False)`); the caller then runs the reference. ``out`` is as in
`qlinear.kernels.tf_quantize`: None, or the checked C-contiguous array of x3's shape to write into and return.
The per-slice constants are computed with NumPy exactly as the reference computes them, on arrays of ``slices``
elements; only the per-element part runs in numba (`_tf_quantize_extra_numba`).
"""

from __future__ import annotations

import numpy as np

from ..reference import tf_quantize as ref
from . import threads
from .quantize_linear import kernels_enabled
from .tf_quantize import _cached, _empty, _limits, _range_key

F32, F64 = np.float32, np.float64
_compiled = None


def _numba():
    global _compiled
    if _compiled is None:
        from . import _tf_quantize_extra_numba

        _compiled = _tf_quantize_extra_numba
    return _compiled


def _items(shape):
    """(items, elements per item) of the walk the kernels take (see `_tf_quantize_extra_numba`)."""
    pre, slices, post = shape
    if slices == 1:
        return pre * post, 1
    if post == 1:
        return pre, slices
    return pre * slices, post


# Per-slice constants kept between calls, as in `qlinear.kernels.tf_quantize` (see the comment there; the same
# bounds and the same exact-bits keys).
_quantize_strict_cache: dict[tuple, tuple] = {}
_dequantize_cache: dict[tuple, tuple] = {}


def _quantize_strict_constants(min_range, max_range, dtype, mode, round_mode, narrow_range, ensure_minimum_range,
                               slices):
    """(p, code, q_min, out_min, out_max) for `_tf_quantize_extra_numba.quantize_strict`, computed as the
    reference computes them; None for a mode without a kernel."""
    nb = _numba()
    lo, hi = _limits(dtype)
    p = np.zeros((slices, 4), F64)
    q_min = F64(lo)
    with np.errstate(all="ignore"):
        min_r, max_r = ref.adjust_range(min_range, max_range, F32(ensure_minimum_range))
        min_r = np.broadcast_to(min_r, (slices,)).astype(F32)
        max_r = np.broadcast_to(max_r, (slices,)).astype(F32)
        out_min, out_max = min_r, max_r
        if mode == ref.MIN_COMBINED:  # _min_combined_strict
            lo_s, hi_s = min_r.astype(F64), max_r.astype(F64)
            width = hi_s - lo_s
            p[:, 0], p[:, 1], p[:, 2], p[:, 3] = lo_s, hi_s, np.where(width > 0, width, 0), F64(hi - lo)
            code = nb.QS_COMBINED
        elif mode == ref.MIN_FIRST:  # _min_first_strict
            bits = dtype.itemsize * 8
            lo_s, hi_s = min_r.astype(F64), max_r.astype(F64)
            width = hi_s - lo_s
            rs = np.where(width > 0, (2.0**bits - 1.0) / np.where(width > 0, width, 1), 0)
            p[:, 0], p[:, 1] = rs, ref._round_half_away(lo_s * rs)
            code = nb.QS_FIRST
        elif mode == ref.SCALED:  # _scaled, strict branch: the scale is the kernel's float32 one
            min_out = lo + (1 if narrow_range else 0)
            min_out_f, max_out_f = F32(min_out), F32(hi)
            from_min = np.where(ref._ftz(min_out_f * min_r) > 0, ref._ftz(min_out_f / min_r), ref.FLT_MAX)
            from_max = np.where(ref._ftz(max_out_f * max_r) > 0, ref._ftz(max_out_f / max_r), ref.FLT_MAX)
            scale = ref._cpp_min(from_min, from_max).astype(F32)
            out_min, out_max = ref._ftz(min_out_f / scale), ref._ftz(max_out_f / scale)
            p[:, 0] = scale.astype(F64)
            q_min = F64(min_out)
            code = nb.QS_SCALED_EVEN if round_mode == ref.HALF_TO_EVEN else nb.QS_SCALED_AWAY
        else:
            return None
    return p, np.int64(code), q_min, np.asarray(out_min, F32).reshape(-1), np.asarray(out_max, F32).reshape(-1)


def quantize_v2_strict(x3, min_range, max_range, dtype, mode, round_mode, narrow_range, ensure_minimum_range,
                       out=None):
    if not kernels_enabled():
        return None
    dtype = np.dtype(dtype)
    pre, slices, post = x3.shape
    min_range, max_range = np.asarray(min_range, F32).reshape(-1), np.asarray(max_range, F32).reshape(-1)
    ensure = F32(ensure_minimum_range)
    key = _range_key(dtype, mode, round_mode, bool(narrow_range), ensure.tobytes(),
                     min_range=min_range, max_range=max_range, slices=slices)
    constants = _cached(_quantize_strict_cache, key, lambda: _quantize_strict_constants(
        min_range, max_range, dtype, mode, round_mode, narrow_range, ensure, slices))
    if constants is None:
        return None
    p, code, q_min, out_min, out_max = constants
    x = np.ascontiguousarray(x3, F32).reshape(-1)
    if out is None:
        out = _empty(x3.shape, dtype)
    if x.size:
        items, size = _items(x3.shape)
        threads.run_chunked(_numba().quantize_strict, items, x, out.reshape(-1), p, slices, post, code, q_min,
                            F64(_limits(dtype)[1]), item_size=size)
    # copies: the caller hands them to the user, and the cached ones must not change
    return out, out_min.copy(), out_max.copy()


def _dequantize_constants(min_range, max_range, qtype, mode, narrow_range, strict, slices):
    """strict: (p, code) for `dequantize_strict`; else (a, b, half) for `dequantize_bf16`; computed as the
    reference computes them. None for a mode without a kernel."""
    nb = _numba()
    lo, hi = _limits(qtype)
    mins = np.broadcast_to(np.asarray(min_range, F32).reshape(-1), (slices,))
    maxs = np.broadcast_to(np.asarray(max_range, F32).reshape(-1), (slices,))
    with np.errstate(all="ignore"):
        if strict:  # _dequantize_strict
            mn, mx = mins.astype(F64), maxs.astype(F64)
            p = np.zeros((slices, 2), F64)
            if mode in (ref.MIN_COMBINED, ref.MIN_FIRST):
                p[:, 0], p[:, 1] = mn, (mx - mn) / F64(hi - lo)
                code = nb.DQS_LINEAR
            elif mode == ref.SCALED:
                scale = mx / hi
                if lo < 0:
                    scale = np.maximum(mn / (lo + (1 if narrow_range else 0)), scale)
                p[:, 0] = scale
                code = nb.DQS_SCALED
            else:
                return None
            return p, np.int64(code)
        if mode != ref.MIN_COMBINED:  # bfloat16 output exists for MIN_COMBINED only (validated by the caller)
            return None
        # the MIN_COMBINED constants of reference.dequantize, with its DAZ on the ranges
        mn, mx = ref._ftz(mins), ref._ftz(maxs)
        denom = F32(F32(hi) - F32(lo))
        scale = ref._ftz(ref._ftz(mx - mn) / denom)
        half = F32(F32(denom + F32(1)) / F32(2)) if lo < 0 else F32(0)
        return np.ascontiguousarray(scale, F32), np.ascontiguousarray(mn, F32), half


def dequantize(q3, min_range, max_range, mode, narrow_range, strict, out_dtype, out=None):
    out_dtype = np.dtype(out_dtype)
    bf16 = out_dtype != np.dtype(F32)
    if not kernels_enabled() or not (strict or bf16):
        return None
    pre, slices, post = q3.shape
    key = _range_key(q3.dtype, mode, bool(narrow_range), bool(strict),
                     min_range=min_range, max_range=max_range, slices=slices)
    constants = _cached(_dequantize_cache, key, lambda: _dequantize_constants(
        min_range, max_range, q3.dtype, mode, narrow_range, strict, slices))
    if constants is None:
        return None
    q = np.ascontiguousarray(q3).reshape(-1)
    if out is None:
        out = _empty(q3.shape, out_dtype)
    flat_out = out.reshape(-1).view(np.uint16) if bf16 else out.reshape(-1)
    items, size = _items(q3.shape)
    if q.size:
        nb = _numba()
        if strict:
            p, code = constants
            threads.run_chunked(nb.dequantize_strict, items, q, flat_out, p, slices, post, code,
                                F64(_limits(q3.dtype)[0]), bool(bf16), item_size=size)
        else:
            a, b, half = constants
            threads.run_chunked(nb.dequantize_bf16, items, q, flat_out, a, b, half, slices, post, item_size=size)
    return out
