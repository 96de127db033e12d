"""qlinear.mx against an exact transcription of the MX and NVFP4 rules (tests/mx/_mx_exact.py).

The oracle enumerates each element format from its sign/exponent/mantissa parameters and computes every
step with ``fractions.Fraction``; the only roundings are those the rules name (to the element grid, to
float32 where a rule divides in float32, to E4M3), each done by hand. Codes, scales, the NVFP4 tensor
scale and the dequantized values must equal it bit for bit, on random data and on the hazards:
amax 1 ulp below a power of two, exact ties, zeros and -0, float32 subnormals, block maxima at and just
beside max * 2^k, both ends of E8M0's exponent range, partial last blocks, NaN and Inf.
"""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import qlinear.mx as mx
from qlinear.kernels.quantize_linear import use_kernels

from . import _mx_exact as ex
from ._mx_inputs import F32, FLT_MAX, TINY, above, below, edge_cases, nvfp4_tie_tensor, random_rows


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a.view(np.uint8) if a.dtype.itemsize == 1 else a.view(np.uint32)


def assert_same(actual, expected, x, what: str):
    """Equal bit for bit (NaN: both NaN, any payload), with the first differences and their inputs."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if actual.dtype.kind == "f" or actual.dtype.itemsize == 4:
        a32, e32 = actual.astype(F32), expected.astype(F32)
        same = (a32.view(np.uint32) == e32.view(np.uint32)) | (np.isnan(a32) & np.isnan(e32))
    else:
        same = _bits(actual) == _bits(expected)
    if same.all():
        return
    bad = np.argwhere(~same)[:6]
    lines = []
    for idx in bad:
        idx = tuple(idx)
        inp = x[idx] if x is not None and x.shape == actual.shape else "(per block)"
        lines.append(f"  at {idx}: got {_bits(actual)[idx]!r}, expected {_bits(expected)[idx]!r}; input {inp!r}")
    raise AssertionError(f"{what}: {int((~same).sum())} of {same.size} differ\n" + "\n".join(lines))


def code_bits(codes: np.ndarray) -> np.ndarray:
    return codes.view(np.int8) if codes.dtype == np.int8 else codes.view(np.uint8)


PATHS = (True, False)  # qlinear.mx's kernels (what users run) and its NumPy reference (the kernels' oracle)


def check_mx(x: np.ndarray, name: str, rule: str) -> int:
    """qlinear.mx.quantize / dequantize on x (blocks along the last axis) equal the transcription, on both
    of qlinear's paths."""
    want_codes, want_scales = ex.quantize_mx(x, name, rule)
    want_y = ex.dequantize_mx(want_codes, want_scales, name)
    for kernels in PATHS:
        path = "kernels" if kernels else "reference"
        with use_kernels(kernels):
            codes, scales = mx.quantize(x, name, scale_rule=rule)
            assert_same(scales.view(np.uint8), want_scales, None, f"{name}/{rule} scales ({path})")
            assert_same(code_bits(codes), want_codes, x, f"{name}/{rule} codes ({path})")
            y = mx.dequantize(codes, scales)
        assert y.dtype == F32
        assert_same(y, want_y, x, f"{name}/{rule} dequantized ({path})")
    return x.size


# ---------------------------------------------------------------------------------------------
# The format table itself
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ex.MX_NAMES)
def test_format_parameters(name):
    """qlinear's MXFormat agrees with the formats enumerated from their bit parameters: max, emax (the
    exponent of the largest normal), mantissa bits, block size, element dtype width."""
    spec, fmt = ex.SPECS[name], mx.FORMATS[name]
    assert Fraction(fmt.max_value) == spec.max
    assert fmt.emax == spec.emax
    assert fmt.mantissa_bits == spec.mantissa_bits
    assert fmt.block_size == 32
    assert fmt.scale_type.dtype == np.dtype(ml_dtypes.float8_e8m0fnu)
    # The documented maxima (OCP MX v1.0 table): 448, 57344, 28, 7.5, 6, 127/64.
    documented = {"mxfp8_e4m3": 448, "mxfp8_e5m2": 57344, "mxfp6_e3m2": 28, "mxfp6_e2m3": Fraction(15, 2),
                  "mxfp4": 6, "mxint8": Fraction(127, 64)}
    assert spec.max == documented[name]
    if spec.element is not None:
        # Every finite code of the ml_dtypes element type decodes to the enumerated value.
        codes = np.arange(spec.element.sign_bit * 2, dtype=np.uint8).view(fmt.element.dtype)
        for c, v in zip(range(spec.element.sign_bit * 2), codes.astype(np.float64)):
            want = spec.element.value(c)
            if isinstance(want, float):
                assert np.isnan(want) and np.isnan(v) or want == v
            else:
                assert Fraction(float(v)) == want and bool(np.signbit(v)) == bool(c & spec.element.sign_bit)


def test_nvfp4_parameters():
    fmt = mx.FORMATS["nvfp4"]
    assert fmt.block_size == 16 and fmt.scale_type.dtype == np.dtype(ml_dtypes.float8_e4m3fn)
    assert [v for v, _ in ex.E2M1.grid] == [0, Fraction(1, 2), 1, Fraction(3, 2), 2, 3, 4, 6]
    assert ex.E4M3.max == 448 and ex.E4M3.grid[1][0] == Fraction(1, 512)


# ---------------------------------------------------------------------------------------------
# MX: qlinear against the transcription
# ---------------------------------------------------------------------------------------------
RNG_SEED = 20260901


@pytest.mark.parametrize("rule", ex.RULES)
@pytest.mark.parametrize("name", ex.MX_NAMES)
def test_mx_random_and_hazards(name, rule):
    rng = np.random.default_rng([RNG_SEED, ex.MX_NAMES.index(name), ex.RULES.index(rule)])
    checked = check_mx(random_rows(rng, 16, 96), name, rule)  # 48 blocks
    for x in edge_cases(name, np.random.default_rng([RNG_SEED, ex.MX_NAMES.index(name)])):
        checked += check_mx(x, name, rule)
    assert checked > 3000


@pytest.mark.parametrize("name", ex.MX_NAMES)
def test_mx_partial_blocks_and_axis(name):
    """A partial last block is quantized as if padded with zeros; blocks follow ``axis``."""
    rng = np.random.default_rng([RNG_SEED, 7, ex.MX_NAMES.index(name)])
    for k in (1, 5, 31, 33, 70):
        x = random_rows(rng, 4, k)
        for rule in ex.RULES:
            check_mx(x, name, rule)
    x = random_rows(rng, 6, 45).reshape(2, 3, 45)
    for rule in ex.RULES:
        check_mx(x, name, rule)
        moved = np.ascontiguousarray(np.moveaxis(x, 2, 1))  # (2, 45, 3), blocks along axis 1
        codes, scales = mx.quantize(moved, name, axis=1, scale_rule=rule)
        want_codes, want_scales = ex.quantize_mx(x, name, rule)
        assert_same(code_bits(np.moveaxis(codes, 1, 2)), want_codes, x, "codes along axis 1")
        assert_same(np.moveaxis(scales, 1, 2).view(np.uint8), want_scales, None, "scales along axis 1")
        y = mx.dequantize(codes, scales, axis=1)
        assert_same(np.moveaxis(y, 1, 2), ex.dequantize_mx(want_codes, want_scales, name), x, "dequantized")


@pytest.mark.parametrize("name", ex.MX_NAMES)
def test_mx_specials(name):
    """A block holding a NaN or an Inf (either sign) gets the NaN scale 0xFF and +0 codes; it decodes to NaN
    everywhere; the amax of the tensor's other blocks is unaffected (per block)."""
    x = np.ones((4, 64), F32) * F32(3.0)
    x[0, 5] = np.nan
    x[1, 40] = np.inf
    x[2, 0] = -np.inf
    x[2, 33] = np.nan
    x[3, :] = -0.5
    for rule in ex.RULES:
        codes, scales = mx.quantize(x, name, scale_rule=rule)
        s = scales.view(np.uint8)
        assert s[0, 0] == 0xFF and s[1, 1] == 0xFF and (s[2] == 0xFF).all()
        assert s[0, 1] != 0xFF and s[1, 0] != 0xFF and (s[3] != 0xFF).all()
        bad = np.repeat(s == 0xFF, 32, axis=1)
        assert (code_bits(codes)[bad] == 0).all()  # +0 codes
        y = mx.dequantize(codes, scales)
        assert np.isnan(y[bad]).all() and np.isfinite(y[~bad]).all()
        check_mx(x, name, rule)


@pytest.mark.parametrize("name", ex.MX_NAMES)
def test_mx_dequantize_every_code(name):
    """Every element code (E4M3's NaN codes and E5M2's Inf/NaN codes included; MXINT8's -128, which
    quantize never emits) times E8M0 scales at both ends, 2^0, and NaN."""
    spec, fmt = ex.SPECS[name], mx.FORMATS[name]
    n = 256 if spec.element is None else spec.element.sign_bit * 2
    raw = np.arange(n, dtype=np.uint8)
    codes = np.tile(raw, (6, 1))
    codes = codes.view(np.int8) if spec.element is None else codes.view(fmt.element.dtype)
    scale_bytes = np.array([0x00, 0x01, 0x7F, 0xFD, 0xFE, 0xFF], np.uint8)
    pad = -(-n // 32)
    scales = np.repeat(scale_bytes[:, None], pad, axis=1).view(ml_dtypes.float8_e8m0fnu)
    want = ex.dequantize_mx(code_bits(codes), scales.view(np.uint8), name)
    for kernels in PATHS:
        with use_kernels(kernels):
            assert_same(mx.dequantize(codes, scales), want, None, f"{name} dequantize of every code ({kernels=})")


def test_exponent_clamps():
    """Named cases of the clamps: the floor rule's exponent below -127 clamps (FP4: amax 2^-149 gives
    floor = -151 -> -127); "ceil" and "even" of MXINT8 reach 128 at float32's maximum and clamp to 127,
    so the block maximum saturates at code 127."""
    codes, scales = mx.quantize(np.asarray([TINY] + [0.0] * 31, F32), "mxfp4")
    assert scales.view(np.uint8)[0] == 0 and codes.view(np.uint8)[0] == 0
    # floor: FLT_MAX = 1.99..*2^127 -> e = 127 for MXINT8 (emax 0); ceil: FLT_MAX / (127/64) > 2^127 -> 128;
    # even: FLT_MAX rounded to 7 bits is 2^128 -> 128. All give 0xFE (2^127); V/X*64 = 127.99.. -> 127.
    for rule in ex.RULES:
        codes, scales = mx.quantize(np.asarray([FLT_MAX] * 32, F32), "mxint8", scale_rule=rule)
        assert scales.view(np.uint8)[0] == 0xFE, rule
        assert codes[0] == 127
    assert ex.shared_exponent(ex.exact(FLT_MAX), ex.SPECS["mxint8"], "ceil") == 127  # clamped from 128


def test_ceil_float32_quotient_is_part_of_the_rule():
    """amax = next(6 * 2^-127) = 6 * 2^-127 + 2^-148: amax / 6 is just above 2^-127 exactly, but the float32
    quotient, a subnormal, rounds back to 2^-127 (the excess is a third of 2^-149), so "ceil" gives
    e = -127 and the block maximum clips to 6 * 2^-127, where the exact quotient would give -126. (For
    normal quotients this cannot happen: every max has a significand above 1.5, so 1 ulp of amax moves
    the quotient by more than half an ulp.)"""
    a = above(F32(6.0 * 2.0**-127))
    assert Fraction(float(a)) / 6 > Fraction(1, 2**127) and F32(a) / F32(6) == F32(2.0**-127)
    codes, scales = mx.quantize(np.asarray([a] + [0.0] * 31, F32), "mxfp4", scale_rule="ceil")
    assert scales.view(np.uint8)[0] == 0 and float(codes[0]) == 6.0
    assert ex.shared_exponent(ex.exact(a), ex.SPECS["mxfp4"], "ceil") == -127


def test_floor_one_ulp_below_a_power_of_two():
    """float32 log2(prev(2^k)) rounds up to k; the OCP rule's exact floor gives k - 1."""
    a = below(F32(2.0**10))
    assert np.floor(np.log2(a)) == 10
    _, scales = mx.quantize(np.asarray([a] * 32, F32), "mxfp4")
    assert float(scales[0]) == 2.0 ** (9 - 2)


# ---------------------------------------------------------------------------------------------
# NVFP4
# ---------------------------------------------------------------------------------------------
def check_nvfp4(x: np.ndarray, global_scale=None) -> int:
    want_codes, want_scales, want_g = ex.quantize_nvfp4(x, global_scale)
    want_y = ex.dequantize_nvfp4(want_codes, want_scales, want_g)
    for kernels in PATHS:
        path = "kernels" if kernels else "reference"
        with use_kernels(kernels):
            codes, block_scales, g = mx.quantize(x, "nvfp4", global_scale=global_scale)
            assert g.dtype == F32 and g.shape == ()
            assert_same(g.reshape(1), np.asarray([want_g], F32), None, f"nvfp4 global scale ({path})")
            assert_same(block_scales.view(np.uint8), want_scales, None, f"nvfp4 block scales ({path})")
            assert_same(codes.view(np.uint8), want_codes, x, f"nvfp4 codes ({path})")
            y = mx.dequantize(codes, block_scales, global_scale=g)
        assert_same(y, want_y, x, f"nvfp4 dequantized ({path})")
    return x.size


def test_nvfp4_random_and_hazards():
    rng = np.random.default_rng([RNG_SEED, 99])
    checked = 0
    # Rows at very different magnitudes in one tensor: block scales down to E4M3 subnormals and zero.
    for _ in range(3):
        x = random_rows(rng, 12, 64).astype(np.float64)
        x *= np.ldexp(1.0, rng.integers(-30, 1, (12, 1))) / np.abs(x).max(axis=1, keepdims=True)
        checked += check_nvfp4(x.astype(F32))
    checked += check_nvfp4(random_rows(rng, 16, 48))
    # Exact ties of the block scale and of the elements.
    for j in (-100, -3, 0, 5, 100):
        checked += check_nvfp4(nvfp4_tie_tensor(rng, j))
    # bf16 Gaussians (many element ties) and a partial last block.
    g = rng.standard_normal((8, 70)).astype(F32).astype(ml_dtypes.bfloat16).astype(F32)
    checked += check_nvfp4(g)
    # Zeros, -0, tiny tensors whose amax / 2688 underflows (g = 1), subnormal tensors, huge tensors.
    checked += check_nvfp4(np.zeros((2, 32), F32))
    checked += check_nvfp4(np.full((1, 16), -0.0, F32))
    checked += check_nvfp4(np.asarray([[TINY, -TINY] * 8], F32))
    sub = (rng.integers(1, 1 << 23, (2, 32)).astype(np.uint32) | (rng.integers(0, 2, (2, 32)).astype(np.uint32) << 31))
    checked += check_nvfp4(sub.view(F32))
    checked += check_nvfp4(np.asarray([[FLT_MAX, -FLT_MAX, 1.0, -3e38] + [2.0**100] * 12, [1e-30] * 16], F32))
    big = random_rows(rng, 4, 32)
    big[0, 0] = FLT_MAX
    checked += check_nvfp4(big)
    # Blocks and rows of one element; axis along 0.
    checked += check_nvfp4(np.asarray([[0.3], [-7.0]], F32))
    assert checked > 3000


def test_nvfp4_given_tensor_scale():
    """A tensor scale passed in (as for activations with a calibrated amax): the same rules with that g,
    block scales saturating at 448 where amax / 6 / g exceeds it, and g from float32's subnormals to 2^100
    (block scales all E4M3 subnormal or zero there; d below 2^-100, where the kernels' thresholds take their
    float64 form)."""
    rng = np.random.default_rng([RNG_SEED, 101])
    x = random_rows(rng, 8, 80)  # a partial last block
    x[2, 5] = np.inf
    x[6, 70] = np.nan
    own = ex.nvfp4_global(x)
    checked = 0
    for g in (own, own * F32(0.25), own * F32(3.0), F32(2.0**-140), F32(2.0**-110), F32(2.0**100), F32(1.0)):
        checked += check_nvfp4(x, F32(g))
    for j in (-100, 0, 100):  # exact ties, with the tensor scale of another tensor
        t = nvfp4_tie_tensor(rng, j)
        checked += check_nvfp4(t, ex.nvfp4_global(t) * F32(0.75))
    assert checked > 5000


def test_nvfp4_axis():
    rng = np.random.default_rng([RNG_SEED, 100])
    x = random_rows(rng, 5, 40) * F32(2.0**-100)
    codes, s, g = mx.quantize(np.ascontiguousarray(x.T), "nvfp4", axis=0)
    want_codes, want_scales, want_g = ex.quantize_nvfp4(x)
    assert_same(codes.T.view(np.uint8), want_codes, x, "codes along axis 0")
    assert_same(s.T.view(np.uint8), want_scales, None, "block scales along axis 0")
    assert F32(g) == want_g


def test_nvfp4_specials():
    """NaN/Inf: the block's scale is E4M3 NaN (0x7F), its codes +0, its values NaN; the global scale is taken
    over the finite values only."""
    x = np.full((2, 32), 2.0, F32)
    x[0, 3] = np.nan
    x[1, 20] = -np.inf
    x[1, 0] = 5376.0  # the finite maximum: g = 2
    codes, s, g = mx.quantize(x, "nvfp4")
    assert F32(g) == F32(2.0)
    raw = s.view(np.uint8)
    assert raw[0, 0] == 0x7F and raw[1, 1] == 0x7F and raw[0, 1] != 0x7F and raw[1, 0] != 0x7F
    assert (codes.view(np.uint8)[0, :16] == 0).all() and (codes.view(np.uint8)[1, 16:] == 0).all()
    check_nvfp4(x)
    # An all-NaN tensor: no finite value, g = 1.
    check_nvfp4(np.full((1, 16), np.nan, F32))


def test_nvfp4_dequantize_every_code():
    """Every E2M1 code times every E4M3 block-scale byte (NaN and negative ones included) and two global
    scales: one whose products are float32 subnormals (rounded), and 1/3 (products of 24 + 2 bits, rounded)."""
    codes = np.tile(np.arange(16, dtype=np.uint8), (256, 1)).view(ml_dtypes.float4_e2m1fn)
    scales = np.arange(256, dtype=np.uint8).reshape(256, 1).view(ml_dtypes.float8_e4m3fn)
    for g in (F32(2.0**-130), F32(1 / 3)):
        want = ex.dequantize_nvfp4(codes.view(np.uint8), scales.view(np.uint8), g)
        for kernels in PATHS:
            with use_kernels(kernels):
                y = mx.dequantize(codes, scales, global_scale=np.asarray(g, F32))
            assert_same(y, want, None, f"g={g} ({kernels=})")
