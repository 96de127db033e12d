"""Exact float conversions by bit manipulation, for the element-wise numba kernels.

Every rounding here is round-half-to-even and equals, bit for bit, what the NumPy reference gets from
NumPy (float16) and ml_dtypes (bfloat16, float8/6/4); tests/kernels/test_small_float_kernels.py checks
each one exhaustively or on a dense sweep around every rounding boundary.

- float16/bfloat16 bits -> float32: exact widening.
- `round_to_f16` / `round_to_bf16`: a float32 rounded to the nearest float16/bfloat16 value, kept in a
  float32 (how the kernels compute in float16/bfloat16 precision: one float32 operation rounded once to
  the narrow type is the correctly rounded narrow operation, since 24 >= 2 * 11 + 2).
- `f32_to_f16_bits` / `f32_to_bf16_bits`: the stored encodings, NaN included (NumPy keeps a float16 NaN's
  sign and top payload bits; ml_dtypes makes every bfloat16 NaN the quiet NaN with the input's sign).
- `encode_small_float`: float32 -> float8/float6/float4 code (one byte, code in the low bits, as
  ml_dtypes stores them), with the format's parameters passed as numbers (see `SmallFloatFormat`), so
  one compiled loop serves every format and stays branch-free enough to vectorise.
  ml_dtypes converts a float64 by rounding it to float32 first; the kernels do the same.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..dtypes import ElementType

try:
    from numba import njit
except ImportError:  # pragma: no cover - numba is a dependency; the reference path still works without it
    njit = None

_U32 = np.uint32
_SIGN = np.uint32(0x80000000)
_ABS = np.uint32(0x7FFFFFFF)
_INF = np.uint32(0x7F800000)
_F16_MIN_NORMAL = np.uint32(0x38800000)  # 2**-14
_F16_OVERFLOW = np.uint32(0x47800000)  # 65536: rounding reaches it only from >= 65520, which is Inf
_TWO_24 = np.float32(2.0**24)
_TWO_M24 = np.float32(2.0**-24)


@dataclass(frozen=True)
class SmallFloatFormat:
    """A float8/float6/float4 format as numbers for `encode_small_float`, read off ml_dtypes.

    Codes are magnitudes (the byte without the sign bit) except the ``*_pos``/``*_neg`` bytes, which
    are whole encodings.
    """

    mbits: int  # mantissa bits
    bias: int  # exponent bias (smallest normal is 2**(1 - bias))
    max_code: int  # magnitude code of the largest finite value
    sign_shift: int  # bit position of the sign
    overflow_pos: int  # byte for a value beyond max_code when not saturating (NaN or Inf)
    overflow_neg: int
    nan_pos: int  # byte for NaN
    nan_neg: int
    signed_zero: bool  # False for the FNUZ types: -0 encodes as +0

    @classmethod
    def of(cls, target: ElementType) -> "SmallFloatFormat":
        return _format_of(target)

    @classmethod
    def _read(cls, target: ElementType) -> "SmallFloatFormat":
        import ml_dtypes

        info = ml_dtypes.finfo(target.dtype)
        top = float(info.max)

        def byte(value):
            with np.errstate(invalid="ignore", over="ignore"):
                return int(np.array([value], np.float32).astype(target.dtype).view(np.uint8)[0])

        nan_pos, nan_neg = byte(np.nan), byte(-np.nan)
        if target.kind != "float8":
            # float4/float6 have no NaN: the reference maps NaN to +max (qlinear.reference.small_float).
            nan_pos = nan_neg = byte(top)
        return cls(
            mbits=int(info.nmant),
            bias=1 - int(info.minexp),
            max_code=byte(top),
            sign_shift=target.bits - 1,
            overflow_pos=byte(np.inf),
            overflow_neg=byte(-np.inf),
            nan_pos=nan_pos,
            nan_neg=nan_neg,
            signed_zero=byte(-0.0) != 0,
        )

    def args(self, saturate: bool) -> tuple:
        """The arguments of `encode_small_float` after the value: every shift and power of two precomputed,
        so that the loop needs no variable shifts (which would keep LLVM from using 32-bit vector lanes)."""
        # float4/float6 always saturate (their Inf maps to +/-max in the reference, whatever `saturate` says).
        overflow_pos, overflow_neg = self.overflow_pos, self.overflow_neg
        if saturate or self.sign_shift < 7:
            overflow_pos = self.max_code
            overflow_neg = self.max_code | (1 << self.sign_shift)
        shift = 23 - self.mbits  # float32 mantissa bits dropped
        return (
            np.int32((1 << (shift - 1)) - 1),  # half an ulp of the target, minus one
            np.int32(1 << shift),  # the target's last mantissa bit, in float32 bits
            np.float32(2.0**-shift),  # bits -> code scale (exact: the rounded bits have their low bits zero)
            np.int32((127 - self.bias) << self.mbits),  # exponent re-bias, in code units
            np.float32(2.0 ** (self.mbits + self.bias - 1)),  # subnormal value -> code scale
            np.int32((128 - self.bias) << 23),  # float32 bits of the smallest normal 2**(1 - bias)
            np.int32(self.max_code),
            np.int32(1 << self.sign_shift),
            np.uint8(overflow_pos), np.uint8(overflow_neg), np.uint8(self.nan_pos), np.uint8(self.nan_neg),
            bool(self.signed_zero),
        )


@functools.lru_cache(maxsize=None)
def _format_of(target: ElementType) -> SmallFloatFormat:
    return SmallFloatFormat._read(target)


if njit is not None:

    @njit(cache=True, nogil=True)
    def f16_bits_to_f32(h):
        h = np.uint32(h) & _U32(0xFFFF)
        sign = (h & _U32(0x8000)) << _U32(16)
        exponent = (h >> _U32(10)) & _U32(0x1F)
        mantissa = h & _U32(0x3FF)
        # normal and Inf/NaN by re-biasing the exponent; subnormal as mantissa * 2**-24 (exact)
        normal = _U32(sign | ((exponent + _U32(112)) << _U32(23)) | (mantissa << _U32(13)))
        special = _U32(sign | _INF | (mantissa << _U32(13)))
        bits = special if exponent == _U32(31) else normal
        value = _U32(bits).view(np.float32)
        if exponent == _U32(0):
            value = np.float32(np.float32(mantissa) * _TWO_M24)
            if sign != _U32(0):
                value = -value
        return value

    @njit(cache=True, nogil=True)
    def bf16_bits_to_f32(h):
        return _U32((np.uint32(h) & _U32(0xFFFF)) << _U32(16)).view(np.float32)

    @njit(cache=True, nogil=True)
    def round_to_bf16(v):
        """The bfloat16 value nearest to float32 ``v`` (ties to even), as a float32; NaN unchanged."""
        bits = np.float32(v).view(np.uint32)
        rounded = _U32(_U32(bits + _U32(0x7FFF) + ((bits >> _U32(16)) & _U32(1))) & _U32(0xFFFF0000))
        if (bits & _ABS) > _INF:
            rounded = bits
        return np.uint32(rounded).view(np.float32)

    @njit(cache=True, nogil=True)
    def f32_to_bf16_bits(v):
        bits = np.float32(v).view(np.uint32)
        code = _U32(_U32(bits + _U32(0x7FFF) + ((bits >> _U32(16)) & _U32(1))) >> _U32(16))
        if (bits & _ABS) > _INF:
            code = _U32(((bits >> _U32(16)) & _U32(0x8000)) | _U32(0x7FC0))
        return np.uint16(code)

    @njit(cache=True, nogil=True)
    def _f16_magnitude_code(magnitude_bits):
        """float16 code (without sign) of a finite non-negative float32, ties to even; > 0x7C00 on overflow."""
        normal = _U32(
            (_U32(magnitude_bits + _U32(0xFFF) + ((magnitude_bits >> _U32(13)) & _U32(1))) >> _U32(13))
            - _U32(112 << 10)
        )
        # below 2**-14: multiples of 2**-24; scaling by 2**24 is exact and rint rounds half to even
        subnormal = _U32(np.rint(np.uint32(magnitude_bits).view(np.float32) * _TWO_24))
        return subnormal if magnitude_bits < _F16_MIN_NORMAL else normal

    @njit(cache=True, nogil=True)
    def round_to_f16(v):
        """The float16 value nearest to float32 ``v`` (ties to even, overflow to Inf), as a float32."""
        bits = np.float32(v).view(np.uint32)
        magnitude = _U32(bits & _ABS)
        sign = _U32(bits & _SIGN)
        normal = _U32(_U32(magnitude + _U32(0xFFF) + ((magnitude >> _U32(13)) & _U32(1))) & _U32(0xFFFFE000))
        if normal >= _F16_OVERFLOW:
            normal = _INF
        value = _U32(normal | sign).view(np.float32)
        if magnitude < _F16_MIN_NORMAL:
            value = np.float32(np.rint(np.float32(v) * _TWO_24) * _TWO_M24)  # keeps the sign, -0 included
        if magnitude > _INF:
            value = np.float32(v)
        return value

    @njit(cache=True, nogil=True)
    def f32_to_f16_bits(v):
        bits = np.float32(v).view(np.uint32)
        magnitude = _U32(bits & _ABS)
        sign = _U32((bits >> _U32(16)) & _U32(0x8000))
        code = _f16_magnitude_code(magnitude)
        if code > _U32(0x7C00):
            code = _U32(0x7C00)
        if magnitude > _INF:
            # NumPy's rule: keep the top 10 payload bits; a payload that vanishes becomes 1 (still NaN)
            payload = _U32((magnitude >> _U32(13)) & _U32(0x3FF))
            code = _U32(0x7C00) | (payload if payload != _U32(0) else _U32(1))
        return np.uint16(code | sign)

    @njit(cache=True, nogil=True)
    def encode_small_float(v, half_minus_one, last_bit, code_scale, rebias, subnormal_scale, min_normal, max_code,
                           sign_value, overflow_pos, overflow_neg, nan_pos, nan_neg, signed_zero):
        """The float8/6/4 byte for float32 ``v`` (see `SmallFloatFormat.args` for the parameters).

        Normal range: round the float32 bits half to even at the target's last mantissa bit, then read the
        code off the rounded bits (a carry into the exponent is the correct next binade). Below the
        smallest normal: the codes are multiples of a fixed step; scale exactly by a power of two and rint.
        Codes are continuous in magnitude across the boundary, so overflow is one comparison."""
        magnitude = np.int32(np.float32(v).view(np.int32) & np.int32(0x7FFFFFFF))
        negative = np.float32(v).view(np.int32) < np.int32(0)
        odd = np.int32(1) if (magnitude & last_bit) != np.int32(0) else np.int32(0)
        rounded = np.int32(np.int32(magnitude + half_minus_one + odd) & np.int32(-last_bit))
        normal = np.int32(np.int32(np.float32(rounded) * code_scale) - rebias)
        subnormal = np.int32(np.rint(np.int32(magnitude).view(np.float32) * subnormal_scale))
        code = subnormal if magnitude < min_normal else normal
        sign_bit = sign_value if negative else np.int32(0)
        if not signed_zero and code == np.int32(0):
            sign_bit = np.int32(0)
        result = np.uint8(code | sign_bit)
        if code > max_code:
            result = overflow_neg if negative else overflow_pos
        if magnitude > np.int32(0x7F800000):
            result = nan_neg if negative else nan_pos
        return result

    @njit(cache=True, nogil=True)
    def f32_round_to_odd(v):
        """``v`` (float64 or float32) rounded to float32 *to odd*: truncated, last bit set when inexact.
        Rounding that once more to a type of at most 22 significant bits is the correctly rounded
        result (as `qlinear.reference.small_float.float32_round_to_odd`); float32 input is unchanged."""
        f = np.float32(v)
        if np.float64(f) != np.float64(v) and v == v:
            bits = f.view(np.uint32)
            if abs(np.float64(f)) > abs(np.float64(v)):
                bits = _U32(bits - _U32(1))  # step toward zero (f is non-zero here; Inf becomes max)
            f = _U32(bits | _U32(1)).view(np.float32)
        return f
