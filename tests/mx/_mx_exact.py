"""The MX and NVFP4 rules transcribed with exact rational arithmetic (``fractions.Fraction``).

Nothing here calls qlinear or ml_dtypes: each element format's values are enumerated from its sign /
exponent / mantissa parameters (OCP MX v1.0 table; ONNX docs/technical/float8.md, float4.md and the
float6 types of opset 28), every division and product is exact, and the only roundings are the ones
the rules name (to an element grid, to float32, to E4M3), each done here by hand. This is the oracle
tests/mx/test_mx_fraction.py holds qlinear.mx to; the other tests of this folder use its helpers to
explain, element by element, where a peer differs.

The rules (qlinear/reference/mx.py's docstrings; tests/mx/test_mx_fraction.py lists them in full):

- MX shared exponent e (X = 2^e), per block of 32 with maximum magnitude amax:
  "floor" (OCP MX v1.0, Algorithm 1 of arXiv:2310.10537): floor(log2 amax) - emax;
  "ceil": the smallest power of two >= float32(amax / max) (the float32 division is part of the rule);
  "even": amax rounded to mantissa_bits + 1 significant bits, halves up, then floor(log2) - emax.
  An all-zero block gets -127; e is clamped to [-127, 127]; a block holding a NaN or an Inf gets the
  NaN scale 0xFF and +0 codes.
- Elements: V / X rounded to the element grid, nearest with ties to the even code, saturating at +-max
  (a negative V that rounds to zero keeps its sign: -0). MXINT8: round(V / X * 64), ties to even,
  clamped to +-127.
- NVFP4 (blocks of 16): g = float32(amax / 2688) over the finite values (1 if that is 0); block scale
  s8 = E4M3 (nearest even, saturated at 448) of float32(float32(amax_b / 6) / g); codes = E2M1 rounding
  of V / float32(s8 * g); a zero d or a block holding a NaN/Inf gives +0 codes (block scale NaN 0x7F).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

TWO = Fraction(2)


# ---------------------------------------------------------------------------------------------
# Exact helpers
# ---------------------------------------------------------------------------------------------
def floor_log2(a: Fraction) -> int:
    """floor(log2 a) for a > 0, exactly."""
    assert a > 0
    e = a.numerator.bit_length() - a.denominator.bit_length()  # 2^(e-1) < a < 2^(e+1)
    if TWO**e > a:
        e -= 1
    return e


def ceil_log2(a: Fraction) -> int:
    e = floor_log2(a)
    return e if TWO**e == a else e + 1


def round_binary(a: Fraction, mbits: int, emin: int) -> Fraction:
    """a rounded to nearest, ties to even, on the binary grid with mbits fraction bits and smallest normal
    exponent emin (subnormals below it), unbounded above; the sign is kept (-0 is not: callers keep it)."""
    if a == 0:
        return Fraction(0)
    sign = -1 if a < 0 else 1
    m = abs(a)
    quantum = TWO ** (max(floor_log2(m), emin) - mbits)
    return sign * round(m / quantum) * quantum  # round() of a Fraction: nearest, ties to even


FLT_MAX = (2 - TWO**-23) * TWO**127


def f32(a: Fraction, negative_zero: bool = False) -> np.float32:
    """a rounded to float32 (nearest even; overflow to +-Inf), as IEEE 754 division/multiplication round."""
    r = round_binary(a, 23, -126)
    if abs(r) > FLT_MAX:  # rounded up to 2^128: the overflow threshold (2^128 - 2^103 and beyond)
        return np.float32(np.inf if r > 0 else -np.inf)
    if r == 0:
        return np.float32(-0.0 if (negative_zero or a < 0) else 0.0)
    return np.float32(float(r))  # exact: r is a float32


def exact(v) -> Fraction:
    """The exact value of a finite float."""
    return Fraction(float(v))


# ---------------------------------------------------------------------------------------------
# Element formats, from their parameters
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FloatFormat:
    """A sign/exponent/mantissa format. ``specials``: "fn" (E4M3FN: only S.1111.111 is NaN), "ieee" (the top
    exponent is Inf/NaN, E5M2), "none" (every code finite: float6, float4)."""

    ebits: int
    mbits: int
    bias: int
    specials: str

    @property
    def sign_bit(self) -> int:
        return 1 << (self.ebits + self.mbits)

    def magnitude(self, code: int):
        """The value of a code without its sign bit: a Fraction, or "inf"/"nan"."""
        e, m = code >> self.mbits, code & ((1 << self.mbits) - 1)
        top_e = (1 << self.ebits) - 1
        if self.specials == "ieee" and e == top_e:
            return "inf" if m == 0 else "nan"
        if self.specials == "fn" and e == top_e and m == (1 << self.mbits) - 1:
            return "nan"
        if e == 0:
            return Fraction(m, 1 << self.mbits) * TWO ** (1 - self.bias)
        return (1 + Fraction(m, 1 << self.mbits)) * TWO ** (e - self.bias)

    @property
    def grid(self) -> list[tuple[Fraction, int]]:
        """(value, code) of every finite non-negative value, ascending."""
        cached = _GRIDS.get(self)
        if cached is None:
            pairs = [(self.magnitude(c), c) for c in range(self.sign_bit)]
            cached = sorted((v, c) for v, c in pairs if isinstance(v, Fraction))
            values = [v for v, _ in cached]
            assert len(set(values)) == len(values), "two codes with one value"
            denominator = max(v.denominator for v in values)  # a power of two: every value is dyadic
            assert all(denominator % v.denominator == 0 for v in values)
            _GRIDS[self] = cached
            _KEYS[self] = ([int(v * denominator) for v in values], [c for _, c in cached], denominator)
        return cached

    @property
    def max(self) -> Fraction:
        return self.grid[-1][0]

    @property
    def emax(self) -> int:
        """Exponent of the largest normal (the OCP rule's emax_elem)."""
        return floor_log2(self.max)

    def round_code(self, v: Fraction, negative: bool) -> int:
        """The code of v (|v| = magnitude; ``negative``: the sign, kept for -0): nearest, ties to the even
        code, saturating at the largest finite value.

        Exact, in integers: the grid values are dyadic, so each is an integer K_i over one power of two D;
        |v| = n / d compares with K_i / D as n * D with K_i * d."""
        self.grid  # noqa: B018 (builds the tables)
        keys, codes, denominator = _KEYS[self]
        a = abs(v)
        n, d = a.numerator, a.denominator
        scaled = n * denominator
        if scaled >= keys[-1] * d:
            code = codes[-1]
        else:
            i = bisect.bisect_right(keys, scaled // d)  # keys[i-1] <= |v| * D < keys[i]
            twice, middle = 2 * scaled, (keys[i - 1] + keys[i]) * d
            if twice < middle:
                code = codes[i - 1]
            elif twice > middle:
                code = codes[i]
            else:  # an exact tie: the even code
                code = codes[i - 1] if codes[i - 1] % 2 == 0 else codes[i]
        return code | (self.sign_bit if negative else 0)

    def value(self, code: int):
        """Signed value of a code: a Fraction (0 for -0), or a float Inf/NaN."""
        mag = self.magnitude(code & (self.sign_bit - 1))
        negative = bool(code & self.sign_bit)
        if mag == "nan":
            return float("nan")
        if mag == "inf":
            return float("-inf") if negative else float("inf")
        return -mag if negative else mag


_GRIDS: dict = {}
_KEYS: dict = {}

E4M3 = FloatFormat(4, 3, 7, "fn")
E5M2 = FloatFormat(5, 2, 15, "ieee")
E3M2 = FloatFormat(3, 2, 3, "none")
E2M3 = FloatFormat(2, 3, 1, "none")
E2M1 = FloatFormat(2, 1, 1, "none")


@dataclass(frozen=True)
class Spec:
    """An MX format as the OCP table gives it: the element format (None: MXINT8), block size,
    and the significand width the "even" rule rounds amax to (mantissa bits)."""

    element: FloatFormat | None
    mantissa_bits: int
    block: int = 32

    @property
    def max(self) -> Fraction:
        return self.element.max if self.element else Fraction(127, 64)

    @property
    def emax(self) -> int:
        return self.element.emax if self.element else 0


SPECS = {
    "mxfp8_e4m3": Spec(E4M3, 3),
    "mxfp8_e5m2": Spec(E5M2, 2),
    "mxfp6_e3m2": Spec(E3M2, 2),
    "mxfp6_e2m3": Spec(E2M3, 3),
    "mxfp4": Spec(E2M1, 1),
    # MXINT8: two's complement int8 with an implicit 2^-6 (1.f, 6 fraction bits), symmetric +-127.
    "mxint8": Spec(None, 6),
}
MX_NAMES = tuple(SPECS)
RULES = ("floor", "ceil", "even")


# ---------------------------------------------------------------------------------------------
# MX
# ---------------------------------------------------------------------------------------------
def shared_exponent(amax: Fraction, spec: Spec, rule: str) -> int:
    if amax == 0:
        e = -127
    elif rule == "floor":
        e = floor_log2(amax) - spec.emax
    elif rule == "ceil":
        q = f32(amax / spec.max)  # the float32 quotient: part of the rule
        # amax / max below half of float32's smallest subnormal rounds to 0: any e <= -127 clamps to -127
        e = -127 if q == 0 else ceil_log2(exact(q))
    elif rule == "even":
        p = floor_log2(amax)
        quantum = TWO ** (p - spec.mantissa_bits)  # mantissa_bits + 1 significant bits
        r = (amax / quantum + Fraction(1, 2)).__floor__()  # halves up
        e = (p + 1 if r == 2 ** (spec.mantissa_bits + 1) else p) - spec.emax
    else:
        raise ValueError(rule)
    return min(max(e, -127), 127)


def mx_element(v: float, e: int, spec: Spec) -> int:
    """The code (unsigned bit pattern; MXINT8: the int8 value) of a finite float32 v with X = 2^e."""
    q = exact(v) / TWO**e
    if spec.element is None:
        return max(-127, min(127, round(q * 64)))
    return spec.element.round_code(q, negative=bool(np.signbit(v)))


def quantize_mx(x: np.ndarray, name: str, rule: str) -> tuple[np.ndarray, np.ndarray]:
    """x float32 (..., K), blocks along the last axis -> (codes as uint8 bit patterns, int8 for MXINT8;
    E8M0 scale bytes)."""
    spec = SPECS[name]
    x = np.asarray(x, np.float32)
    k = x.shape[-1]
    nb = -(-k // spec.block)
    rows = x.reshape(-1, k)
    codes = np.zeros(rows.shape, np.int8 if spec.element is None else np.uint8)
    scales = np.zeros((rows.shape[0], nb), np.uint8)
    for r, row in enumerate(rows):
        for j in range(nb):
            block = row[j * spec.block:(j + 1) * spec.block]
            if not np.isfinite(block).all():
                scales[r, j] = 0xFF  # NaN scale, +0 codes
                continue
            amax = max(abs(exact(v)) for v in block)
            e = shared_exponent(amax, spec, rule)
            scales[r, j] = e + 127
            for i, v in enumerate(block):
                codes[r, j * spec.block + i] = mx_element(v, e, spec)
    return codes.reshape(x.shape), scales.reshape(x.shape[:-1] + (nb,))


def dequantize_mx(codes: np.ndarray, scales: np.ndarray, name: str) -> np.ndarray:
    """value = P * 2^e exactly (MXINT8: code * 2^-6 * 2^e), rounded once to float32; NaN scale -> NaN."""
    spec = SPECS[name]
    k = codes.shape[-1]
    crow = np.asarray(codes).reshape(-1, k)
    srow = np.asarray(scales).view(np.uint8).reshape(crow.shape[0], -1)
    out = np.zeros(crow.shape, np.float32)
    for r in range(crow.shape[0]):
        for i in range(k):
            s = int(srow[r, i // spec.block])
            c = int(crow[r, i])
            if s == 0xFF:
                out[r, i] = np.nan
                continue
            if spec.element is None:
                p, negative = Fraction(c, 64), c < 0
            else:
                p = spec.element.value(c)
                negative = bool(c & spec.element.sign_bit)
            if isinstance(p, float):
                out[r, i] = np.float32(p)
                continue
            value = p * TWO ** (s - 127)
            if value == 0 or (value.denominator <= 2**149 and abs(value) < 2**128):
                # p has at most 8 significant bits: a multiple of 2^-149 below 2^128 is a float32 as it is
                out[r, i] = np.float32(-float(abs(value)) if negative else float(abs(value)))
            else:
                out[r, i] = f32(value, negative)
    return out.reshape(codes.shape)


# ---------------------------------------------------------------------------------------------
# NVFP4
# ---------------------------------------------------------------------------------------------
def e4m3_scale(a: Fraction) -> int:
    """E4M3 code of a >= 0: nearest even, saturated at 448."""
    return E4M3.round_code(a, negative=False)


def nvfp4_global(x: np.ndarray) -> np.float32:
    finite = x[np.isfinite(x)]
    amax = max((abs(exact(v)) for v in finite.ravel()), default=Fraction(0))
    g = f32(amax / 2688)
    return np.float32(1) if g == 0 else g


def quantize_nvfp4(x: np.ndarray, g=None):
    """-> (E2M1 codes uint8, E4M3 block scale bytes uint8, float32 g); ``g``: a given tensor scale."""
    x = np.asarray(x, np.float32)
    g = nvfp4_global(x) if g is None else np.float32(g)
    gq = exact(g)
    k = x.shape[-1]
    nb = -(-k // 16)
    rows = x.reshape(-1, k)
    codes = np.zeros(rows.shape, np.uint8)
    scales = np.zeros((rows.shape[0], nb), np.uint8)
    for r, row in enumerate(rows):
        for j in range(nb):
            block = row[j * 16:(j + 1) * 16]
            if not np.isfinite(block).all():
                scales[r, j] = 0x7F  # E4M3 NaN; codes +0
                continue
            amax = max(abs(exact(v)) for v in block)
            s = f32(exact(f32(amax / 6)) / gq)
            s8 = e4m3_scale(exact(s)) if np.isfinite(s) else e4m3_scale(E4M3.max)
            scales[r, j] = s8
            d = exact(f32(E4M3.value(s8) * gq))
            if d == 0:
                continue  # +0 codes
            for i, v in enumerate(block):
                codes[r, j * 16 + i] = E2M1.round_code(exact(v) / d, negative=bool(np.signbit(v)))
    return codes.reshape(x.shape), scales.reshape(x.shape[:-1] + (nb,)), g


def dequantize_nvfp4(codes: np.ndarray, scales: np.ndarray, g: np.float32) -> np.ndarray:
    """codes * float32(s8 * g), rounded to float32 (the two DequantizeLinear nodes)."""
    k = codes.shape[-1]
    crow = np.asarray(codes).view(np.uint8).reshape(-1, k)
    srow = np.asarray(scales).view(np.uint8).reshape(crow.shape[0], -1)
    out = np.zeros(crow.shape, np.float32)
    gq = exact(g)
    for r in range(crow.shape[0]):
        for i in range(k):
            s = E4M3.value(int(srow[r, i // 16]))
            if isinstance(s, float):  # NaN scale
                out[r, i] = np.nan
                continue
            d = f32(s * gq, negative_zero=s == 0 and bool(srow[r, i // 16] & 0x80))
            c = int(crow[r, i])
            p = E2M1.value(c)
            negative = bool(c & E2M1.sign_bit) != bool(np.signbit(d))
            out[r, i] = f32(p * exact(d), negative)
    return out.reshape(codes.shape)
