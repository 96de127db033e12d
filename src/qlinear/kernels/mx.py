"""Fast microscaling kernels (MX and NVFP4), bit-identical to `qlinear.reference.mx`.

Internal API, called by `qlinear.mx` with validated arguments, x float32 with its blocks along the last
axis (any layout: a copy makes it C-contiguous):

``quantize_mx(x, fmt, rule)`` -> (codes, E8M0 scales) or None
``dequantize_mx(codes, scales, fmt)`` -> float32 or None
``quantize_nvfp4(x, g=None, rule=None)`` -> (codes, E4M3 block scales, float32 tensor scale) or None (g: a given
    tensor scale; rule "modelopt": Model Optimizer's NVFP4)
``dequantize_nvfp4(codes, block_scales, g)`` -> float32 or None
``nvfp4_amax(x, rule=None)`` -> the maximum NVFP4's tensor scale comes from (`reference.mx.nvfp4_amax`) or None
    None when no kernel runs (numba missing, or the kernels switched off with
    `qlinear.kernels.quantize_linear.use_kernels(False)`, the switch every element-wise kernel obeys); the
    caller then runs the reference.

How the arithmetic stays the reference's (`_mx_numba` has the details):
    - Block maxima are integer maxima of the magnitudes' float32 bits; a maximum >= 0x7F800000 means the block
      holds an Inf or a NaN (MX: scale 0xFF, codes +0; NVFP4: block scale NaN, codes +0).
    - The shared exponent comes from the exponent and fraction fields (of float64(amax), where every float32
      is normal): no log2. The ceil rule divides in float32 first, as the reference does.
    - MX elements: v * 2**-e (exact: a power-of-two product, and results below float32's normal range are +-0
      in every element format anyway), then rounded once, half to even, saturating, by the float8/6/4
      encoder of `small_float` (MXINT8: rint(v * 2**-e * 64) clamped to +-127).
    - MX dequantize: code * 2**(e - 6 [MXINT8]) in one float32 multiplication of exact operands (2**t is a
      float32 for t >= -149), the correctly rounded product, as the reference's float64 product rounded once.
    - NVFP4: a first pass reads x for its largest finite magnitude (the tensor scale; with the tensor scale
      given there is none), the second takes, group of blocks by group, the block maxima, the block scales
      ((amax / 6) / g in float32, min 448, E4M3 by the encoder) and the codes, by comparing each magnitude's
      bits with seven float32 thresholds per block that make the reference's exact float64 comparisons with
      midpoint * d (`_nv_threshold`; in float32 with an exact FMA residual where d >= 2**-100,
      `_nv_threshold_fma`, four of the seven by moving exponents: `_nv_limits`).
    - NVFP4 under Model Optimizer's rule: the reference's float32 operations in its order (block scale amax /
      float32(6 g), clamped, E4M3; the quotient x / d; its code by comparisons of its bits), so special values
      go as there; without a given tensor scale, an x holding an Inf or a NaN, or all zeros, gives that rule
      an Inf, NaN or 0 tensor scale, and is left to the reference.
    - Where numba's loops came out scalar or behind an aliasing check (a block's maximum, NVFP4's 16 codes,
      MXINT8's 32 values), small LLVM intrinsics do the same arithmetic on one vector; `_mx_numba` says why
      for each.

Layout: x is viewed as rows of ``row_len`` elements. When the blocks fill the last axis exactly, every block
is whole and contiguous, so the rows are any run of up to 64 blocks (fewer per-row steps); otherwise a row
is x's last axis, whose last block is short. `threads.run_chunked` splits the rows between threads (serial
nogil kernels: concurrent calls are safe under any numba threading layer).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from .. import dtypes
from ..reference.mx import FORMATS, MXFormat, nvfp4_scale_from_amax
from . import output_pool, threads
from ._arguments import read_only
from .quantize_linear import HAVE_NUMBA, kernels_enabled

_compiled = None
_RULES = {"floor": 0, "ceil": 1, "even": 2}
_ROW_BLOCKS = 64  # blocks per row when the blocks fill the last axis


def _numba():
    global _compiled
    if _compiled is None:
        from . import _mx_numba

        _compiled = _mx_numba
    return _compiled


_empty = output_pool.empty_result


def _rows(n: int, k: int, block: int) -> int:
    """The row length the kernels walk x (n elements, last axis k) in."""
    if k % block:
        return k
    return block * math.gcd(n // block, _ROW_BLOCKS)


@functools.lru_cache(maxsize=None)
def _element_args(name: str) -> tuple:
    """(encoder arguments, decoder arguments) of a format's elements; (None, None) for MXINT8."""
    f = FORMATS[name]
    if f.is_int:
        return None, None
    from .small_float import SmallFloatFormat, decode_args

    encoder = SmallFloatFormat.of(f.element)
    if not encoder.signed_zero:  # `_mx_numba.encode_finite` keeps every sign
        raise AssertionError(f"{name}: the MX kernels expect an element type with a signed zero")
    return encoder.args(True), decode_args(f.element)


@functools.lru_cache(maxsize=None)
def _e4m3_args() -> tuple:
    from .small_float import SmallFloatFormat, decode_args

    e4m3 = dtypes.get("float8e4m3fn")
    return SmallFloatFormat.of(e4m3).args(True), decode_args(e4m3)


def _prepare(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    return read_only(x.reshape(-1))


def _scale_shape(shape: tuple, block: int) -> tuple:
    return shape[:-1] + (-(-shape[-1] // block),)


# ----------------------------------------------------------------------------------------------- MX
def quantize_mx(x: np.ndarray, fmt: MXFormat, rule: str):
    if not kernels_enabled() or x.ndim == 0:
        return None
    elem, _ = _element_args(fmt.name)
    n = x.size
    codes = _empty(x.shape, fmt.element.dtype, n)
    scales = np.empty(_scale_shape(x.shape, fmt.block_size), fmt.scale_type.dtype)
    if n == 0:
        return codes, scales
    k = x.shape[-1]
    row_len = _rows(n, k, fmt.block_size)
    threads.run_chunked(_numba().mx_quantize_rows, n // row_len, _prepare(x), codes.reshape(-1).view(np.uint8),
                        scales.reshape(-1).view(np.uint8), row_len, _RULES[rule], np.int32(fmt.emax),
                        np.int32(fmt.mantissa_bits), np.float32(fmt.max_value), elem, item_size=row_len)
    return codes, scales


def dequantize_mx(codes: np.ndarray, scales: np.ndarray, fmt: MXFormat):
    if not kernels_enabled() or codes.ndim == 0:
        return None
    _, elem = _element_args(fmt.name)
    out, walk = _dequantize_walk(codes, scales, fmt.block_size)
    if walk is not None:
        rows, row_len, c, s = walk
        shift = np.int32(6 if fmt.is_int else 0)
        threads.run_chunked(_numba().mx_dequantize_rows, rows, c, s, out.reshape(-1), row_len, shift, elem,
                            item_size=row_len)
    return out


def _dequantize_walk(codes: np.ndarray, scales: np.ndarray, block: int):
    """The output array and (rows, row_len, codes bytes, scale bytes) a dequantize kernel walks; None for the
    walk of an empty array."""
    n = codes.size
    out = _empty(codes.shape, np.float32, n)
    if n == 0:
        return out, None
    row_len = _rows(n, codes.shape[-1], block)
    flat = [read_only(np.ascontiguousarray(a).reshape(-1).view(np.uint8)) for a in (codes, scales)]
    return out, (n // row_len, row_len, *flat)


# ----------------------------------------------------------------------------------------------- NVFP4
def _tensor_amax(x: np.ndarray, row_len: int, rule: str | None):
    """NVFP4's pass 1 over x (flat float32, rows of ``row_len``): the maximum its tensor scale comes from, as
    `reference.mx.nvfp4_amax` under ``rule`` (the largest finite magnitude), or None under "modelopt" for an
    x holding an Inf or a NaN (Model Optimizer's maximum is then Inf or NaN: the reference's)."""
    rows = x.size // row_len
    top, every = np.zeros(rows, np.int32), np.zeros(rows, np.int32)
    threads.run_chunked(_numba().nv_finite_max_rows, rows, x, top, every, row_len, item_size=row_len)
    if rule == "modelopt" and every.max() >= 0x7F800000:
        return None
    return top.max().view(np.float32)


def nvfp4_amax(x: np.ndarray, rule: str | None = None):
    """`reference.mx.nvfp4_amax(x, rule)` by the first pass of `quantize_nvfp4`, or None where no kernel runs
    (and, under "modelopt", for an x holding an Inf or a NaN, whose maximum is then the reference's)."""
    if not kernels_enabled() or x.ndim == 0 or x.size == 0 or rule not in (None, "modelopt"):
        return None
    return _tensor_amax(_prepare(x), _rows(x.size, x.shape[-1], FORMATS["nvfp4"].block_size), rule)


def quantize_nvfp4(x: np.ndarray, g=None, rule: str | None = None):
    """(codes, block scales, tensor scale); ``g``: a given float32 tensor scale (one pass over x) instead of
    the one from x's maximum (two passes: the maximum needs all of x before any block scale). ``rule``:
    None (the exact rule) or "modelopt" (`reference.mx.quantize_nvfp4_modelopt`); under "modelopt" a tensor
    scale from an x holding an Inf or a NaN, or one that is 0, is left to the reference (None)."""
    if not kernels_enabled() or x.ndim == 0 or rule not in (None, "modelopt"):
        return None
    fmt = FORMATS["nvfp4"]
    n = x.size
    if n == 0:
        scales = np.empty(_scale_shape(x.shape, fmt.block_size), fmt.scale_type.dtype)
        return (_empty(x.shape, fmt.element.dtype, 0), scales,
                nvfp4_scale_from_amax(np.float32(0), rule) if g is None else np.float32(g))
    k = x.shape[-1]
    row_len = _rows(n, k, fmt.block_size)
    rows = n // row_len
    xin = _prepare(x)
    nb = _numba()
    if g is None:  # pass 1
        amax = _tensor_amax(xin, row_len, rule)
        if amax is None:
            return None  # Model Optimizer's tensor scale is then Inf or NaN
        g = nvfp4_scale_from_amax(amax, rule)  # by the reference's own rule
        if g == 0:
            return None  # under "modelopt" (the exact rule makes it 1): every block scale NaN or Inf
    g = np.float32(g)
    codes = _empty(x.shape, fmt.element.dtype, n)
    scales = np.empty(_scale_shape(x.shape, fmt.block_size), fmt.scale_type.dtype)
    threads.run_chunked(nb.nv_quantize_rows, rows, xin, codes.reshape(-1).view(np.uint8),
                        scales.reshape(-1).view(np.uint8), row_len, g, _e4m3_args()[0], rule == "modelopt",
                        item_size=row_len)
    return codes, scales, g


def dequantize_nvfp4(codes: np.ndarray, block_scales: np.ndarray, g):
    if not kernels_enabled() or codes.ndim == 0:
        return None
    out, walk = _dequantize_walk(codes, block_scales, FORMATS["nvfp4"].block_size)
    if walk is not None:
        rows, row_len, c, s = walk
        _, e2m1_decode = _element_args("mxfp4")
        _, e4m3_decode = _e4m3_args()
        threads.run_chunked(_numba().nv_dequantize_rows, rows, c, s, out.reshape(-1), row_len, np.float32(g),
                            e2m1_decode, e4m3_decode, item_size=row_len)
    return out


__all__ = ["HAVE_NUMBA", "quantize_mx", "dequantize_mx", "quantize_nvfp4", "dequantize_nvfp4", "nvfp4_amax"]
