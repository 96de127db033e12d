"""The reference's exact-rounding helpers (qlinear.reference.torch_quantize) against Fraction arithmetic.

``fma_f32`` (torch 2.13.0's fused multiply-add) and the strict fake quantization's product must round once;
float64 arithmetic followed by a float32 conversion rounds twice, and the two differ when the float64 result
lands exactly halfway between two float32 values. These cases are constructed so that it does.
No torch here: these run whether or not torch is installed.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from torch_exact import frac, round_to_f32

from qlinear.reference import torch_quantize as ref

F32 = np.float32


def test_fma_rounds_once_where_float64_would_round_twice():
    a = F32(1 - 2.0**-20)
    b = F32(2.0**-24 * (1 + 2.0**-20))
    c = F32(1 + 2.0**-23)
    # exact: 1 + 3 * 2^-24 - 2^-64, just below the float32 midpoint; float64 rounds it onto the midpoint
    exact = frac(a) * frac(b) + frac(c)
    assert float(round_to_f32(exact)) == 1 + 2.0**-23
    assert F32(np.float64(a) * np.float64(b) + np.float64(c)) == F32(1 + 2.0**-22)  # the double rounding
    assert ref.fma_f32(np.array([a]), b, c)[0] == F32(1 + 2.0**-23)
    # and mirrored: just above a midpoint whose even neighbour is below
    assert ref.fma_f32(np.array([-a]), b, -c)[0] == F32(-(1 + 2.0**-23))


def test_fma_matches_fractions_on_random_and_special_operands():
    rng = np.random.default_rng(7)
    a = (rng.standard_normal(3000) * 2.0 ** rng.integers(-30, 30, 3000)).astype(F32)
    b = (rng.standard_normal(3000) * 2.0 ** rng.integers(-30, 30, 3000)).astype(F32)
    c = (rng.standard_normal(3000) * 2.0 ** rng.integers(-30, 30, 3000)).astype(F32)
    got = ref.fma_f32(a, b, c)
    for i in range(a.size):
        expected = round_to_f32(frac(a[i]) * frac(b[i]) + frac(c[i]))
        assert got[i] == F32(float(expected)), (a[i], b[i], c[i])
    with np.errstate(invalid="ignore"):
        specials = ref.fma_f32(np.array([np.nan, np.inf, np.inf, 3e38], F32), F32(1), np.array([1, 1, -np.inf, 3e38], F32))
    assert np.isnan(specials[0]) and specials[1] == np.inf and np.isnan(specials[2]) and specials[3] == np.inf


def _product_halfway_cases(count):
    """Integers k in [2^31, 2^32) and scales s = 1 + t * 2^-23 with k * s = (a float32 midpoint) + 2^-23 exactly,
    the midpoint's even neighbour below it: float64 drops the 2^-23, lands on the midpoint, and the float32
    conversion goes down to the even side where the exact product rounds up."""
    rng = np.random.default_rng(11)
    found = []
    while len(found) < count:
        t = int(rng.integers(1, 2**22)) * 2 + 1
        k0 = pow(t, -1, 2**23)  # k * t = 1 (mod 2^23): the fraction of k * t / 2^23 is 2^-23
        for m in range(256, 1024):
            k = k0 + m * 2**23
            if not 2**31 <= k < 2**32:
                continue
            whole = k + (k * t - 1) // 2**23
            if 2**31 <= whole < 2**32 and whole % 512 == 128:  # float32 step 256 there; even below
                found.append((k, F32(1 + t * 2.0**-23)))
                break
    return found


def test_exact_product_rounds_once():
    cases = _product_halfway_cases(20)
    for k, s in cases:
        exact = k * frac(s)
        assert exact.denominator == 2**23
        expected = F32(float(round_to_f32(exact)))
        assert F32(np.float64(k) * np.float64(s)) != expected  # float64 then float32: the wrong side
        assert ref._exact_product_f32(np.array([k, -k]), s).tolist() == [expected, -expected]
    rng = np.random.default_rng(12)
    ks = rng.integers(-(2**33), 2**33, 2000)
    ss = rng.uniform(1e-3, 10, 2000).astype(F32)
    got = ref._exact_product_f32(ks, ss)
    for k, s, g in zip(ks, ss, got):
        assert g == F32(float(round_to_f32(int(k) * Fraction(float(s))))), (k, s)
