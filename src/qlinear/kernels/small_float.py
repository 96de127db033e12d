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
- `decode_small_float`: float8/6/4 byte -> float32 (DequantizeLinear), bit for bit as ml_dtypes widens it.
- `encode_small_float`: float32 -> float8/float6/float4 code (one byte, code in the low bits, as
  ml_dtypes stores them), with the format's parameters passed as numbers (see `SmallFloatFormat`), so
  one compiled loop serves every format and stays branch-free enough to vectorise. One float32 addition
  rounds (half to even, in hardware) and leaves the code in the sum's low bits.
  ml_dtypes converts a float64 by rounding it to float32 first; the kernels do the same.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..dtypes import ElementType

try:
    from qlinear.kernels import ensure_fresh_numba_cache

    ensure_fresh_numba_cache()  # before any cached kernel loads
    from numba import njit
    from numba.core import types
    from numba.extending import intrinsic
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
    dtype: np.dtype  # the ml_dtypes type

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
            dtype=target.dtype,
        )

    def args(self, saturate: bool) -> tuple:
        """The arguments of `encode_small_float` after the value, every constant precomputed.

        The kernel builds the byte as ``magnitude | sign``, so the format's special bytes must be
        magnitudes with the sign rule applied; checked here for every format ml_dtypes gives."""
        import ml_dtypes

        # float4/float6 always saturate (their Inf maps to +/-max in the reference, whatever `saturate` says).
        saturating = saturate or self.sign_shift < 7
        overflow_pos, overflow_neg = self.overflow_pos, self.overflow_neg
        if saturating:
            overflow_pos = self.max_code
            overflow_neg = self.max_code | (1 << self.sign_shift)
        sign_value = 1 << self.sign_shift
        shift = 23 - self.mbits  # float32 mantissa bits dropped
        min_normal_exponent = 1 - self.bias
        min_normal = (127 + min_normal_exponent) << 23  # float32 bits of the smallest normal
        # Magnitudes are clamped first, to the largest finite value (saturating) or to the smallest float32
        # that rounds past it, whose code is max_code + 1: the overflow byte (NaN or Inf) of every float8.
        dtype = self.dtype
        top = np.float32(ml_dtypes.finfo(dtype).max)
        clamp = top
        if not saturating:
            if overflow_pos != self.max_code + 1:
                raise AssertionError(f"{self}: the overflow code is not max_code + 1")
            ulp = np.float32(2.0 ** (int(np.floor(np.log2(top))) - self.mbits))
            tie = np.float32(top + ulp / 2)  # exact
            with np.errstate(over="ignore"):
                tie_rounds_down = np.array([tie]).astype(dtype).view(np.uint8)[0] == self.max_code
            clamp = np.nextafter(tie, np.float32(np.inf)) if tie_rounds_down else tie
        # The code is read off a float32 sum: magnitude + magic, where magic is a power of two 23 - mbits
        # binades above the magnitude's (at least the smallest normal's), so the addition rounds the magnitude
        # half to even at the format's step, in hardware. magic's mantissa field carries the code of the
        # binade's first value, (binade - smallest normal binade) << mbits: an even number, which leaves the
        # tie-breaking unchanged; the sum's low bits are then the code (a carry lands on the next binade's).
        if self.mbits < 1:
            raise AssertionError(f"{self}: the rounding needs at least one mantissa bit")
        magic_offset = ((23 - self.mbits) << 23) - (min_normal >> shift)
        # The sign is kept where `code & keep_mask` is non-zero, `code` being the sum's bits or, for NaN,
        # `nan_code`, whose bits above the byte are markers (the byte store drops them).
        if self.signed_zero:
            # every sum has exponent bits: the sign stays, -0 included; on NaN only if the type has a NaN
            # (float4/6 have none: NaN -> +max)
            keep_mask = 0x7F800000
            nan_code = self.nan_pos | (0x7F800000 if self.nan_neg != self.nan_pos else 0)
        else:
            # FNUZ: no -0, so the sign goes where the code is 0. NaN and overflow are 0x80 with or without it.
            keep_mask = 0xFF
            nan_code = self.nan_pos
        nan_keeps_sign = nan_code & keep_mask != 0
        if overflow_neg != overflow_pos | sign_value or (
                self.nan_neg != (self.nan_pos | sign_value if nan_keeps_sign else self.nan_pos)):
            raise AssertionError(f"{self}: special bytes are not magnitude | sign")
        return (
            np.int32(shift),
            np.int32(np.float32(clamp).view(np.int32)),
            np.int32(min_normal),
            np.int32(magic_offset),
            np.int32(nan_code),
            np.int32(sign_value),
            np.int32(keep_mask),
        )


def decode_args(target: ElementType) -> tuple:
    """The arguments of `decode_small_float` after the code, for a float8/float6/float4 type.

    Every byte decodes as ml_dtypes decodes it: the bits below the sign bit are the magnitude's code, and any
    bit at or above it makes the value negative (float4/float6 bytes with unused high bits set included). The
    special codes are read off ml_dtypes' own decoding: the smallest magnitude that decodes to NaN or Inf,
    the magnitude of Inf (e5m2), and whether the sign bit alone (the "negative zero" of the FNUZ types) is
    NaN."""
    if not target.is_small_float:
        raise ValueError(f"decode_args: {target.onnx_name} is not a float8/float6/float4 type")
    fmt = SmallFloatFormat.of(target)  # the encoder's reading of the format
    mbits, bias, sign_value = fmt.mbits, fmt.bias, 1 << fmt.sign_shift
    with np.errstate(invalid="ignore"):
        table = np.arange(256, dtype=np.uint8).view(target.dtype).astype(np.float32)
    positive = table[:sign_value]
    special = np.flatnonzero(~np.isfinite(positive))
    infinite = np.flatnonzero(np.isinf(positive))
    return (
        np.int32(sign_value),
        np.int32(23 - mbits),  # shift of the magnitude into float32's exponent and mantissa fields
        np.int32((127 - bias) << 23),  # exponent re-bias, added to those bits
        np.int32(1 << mbits),  # magnitudes below: subnormal
        np.float32(2.0 ** (1 - bias - mbits)),  # a subnormal's value per unit of its magnitude
        np.int32(special[0] if special.size else sign_value),
        np.int32(infinite[0] if infinite.size else -1),
        bool(np.isnan(table[sign_value])),
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

    @intrinsic
    def _shift_right_u32(typingctx, value, count):
        """``value >> count`` as a logical 32-bit shift (``count`` < 32). numba types an int32 shift as
        int64, which LLVM cannot narrow when the count is a variable: the loop would use 64-bit lanes."""
        if value != types.int32 or count != types.int32:
            return None

        def codegen(context, builder, signature, args):
            return builder.lshr(args[0], args[1])

        return types.int32(types.int32, types.int32), codegen

    @intrinsic
    def _shift_left_i32(typingctx, value, count):
        """``value << count`` in 32 bits (``count`` < 32), for the reason `_shift_right_u32` gives."""
        if value != types.int32 or count != types.int32:
            return None

        def codegen(context, builder, signature, args):
            return builder.shl(args[0], args[1])

        return types.int32(types.int32, types.int32), codegen

    @njit(cache=True, nogil=True, inline="always")  # inside the callers' vectorised loops
    def magic_sum(clamped, shift, min_normal, magic_offset):
        """(sum, magic), float32: the magnitude bits ``clamped`` (at most the format's clamp) plus the magic
        number of its binade (see `SmallFloatFormat.args`). The sum's low bits are the format's code and
        ``sum - magic`` is, exactly, the magnitude rounded (half to even) to the format."""
        binade = max(np.int32(clamped & np.int32(0x7F800000)), min_normal)
        magic = np.int32(np.int32(binade + magic_offset) + _shift_right_u32(binade, shift)).view(np.float32)
        return np.float32(np.int32(clamped).view(np.float32) + magic), magic

    @njit(cache=True, nogil=True)
    def encode_small_float(v, shift, clamp, min_normal, magic_offset, nan_code, sign_value, keep_mask):
        """The float8/6/4 byte for float32 ``v`` (see `SmallFloatFormat.args` for the parameters).

        One float32 addition rounds the magnitude half to even at the format's step, in the normal and the
        subnormal range alike, and leaves the code in the sum's low bits: 13 vector instructions per 16
        elements, where rounding the bits by integer arithmetic with a separate subnormal path took 17
        (measured in L1 on one core, without the division: 3.36 -> 2.90 ns per 16 elements). Every float32
        input gives the byte the previous encoder gave and the NumPy reference gives (all 2**32, offline)."""
        bits = np.float32(v).view(np.int32)
        magnitude = np.int32(bits & np.int32(0x7FFFFFFF))
        clamped = min(magnitude, clamp)  # Inf too; NaN is replaced below
        total, _ = magic_sum(clamped, shift, min_normal, magic_offset)
        code = np.float32(total).view(np.int32)
        if magnitude > np.int32(0x7F800000):
            code = nan_code
        negative = np.int32(bits >> np.int32(31))  # all ones or zero
        if np.int32(code & keep_mask) == np.int32(0):
            negative = np.int32(0)
        return np.uint8(code | (negative & sign_value))  # the low byte: the sum's exponent bits drop out

    @njit(cache=True, nogil=True)
    def decode_small_float(v, sign_value, shift, rebias, subnormal_limit, subnormal_scale, special_min,
                           inf_magnitude, nan_at_sign_alone):
        """float32 value of the float8/6/4 byte ``v`` (see `decode_args`), bit for bit as ml_dtypes widens it.

        Arithmetic rather than a 256-entry table: a table lookup is a gather per 16 elements, which made a
        float8 DequantizeLinear 2.6x slower than a uint8 one."""
        code = np.int32(np.int32(v) & np.int32(0xFF))
        magnitude = np.int32(code & np.int32(sign_value - 1))
        # normal: the magnitude's exponent and mantissa fields moved into float32's and re-biased (integer
        # arithmetic: no float32 subnormal is ever formed); subnormal: magnitude * 2**(emin - mbits), exact
        bits = np.int32(_shift_left_i32(magnitude, shift) + rebias)
        if magnitude < subnormal_limit:
            bits = np.float32(np.float32(magnitude) * subnormal_scale).view(np.int32)
        if magnitude >= special_min:
            bits = np.int32(0x7F800000) if magnitude == inf_magnitude else np.int32(0x7FC00000)
        if nan_at_sign_alone and code == sign_value:
            bits = np.int32(0x7FC00000)
        if code >= sign_value:
            bits = np.int32(bits | np.int32(-(2**31)))
        return np.int32(bits).view(np.float32)

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
