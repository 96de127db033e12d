"""The numba half of `qlinear.kernels.quantize_linear` (see its docstring for the arithmetic).

Imported on the first kernel call, never by ``import qlinear``: importing numba alone takes longer
than the whole import budget. Every function is compiled lazily and cached on disk.
"""

from __future__ import annotations

import numpy as np
from qlinear.kernels import ensure_fresh_numba_cache

ensure_fresh_numba_cache()  # before any cached kernel loads
from numba import njit  # noqa: E402
from numba.core import types as nbtypes
from numba.extending import overload

from .small_float import (
    bf16_bits_to_f32,
    decode_small_float,
    encode_small_float,
    f16_bits_to_f32,
    f32_to_bf16_bits,
    f32_to_f16_bits,
    f32_round_to_odd,
    round_to_bf16,
    round_to_f16,
)
from ._prefetch import BLOCK, prefetch_ahead
from ._vector_width import use_512_bit_vectors


_JIT = dict(cache=True, nogil=True, error_model="numpy")


def load_value(v):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


@overload(load_value, jit_options=_JIT)
def _load_value(v):
    """An x element widened exactly: float32 as is, float16/bfloat16 bits to float32, int32 to float64."""
    if v == nbtypes.float32:
        return lambda v: v
    if v == nbtypes.uint16:
        return lambda v: f16_bits_to_f32(v)
    if v == nbtypes.int16:
        return lambda v: bf16_bits_to_f32(v)
    if v == nbtypes.int32:
        return lambda v: np.float64(v)
    return None


def to_precision(v, tag):  # pragma: no cover
    raise NotImplementedError


@overload(to_precision, jit_options=_JIT)
def _to_precision(v, tag):
    """A widened value rounded to the division precision, held in float32 (float64 for float64).

    From float64 (int32 x) to float16/bfloat16 through float32 rounded to odd: one correct rounding."""
    if tag == nbtypes.float32:
        return lambda v, tag: np.float32(v)
    if tag == nbtypes.float64:
        return lambda v, tag: np.float64(v)
    if tag == nbtypes.uint16:
        return lambda v, tag: round_to_f16(f32_round_to_odd(v))
    if tag == nbtypes.int16:
        return lambda v, tag: round_to_bf16(f32_round_to_odd(v))
    return None


def from_f32(v, out):  # pragma: no cover
    raise NotImplementedError


@overload(from_f32, jit_options=_JIT)
def _from_f32(v, out):
    """A float32 result in the output array's encoding (uint16: float16 bits, int16: bfloat16 bits)."""
    if out.dtype == nbtypes.float32:
        return lambda v, out: v
    if out.dtype == nbtypes.uint16:
        return lambda v, out: f32_to_f16_bits(v)
    if out.dtype == nbtypes.int16:
        return lambda v, out: np.int16(f32_to_bf16_bits(v))
    return None


def dq_value(v, zv, mask, sign, decoder):  # pragma: no cover
    raise NotImplementedError


@overload(dq_value, jit_options=_JIT)
def _dq_value(v, zv, mask, sign, decoder):
    """float32(x - zero point), exact before the conversion. ``decoder``: `decode_small_float`'s arguments
    for float8/6/4 x (float32 zero point), an empty tuple for integer x."""
    if zv == nbtypes.float32:
        return lambda v, zv, mask, sign, decoder: np.float32(decode_small_float(v, *decoder) - zv)
    if zv == nbtypes.int32:  # at most 16 bits: the difference fits int32
        def impl(v, zv, mask, sign, decoder):
            code = np.int32(np.int32(v) & mask)
            return np.float32(np.int32(np.int32(np.int32(code ^ sign) - sign) - zv))
        return impl
    if zv == nbtypes.int64:
        return lambda v, zv, mask, sign, decoder: np.float32(np.int64(np.int64(v) - zv))
    return None

# -- quantize, integer output
def round_to_int(q):  # pragma: no cover - replaced by the overload inside numba
    raise NotImplementedError


@overload(round_to_int, jit_options=_JIT)
def _round_to_int(q):
    """rint to an integer that holds every clamped result: int32 from float32 (one ``vcvtps2dq``), int64
    from float64 (int32 outputs, whose shifted bounds may leave int32)."""
    if q == nbtypes.float32:
        return lambda q: np.int32(np.rint(q))
    if q == nbtypes.float64:
        return lambda q: np.int64(np.rint(q))
    return None


@njit(**_JIT)
def _q_int_one(xv, sv, zv, tag, lo, hi, mask):
    q = to_precision(to_precision(load_value(xv), tag) / sv, tag)
    # Clamp before rounding, to bounds shifted by the zero point (exact: small integers in the carrier).
    # rint is monotonic and the bounds are integers, so this equals clamp(rint(q) + zp, lo, hi), with
    # fewer instructions (LLVM fuses rint and the conversion); NaN fails ``q > low`` and gives lo.
    low = lo - zv
    high = hi - zv
    q = q if q > low else low
    q = q if q < high else high
    return np.int32(np.int32(round_to_int(q) + round_to_int(zv)) & mask)


@njit(**_JIT)
def _q_int_run(x, out, i, n, sv, zv, tag, lo, hi, mask):
    """out[i:i + n] from x[i:i + n] with one scale and zero point, in blocks with the input prefetched ahead."""
    use_512_bit_vectors()
    # slices starting at 0 and unsigned offsets let LLVM see non-negative indices (no wraparound check)
    xs, os = x[i:i + n], out[i:i + n]
    for b in range(0, n, BLOCK):
        m = min(BLOCK, n - b)
        prefetch_ahead(x, i + b, m)
        u = np.uint64(b)
        for k in range(m):
            os[u + np.uint64(k)] = _q_int_one(xs[u + np.uint64(k)], sv, zv, tag, lo, hi, mask)


@njit(**_JIT)
def _q_int_walk(x, s, zp, out, row_len, seg_len, per_element, rL, rA, rB, rC, tag, lo, hi, mask, start, stop):
    use_512_bit_vectors()
    i = start
    r = i // row_len
    j = i - r * row_len
    while i < stop:  # one row per turn; the divisions run once per row, not per segment
        off = (r // rL) * rA + ((r % rL) // rB) * rC
        end = min(row_len, j + (stop - i))
        if per_element:
            n = end - j
            xs, os, ss, zs = x[i:i + n], out[i:i + n], s[off + j:off + j + n], zp[off + j:off + j + n]
            for b in range(0, n, BLOCK):
                m = min(BLOCK, n - b)
                prefetch_ahead(x, i + b, m)
                u = np.uint64(b)
                for k in range(m):
                    e = u + np.uint64(k)
                    os[e] = _q_int_one(xs[e], ss[e], zs[e], tag, lo, hi, mask)
            i += n
        else:
            seg = j // seg_len
            while j < end:
                n = min(end, (seg + 1) * seg_len) - j
                if n == seg_len and seg_len <= BLOCK:
                    # a run of short whole segments (blocked along the last axis): one pair of slices for the
                    # whole run, indexed with unsigned offsets, so the per-block loops vectorise. Slicing per
                    # block cost ~28 cycles a block in numba's reference counting: f32 -> int8 in blocks of 32,
                    # 16M elements on 1 thread, 7.7 -> 4.9 ms. The input's lines are requested ahead once per
                    # BLOCK elements, as in `_q_int_run` (see `_prefetch` for the measurements).
                    count = (end - j) // seg_len
                    n = count * seg_len
                    xs, os = x[i:i + n], out[i:i + n]
                    ahead = 0
                    for c in range(count):
                        sv = s[off + seg + c]
                        zv = zp[off + seg + c]
                        if c * seg_len >= ahead:
                            prefetch_ahead(x, i + ahead, BLOCK)
                            ahead += BLOCK
                        b = np.uint64(c * seg_len)
                        for k in range(seg_len):
                            os[b + np.uint64(k)] = _q_int_one(xs[b + np.uint64(k)], sv, zv, tag, lo, hi, mask)
                    seg += count
                else:
                    _q_int_run(x, out, i, n, s[off + seg], zp[off + seg], tag, lo, hi, mask)
                    seg += 1
                i += n
                j += n
        r += 1
        j = 0


# -- quantize, float8/6/4 output
# How the zero point is added, chosen by the argument's type (so at compile time: a runtime choice left a
# branch in every vector iteration): none; + 0 when every zero point is +0 (which still turns -0 into +0, as
# the reference's addition does; the zero points are never read, so the driver converts none); the plain sum,
# when no zero point is NaN (a NaN quotient is then the sum whichever operand LLVM puts first); the quotient
# where it is NaN (NaN + NaN: x86 returns the first operand, as the reference gets it, and LLVM may commute
# the addition).
ZP_NONE, ZP_ZERO, ZP_ADD, ZP_ADD_NAN = None, np.int16(0), np.int8(0), np.uint8(0)


def add_zero_point(q, zv, rule, tag):  # pragma: no cover
    raise NotImplementedError


@overload(add_zero_point, jit_options=_JIT)
def _add_zero_point(q, zv, rule, tag):
    if isinstance(rule, nbtypes.NoneType):
        return lambda q, zv, rule, tag: q
    if rule == nbtypes.int16:  # q's own type: a float64 0 would widen a float32 q
        if q == nbtypes.float32:
            return lambda q, zv, rule, tag: to_precision(q + np.float32(0), tag)
        return lambda q, zv, rule, tag: to_precision(q + np.float64(0), tag)
    if rule == nbtypes.int8:
        return lambda q, zv, rule, tag: to_precision(q + zv, tag)
    if rule == nbtypes.uint8:
        return lambda q, zv, rule, tag: q if q != q else to_precision(q + zv, tag)
    return None


@njit(**_JIT)
def _q_float_one(xv, sv, zv, tag, add_zp, fmt):
    q = to_precision(to_precision(load_value(xv), tag) / sv, tag)
    return encode_small_float(f32_round_to_odd(add_zero_point(q, zv, add_zp, tag)), *fmt)


@njit(**_JIT)
def _q_float_run(x, out, i, n, sv, zv, tag, add_zp, fmt):
    """out[i:i + n] from x[i:i + n] with one scale and zero point (see `_q_int_run`)."""
    use_512_bit_vectors()
    xs, os = x[i:i + n], out[i:i + n]
    for b in range(0, n, BLOCK):
        m = min(BLOCK, n - b)
        prefetch_ahead(x, i + b, m)
        u = np.uint64(b)
        for k in range(m):
            os[u + np.uint64(k)] = _q_float_one(xs[u + np.uint64(k)], sv, zv, tag, add_zp, fmt)


@njit(**_JIT)
def _q_float_walk(x, s, zp, out, row_len, seg_len, per_element, rL, rA, rB, rC, tag, add_zp,
                  fmt, start, stop):
    use_512_bit_vectors()
    i = start
    r = i // row_len
    j = i - r * row_len
    while i < stop:  # one row per turn; the divisions run once per row, not per segment
        off = (r // rL) * rA + ((r % rL) // rB) * rC
        end = min(row_len, j + (stop - i))
        if per_element:
            n = end - j
            xs, os, ss, zs = x[i:i + n], out[i:i + n], s[off + j:off + j + n], zp[off + j:off + j + n]
            for b in range(0, n, BLOCK):
                m = min(BLOCK, n - b)
                prefetch_ahead(x, i + b, m)
                u = np.uint64(b)
                for k in range(m):
                    e = u + np.uint64(k)
                    os[e] = _q_float_one(xs[e], ss[e], zs[e], tag, add_zp, fmt)
            i += n
        else:
            seg = j // seg_len
            while j < end:
                n = min(end, (seg + 1) * seg_len) - j
                if n == seg_len and seg_len <= BLOCK:  # a run of short whole segments (see _q_int_walk)
                    count = (end - j) // seg_len
                    n = count * seg_len
                    xs, os = x[i:i + n], out[i:i + n]
                    ahead = 0
                    for c in range(count):
                        sv = s[off + seg + c]
                        zv = zp[off + seg + c]
                        if c * seg_len >= ahead:
                            prefetch_ahead(x, i + ahead, BLOCK)
                            ahead += BLOCK
                        b = np.uint64(c * seg_len)
                        for k in range(seg_len):
                            os[b + np.uint64(k)] = _q_float_one(xs[b + np.uint64(k)], sv, zv, tag, add_zp, fmt)
                    seg += count
                else:
                    _q_float_run(x, out, i, n, s[off + seg], zp[off + seg], tag, add_zp, fmt)
                    seg += 1
                i += n
                j += n
        r += 1
        j = 0


# -- dequantize
@njit(**_JIT)
def _dq_product(dx, sv):
    # NaN * NaN: NumPy returns the first operand's NaN; LLVM may commute the multiplication, so say so
    return dx if dx != dx else np.float32(dx * sv)


@njit(**_JIT)
def _dq_run(x, out, i, n, sv, zv, mask, sign, decoder):
    """out[i:i + n] from x[i:i + n] with one scale and zero point (see `_q_int_run`)."""
    use_512_bit_vectors()
    xs, os = x[i:i + n], out[i:i + n]
    for b in range(0, n, BLOCK):
        m = min(BLOCK, n - b)
        prefetch_ahead(x, i + b, m)
        prefetch_ahead(out, i + b, m, True)
        u = np.uint64(b)
        for k in range(m):
            e = u + np.uint64(k)
            os[e] = from_f32(_dq_product(dq_value(xs[e], zv, mask, sign, decoder), sv), os)


@njit(**_JIT)
def _dq_walk(x, s, zp, out, row_len, seg_len, per_element, rL, rA, rB, rC, mask, sign, decoder, start, stop):
    use_512_bit_vectors()
    i = start
    r = i // row_len
    j = i - r * row_len
    while i < stop:  # one row per turn; the divisions run once per row, not per segment
        off = (r // rL) * rA + ((r % rL) // rB) * rC
        end = min(row_len, j + (stop - i))
        if per_element:
            n = end - j
            xs, os, ss, zs = x[i:i + n], out[i:i + n], s[off + j:off + j + n], zp[off + j:off + j + n]
            for b in range(0, n, BLOCK):
                m = min(BLOCK, n - b)
                prefetch_ahead(x, i + b, m)
                prefetch_ahead(out, i + b, m, True)
                u = np.uint64(b)
                for k in range(m):
                    e = u + np.uint64(k)
                    os[e] = from_f32(_dq_product(dq_value(xs[e], zs[e], mask, sign, decoder), ss[e]), os)
            i += n
        else:
            seg = j // seg_len
            while j < end:
                n = min(end, (seg + 1) * seg_len) - j
                if n == seg_len and seg_len <= BLOCK:  # a run of short whole segments (see _q_int_walk)
                    count = (end - j) // seg_len
                    n = count * seg_len
                    xs, os = x[i:i + n], out[i:i + n]
                    ahead = 0
                    for c in range(count):
                        sv = s[off + seg + c]
                        zv = zp[off + seg + c]
                        if c * seg_len >= ahead:
                            prefetch_ahead(x, i + ahead, BLOCK)
                            prefetch_ahead(out, i + ahead, BLOCK, True)
                            ahead += BLOCK
                        b = np.uint64(c * seg_len)
                        for k in range(seg_len):
                            os[b + np.uint64(k)] = from_f32(
                                _dq_product(dq_value(xs[b + np.uint64(k)], zv, mask, sign, decoder), sv), os)
                    seg += count
                else:
                    _dq_run(x, out, i, n, s[off + seg], zp[off + seg], mask, sign, decoder)
                    seg += 1
                i += n
                j += n
        r += 1
        j = 0


# -- parameters
@njit(**_JIT)
def _widen_codes_serial(codes, table, out, start, stop):
    """out[i] = table[codes[i]]: a 1-byte parameter array through its 256-entry conversion table."""
    use_512_bit_vectors()
    cs, os = codes[start:stop], out[start:stop]
    for i in range(cs.size):
        os[i] = table[cs[i]]
