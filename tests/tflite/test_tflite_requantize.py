"""TFLite's integer requantization helpers against exact Fraction transcriptions of the source's rules.

The transcriptions below (``fraction_*``) state each rule in exact rational arithmetic, independently of
qlinear's int64 NumPy code; the LiteRT interpreter checks the same functions through whole operators in
test_tflite_conv.py (where QuantizeMultiplier's rounding of a tie is visible in the outputs).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from qlinear.reference import tflite_requantize as rq
from qlinear.tflite.conv import (multiply_by_quantized_multiplier, quantize_multiplier, rounding_divide_by_pot,
                                 saturating_rounding_doubling_high_mul)

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


# --- Exact transcriptions ------------------------------------------------------------------------------------

def floor_half_up(v: Fraction) -> int:
    """v rounded to an integer, halves toward +infinity."""
    return math.floor(v + Fraction(1, 2))


def half_away(v: Fraction) -> int:
    return int(math.copysign(math.floor(abs(v) + Fraction(1, 2)), v)) if v else 0


def wrap32(v: int) -> int:
    return (v + 2**31) % 2**32 - 2**31


def fraction_quantize_multiplier(real: float, single_rounding=False) -> tuple[int, int]:
    """QuantizeMultiplier: real = q * 2**e with q in [0.5, 1); M = q * 2**31 rounded half away from zero."""
    r = Fraction(real)
    if r == 0:
        return 0, 0
    e = 0
    while abs(r) / Fraction(2) ** e >= 1:
        e += 1
    while abs(r) / Fraction(2) ** e < Fraction(1, 2):
        e -= 1
    m = half_away(r / Fraction(2) ** e * 2**31)
    if m == 2**31:
        m, e = 2**30, e + 1
    if e < -31:
        m, e = 0, 0
    if single_rounding and e > 30:
        m, e = 2**31 - 1, 30
    return m, e


def fraction_srdhm(a: int, b: int) -> int:
    if a == b == INT32_MIN:
        return INT32_MAX
    return floor_half_up(Fraction(a * b, 2**31))


def fraction_rdbpot(x: int, e: int) -> int:
    return half_away(Fraction(x, 2**e))


def fraction_mbqm(x: int, m: int, shift: int, single_rounding=False) -> int:
    """MultiplyByQuantizedMultiplier(int32): double rounding (SRDHM then RDBPOT), or one rounding half up."""
    if single_rounding:
        return wrap32(floor_half_up(Fraction(x * m) * Fraction(2) ** (shift - 31)))
    left, right = max(shift, 0), max(-shift, 0)
    return fraction_rdbpot(fraction_srdhm(wrap32(x * 2**left), m), right)


def fraction_mbqm_int64(x: int, m: int, shift: int) -> int:
    reduced = (m + 2**15) // 2**16 if m < 0x7FFF0000 else 0x7FFF
    return wrap32(floor_half_up(Fraction(x * reduced) * Fraction(2) ** (shift - 15)))


def fraction_upward(x: int, m: int, shift: int) -> int:
    left, right = max(shift, 0), max(-shift, 0)
    return floor_half_up(Fraction(fraction_srdhm(wrap32(x * 2**left), m), 2**right))


# --- QuantizeMultiplier -------------------------------------------------------------------------------------

def _edge_reals():
    rng = np.random.default_rng(21)
    reals = [0.0, 0.25, 0.3, 0.5, 1.0, 1.5, 2.0**-31, 2.0**-32, 2.0**-33, 2.0**-31 * 0.75, 2.0**30, 2.0**31, 2.0**40,
             5e-324, 2.2250738585072014e-308, 1 - 2.0**-46, 1 - 2.0**-33, 1 - 2.0**-32, 1 - 2.0**-31,
             # q * 2**31 exactly halfway between two integers: half away from zero rounds up
             (2**30 + 0.5) / 2**31, (2**30 + 1.5) / 2**31, (2**31 - 1.5) / 2**31, (2**30 + 2**15 + 2**14 + 0.5) / 2**31,
             0.1, 1 / 3, 255 / 256]
    reals += [r * 2.0**k for r in ((2**30 + 0.5) / 2**31, 0.3) for k in (-40, -31, -20, -1, 1, 7, 29, 30, 31)]
    reals += list(np.exp2(rng.uniform(-45, 40, 300)))
    reals += list(np.float64(np.float32(rng.uniform(0.001, 1, 50))) * np.float64(np.float32(rng.uniform(0.001, 1, 50)))
                  / np.float64(np.float32(rng.uniform(0.01, 1, 50))))
    return reals


@pytest.mark.parametrize("single_rounding", [False, True])
def test_quantize_multiplier_is_the_exact_rule(single_rounding):
    for real in _edge_reals():
        for value in (real, -real):
            assert quantize_multiplier(value, single_rounding=single_rounding) == \
                fraction_quantize_multiplier(value, single_rounding), value


def test_quantize_multiplier_known_values():
    assert quantize_multiplier(0.25) == (2**30, -1)  # survey §2.1
    assert quantize_multiplier(0.3) == (1288490189, -1)
    assert quantize_multiplier(1 - 2.0**-46) == (2**30, 1)  # q * 2**31 rounds up to 2**31
    assert quantize_multiplier((2**30 + 0.5) / 2**31) == (2**30 + 1, 0)  # the tie goes away from zero
    assert quantize_multiplier(2.0**-33) == (0, 0)  # flushed: shift < -31
    assert quantize_multiplier(2.0**-32) == (2**30, -31)
    assert quantize_multiplier(2.0**40) == (2**30, 41)
    assert quantize_multiplier(2.0**40, single_rounding=True) == (2**31 - 1, 30)


@pytest.mark.parametrize("bad, error", [(float("nan"), ValueError), (float("inf"), ValueError), ("0.5", TypeError),
                                        (True, TypeError), (None, TypeError)])
def test_quantize_multiplier_rejects(bad, error):
    with pytest.raises(error, match="quantize_multiplier: real"):
        quantize_multiplier(bad)


# --- The fixed-point multiplies -----------------------------------------------------------------------------

def _operands(n=4000, seed=0):
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.integers(INT32_MIN, INT32_MAX, n // 2, endpoint=True),
                        rng.integers(-(2**16), 2**16, n // 2),
                        [0, 1, -1, 3, -3, 5, -5, INT32_MIN, INT32_MAX, INT32_MIN + 1]])
    m = np.concatenate([rng.integers(2**30, 2**31, len(x) - 6), [2**30, 2**30, 2**31 - 1, 2**30 + 1, 0, 2**30]])
    shift = rng.integers(-31, 31, len(x))
    shift[: len(x) // 2] = rng.integers(-12, 3, len(x) // 2)  # the shifts real layers have
    return x.astype(np.int64), m.astype(np.int64), shift.astype(np.int64)


@pytest.mark.parametrize("single_rounding", [False, True])
def test_multiply_by_quantized_multiplier_is_the_exact_rule(single_rounding):
    x, m, shift = _operands(seed=1 + single_rounding)
    got = multiply_by_quantized_multiplier(x, m, shift, single_rounding=single_rounding)
    assert got.dtype == np.int32
    expected = [fraction_mbqm(int(a), int(b), int(s), single_rounding) for a, b, s in zip(x, m, shift)]
    np.testing.assert_array_equal(got, expected)


def test_the_other_multiplies_are_the_exact_rules():
    x, m, shift = _operands(seed=3)
    np.testing.assert_array_equal(rq.multiply_by_quantized_multiplier_upward(x, m, shift),
                                  [fraction_upward(int(a), int(b), int(s)) for a, b, s in zip(x, m, shift)])
    x64 = np.random.default_rng(4).integers(-(2**47), 2**47, len(x))
    s64 = np.minimum(shift, 7)
    np.testing.assert_array_equal(rq.multiply_by_quantized_multiplier_int64(x64, m, s64),
                                  [fraction_mbqm_int64(int(a), int(b), int(s)) for a, b, s in zip(x64, m, s64)])
    # the single-rounding NEON blocks equal the single-rounding multiply wherever x << (shift + 1) fits int32
    fits = (np.abs(x) << np.maximum(shift + 1, 0)) < 2**31
    np.testing.assert_array_equal(rq.multiply_by_quantized_multiplier_neon_single(x, m, shift)[fits],
                                  rq.multiply_by_quantized_multiplier(x, m, shift, single_rounding=True)[fits])


def test_srdhm_and_rdbpot():
    a, b, _ = _operands(seed=5)
    b = b * np.where(np.arange(len(b)) % 3 == 0, -1, 1)
    np.testing.assert_array_equal(saturating_rounding_doubling_high_mul(a, b),
                                  [fraction_srdhm(int(p), int(q)) for p, q in zip(a, b)])
    assert saturating_rounding_doubling_high_mul(INT32_MIN, INT32_MIN) == INT32_MAX
    np.testing.assert_array_equal(saturating_rounding_doubling_high_mul([1, -1, -3], 2**30), [1, 0, -1])
    e = np.random.default_rng(6).integers(0, 32, len(a))
    np.testing.assert_array_equal(rounding_divide_by_pot(a, e), [fraction_rdbpot(int(p), int(q)) for p, q in zip(a, e)])
    np.testing.assert_array_equal(rounding_divide_by_pot([5, -5, -3, 3], 1), [3, -3, -2, 2])


def test_documented_examples():
    # ruy PR #227 / survey §2.2: 1 * 0.25 gives 1 with two roundings, 0 with one
    assert multiply_by_quantized_multiplier(1, 2**30, -1) == 1
    assert multiply_by_quantized_multiplier(1, 2**30, -1, single_rounding=True) == 0
    # tensorflow/tensorflow#25087: 7984 * 1583594044 * 2**-40 = 11.499..., double rounding gives 12
    assert multiply_by_quantized_multiplier(7984, 1583594044, -9) == 12
    assert multiply_by_quantized_multiplier(7984, 1583594044, -9, single_rounding=True) == 11


@pytest.mark.parametrize("args, error, message", [
    ((1.5, 2**30, -1), TypeError, "x must be integers"),
    ((1, -1, -1), ValueError, "multiplier must lie in"),
    ((1, 2**31, -1), ValueError, "multiplier must lie in"),
    ((1, 2**30, 31), ValueError, "shift must lie in"),
    ((1, 2**30, -32), ValueError, "shift must lie in"),
    ((2**31, 2**30, -1), ValueError, "x must lie in"),
])
def test_multiply_by_quantized_multiplier_rejects(args, error, message):
    with pytest.raises(error, match=message):
        multiply_by_quantized_multiplier(*args)


# --- Double and XNNPACK requantization, activation ranges ----------------------------------------------------

def test_requantize_double_rounds_half_away():
    rng = np.random.default_rng(7)
    acc = np.concatenate([rng.integers(-(2**31), 2**31, 3000), np.arange(-40, 41)])
    for real in (0.25, 0.5, 0.0123, 2.0**-7, 3.0):
        got = rq.requantize_double(acc, real)
        expected = []
        for a in acc:
            v = half_away(Fraction(float(a) * real))  # the double product, then std::round
            expected.append(v if INT32_MIN <= v <= INT32_MAX else INT32_MIN)  # x86 cvttsd2si
        np.testing.assert_array_equal(got, expected)


def test_requantize_xnnpack_is_float32_ties_to_even():
    rng = np.random.default_rng(8)
    acc = np.concatenate([rng.integers(-(2**30), 2**30, 2000), np.arange(-40, 41), [2**24 + 1, -(2**24) - 3]])
    scale = np.float32(0.25)
    got = rq.requantize_xnnpack(acc, scale, -3, -128, 127)
    for a, g in zip(acc, got):
        f = Fraction(float(np.float32(a))) * Fraction(float(scale))  # exact here: the product fits float32
        f = min(max(f, -128 + 3), 127 + 3)
        r = math.floor(f)
        r = r + 1 if f - r > Fraction(1, 2) or (f - r == Fraction(1, 2) and r % 2) else r
        assert g == r - 3, a


def test_activation_ranges():
    assert rq.activation_range(None, 0.1, 5, np.int8) == (-128, 127)
    assert rq.activation_range("relu", 0.1, 5, np.int8) == (5, 127)
    assert rq.activation_range("relu6", 4.0, -1, np.int8) == (-1, 1)  # 6 / 4 = 1.5 rounds away: 2 - 1
    assert rq.activation_range_xnnpack("relu6", 4.0, -1, np.int8) == (-1, 0)  # 1.5 - 1 = 0.5 rounds to even
    assert rq.activation_range("relu_n1_to_1", 0.5, 0, np.uint8) == (0, 2)
    assert rq.activation_range("relu6", 0.001, 0, np.int16) == (0, 6000)
    with pytest.raises(ValueError, match="overflows int32"):
        rq.activation_range("relu6", 1e-30, 0, np.int8)
