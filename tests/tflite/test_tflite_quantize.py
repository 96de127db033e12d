"""qlinear.tflite.quantize / dequantize against the LiteRT interpreter, bit for bit, in each kernel family.

Every expected value comes from the interpreter (ai-edge-litert 2.3.0) running a one-op QUANTIZE or
DEQUANTIZE model (tests/tflite/litert_models.py) under the resolver of the family: BUILTIN_REF
("reference"), BUILTIN_WITHOUT_DEFAULT_DELEGATES ("optimized"), AUTO ("xnnpack"); the comparisons with
ONNX QuantizeLinear take theirs from an exact Fraction transcription of the ONNX formula. One model holds
many cases at once (tie-heavy values, random values, NaN/Inf/huge/subnormal values), and the element
count is chosen so that the optimized kernels' scalar tail (the last n % 8 elements) is exercised.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from qlinear.tflite import dequantize, quantize

from .litert_models import Runner, Tensor, build_model

KERNELS = ("reference", "optimized", "xnnpack")
F32 = np.float32
FLT_MIN = float(np.finfo(np.float32).tiny)

_RUNNERS: dict = {}


def _runner(op: str, in_t: Tensor, out_t: Tensor, kernel: str) -> Runner:
    """A cached interpreter for a one-op model (resizing the input reuses it for other sizes)."""
    key = (op, repr(in_t), repr(out_t), kernel)
    if key not in _RUNNERS:
        _RUNNERS[key] = Runner(build_model(op, [in_t], [out_t]), kernel)
    return _RUNNERS[key]


def _params(scale, zero_point, axis):
    scale = [float(F32(s)) for s in np.atleast_1d(scale)]
    zero_point = [int(z) for z in np.atleast_1d(zero_point)]
    if len(scale) > 1 and len(zero_point) == 1:
        zero_point = zero_point * len(scale)  # the flatbuffer loader wants one zero point per scale
    return scale, zero_point, (axis or 0)


def litert_quantize(x, dtype, scale, zero_point, kernel, axis=None):
    """The interpreter's QUANTIZE of float32 ``x``, and the runner (per-tensor models are resized to x)."""
    s, z, qd = _params(scale, zero_point, axis)
    ndim = x.ndim
    base = tuple(x.shape) if len(s) > 1 else (1,) * max(ndim, 1)
    r = _runner("QUANTIZE", Tensor(base, "float32"), Tensor(base, dtype, s, z, qd), kernel)
    return r(x.reshape(x.shape if ndim else (1,))).reshape(x.shape), r


def litert_dequantize(q, scale, zero_point, kernel, axis=None):
    s, z, qd = _params(scale, zero_point, axis)
    base = tuple(q.shape) if len(s) > 1 else (1,) * max(q.ndim, 1)
    r = _runner("DEQUANTIZE", Tensor(base, q.dtype, s, z, qd), Tensor(base, "float32"), kernel)
    return r(q.reshape(q.shape if q.ndim else (1,))).reshape(q.shape), r


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint32 if a.dtype == np.float32 else a.dtype)


def assert_same(got, expected, x=None):
    assert got.dtype == expected.dtype and got.shape == expected.shape
    bad = np.flatnonzero(_bits(got).ravel() != _bits(expected).ravel())
    if bad.size:
        detail = [(int(i), None if x is None else float(x.ravel()[i]), got.ravel()[i].item(), expected.ravel()[i].item())
                  for i in bad[:8]]
        pytest.fail(f"{bad.size} of {got.size} elements differ from the interpreter (index, x, qlinear, litert): {detail}")


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------
SPECIALS = [np.nan, -np.nan, np.inf, -np.inf, 1e10, -1e10, 3e9, -3e9, 3.4e38, -3.4e38, 0.0, -0.0,
            1e-45, -1e-45, 1e-39, -1e-39, 5.9e-39, 8e-39, -1.1e-38, 1.1754942e-38]


def quantize_inputs(scale, zero_point, dtype, seed=0, tail=5):
    """Tie-heavy values (x/s exactly at k + 1/2, and the float32 neighbours of those), grid values k * s, random
    values over the range and beyond, values whose quotient is near 2^31, and the SPECIALS; the length is
    8m + ``tail``, so the optimized kernels run their vector blocks and their scalar tail."""
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    s = F32(scale)
    lo, hi = int(info.min) - zero_point, int(info.max) - zero_point
    if hi - lo > 600:  # int16: around zero and both ends
        k = np.concatenate([np.arange(-300, 301), np.arange(lo - 4, lo + 5), np.arange(hi - 4, hi + 5)])
    else:
        k = np.arange(lo - 4, hi + 5)
    with np.errstate(over="ignore"):  # a scale near float32's maximum: some values overflow to +-inf
        ties = ((k + 0.5) * np.float64(s)).astype(F32)
        near = np.concatenate([np.nextafter(ties, F32(np.inf)), np.nextafter(ties, F32(-np.inf))])
        grid = (k * np.float64(s)).astype(F32)
        rand = rng.uniform((lo - 8) * float(s), (hi + 8) * float(s), 1500).astype(F32)
        big = (np.array([2147483520.0, -2147483648.0, 2147483647.0, -2147483649.0, 2.2e9, -2.2e9]) * np.float64(s)).astype(F32)
        # the scalar tail: ties of small quotients (where the tail's rounding differs from the blocks')
        small = ((np.array([0.5, -0.5, 1.5, -2.5, 2.5, -1.5, 3.5]) - 2 * np.sign(zero_point)) * np.float64(s)).astype(F32)
    x = rng.permutation(np.concatenate([ties, near, grid, rand, big, np.array(SPECIALS, F32)]))
    return np.concatenate([x[: len(x) - len(x) % 8], small[:tail]])


# (dtype, scale, zero point): power-of-two scales (exact reciprocals: only the rounding rule differs),
# scales whose reciprocal is inexact (multiplying by 1/s and dividing by s differ), FBGEMM's example of
# that, extreme zero points, a smallest-normal scale (subnormal inputs: XNNPACK reads them as zero) and a
# scale above 2^126 (XNNPACK's 1/s is subnormal, read as zero).
QUANTIZE_CASES = [
    ("int8", 0.5, 0),
    ("int8", 2.0**-7, -3),
    ("int8", 0.1, 3),
    ("int8", 0.0235, -7),
    ("int8", 1 / 3, -128),
    ("int8", 0.00214854861, 127),
    ("uint8", 0.1, 128),
    ("uint8", 1 / 255, 0),
    ("uint8", 0.0039, 255),
    ("int16", 2.0**-12, 0),
    ("int16", 0.001, 5),
    ("int16", 3.0517578e-05, -32768),
    ("int8", FLT_MIN, 0),
    ("uint8", 2.5e-38, 17),
    ("int8", 1e38, 1),
]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype,scale,zero_point", QUANTIZE_CASES)
def test_quantize_equals_the_interpreter(dtype, scale, zero_point, kernel):
    x = quantize_inputs(scale, zero_point, dtype, tail=(len(dtype) + zero_point) % 8)
    expected, runner = litert_quantize(x, dtype, scale, zero_point, kernel)
    # The AUTO interpreter runs XNNPACK for int8/uint8, the optimized kernel for int16 (not delegated).
    assert runner.delegated == (kernel == "xnnpack" and dtype != "int16")
    assert_same(quantize(x, scale, zero_point, dtype, kernel=kernel), expected, x)


def test_the_cases_separate_the_three_families():
    """The inputs above are ones on which the families disagree (else the test above would prove little)."""
    x = quantize_inputs(0.1, 3, "int8")
    ref, opt, xnn = (litert_quantize(x, "int8", 0.1, 3, k)[0] for k in KERNELS)
    # optimized and XNNPACK share the 8-blocks' arithmetic: they differ in the tail and on NaN/Inf/huge values
    assert (ref != opt).sum() > 100 and (ref != xnn).sum() > 100 and (opt != xnn).sum() > 0
    assert np.abs(ref[np.isfinite(x) & (np.abs(x) < 20)].astype(int) - opt[np.isfinite(x) & (np.abs(x) < 20)]).max() == 1


@pytest.mark.parametrize("kernel", KERNELS)
def test_every_size_splits_vector_blocks_and_scalar_tail_like_the_interpreter(kernel):
    """The optimized kernel's rule for an element depends on the tensor's size (its last n % 8 elements run the
    scalar loop); one interpreter, resized to every size from 1 to 41."""
    for n in range(1, 42):
        x = (((np.arange(n) % 9) - 4 + 0.5) * 0.25).astype(F32)  # x / s exactly at ties
        expected, _ = litert_quantize(x, "int8", 0.25, 0, kernel)
        assert_same(quantize(x, 0.25, 0, "int8", kernel=kernel), expected, x)
        x4 = x.reshape(1, 1, n, 1)  # NHWC: the flat (C) order is what counts
        assert_same(quantize(x4, 0.25, 0, "int8", kernel=kernel), expected.reshape(x4.shape), x4)


def test_optimized_mixes_two_rounding_rules_in_one_tensor():
    """15 elements: the first 8 are rounded ties-to-even after multiplying by 1/s, the last 7 half away from
    zero after dividing in double (the values are the interpreter's)."""
    x = (np.array([0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 3.5, -3.5, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 4.5]) * 0.5).astype(F32)
    expected = {"reference": [1, -1, 2, -2, 3, -3, 4, -4, 1, -1, 2, -2, 3, -3, 5],
                "optimized": [0, 0, 2, -2, 2, -2, 4, -4, 1, -1, 2, -2, 3, -3, 5],
                "xnnpack": [0, 0, 2, -2, 2, -2, 4, -4, 0, 0, 2, -2, 2, -2, 4]}
    for kernel in KERNELS:
        assert litert_quantize(x, "int8", 0.5, 0, kernel)[0].tolist() == expected[kernel]
        assert quantize(x, 0.5, 0, "int8", kernel=kernel).tolist() == expected[kernel]


# ---------------------------------------------------------------------------------------------
# Per-channel
# ---------------------------------------------------------------------------------------------
PER_CHANNEL_CASES = [
    # dtype, shape, axis, scales, zero points
    ("int8", (2, 3, 4, 5), 3, [0.1, 0.5, 0.0235, 1 / 3, 2.0**-7], [3, 0, -7, -128, 127]),
    ("uint8", (2, 3, 4, 5), 1, [0.1, 1 / 255, 0.0039], [128, 0, 255]),
    ("int16", (3, 4, 7), 0, [0.001, 2.0**-12, 3.0517578e-05], [5, 0, -32768]),
    ("int8", (6, 7), 0, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0, 1, -1, 2, -2, 3]),
]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype,shape,axis,scales,zero_points", PER_CHANNEL_CASES)
def test_per_channel_quantize_equals_the_interpreter(dtype, shape, axis, scales, zero_points, kernel):
    """Per-channel QUANTIZE runs reference_ops::PerChannelQuantize in every family (XNNPACK declines it)."""
    rng = np.random.default_rng(len(shape) + axis)
    size = int(np.prod(shape))
    channel = np.indices(shape)[axis].ravel()
    s = np.asarray(scales, np.float64)[channel]
    z = np.asarray(zero_points)[channel]
    k = rng.integers(-140, 140, size) - z * (rng.random(size) < 0.5)
    x = np.where(rng.random(size) < 0.5, (k + 0.5) * s, (k + rng.uniform(-0.5, 0.5, size)) * s).astype(F32)
    x[rng.choice(size, len(SPECIALS), replace=False)] = SPECIALS
    x = x.reshape(shape)
    expected, runner = litert_quantize(x, dtype, scales, zero_points, kernel, axis=axis)
    assert not runner.delegated
    assert_same(quantize(x, scales, zero_points, dtype, axis=axis, kernel=kernel), expected, x)
    assert_same(quantize(x, np.asarray(scales, np.float32), np.asarray(zero_points), dtype, axis=axis - len(shape),
                         kernel=kernel), expected, x)


@pytest.mark.parametrize("kernel", KERNELS)
def test_one_zero_point_for_all_channels_is_broadcast(kernel):
    x = np.linspace(-30, 30, 4 * 9, dtype=F32).reshape(4, 9)
    expected, _ = litert_quantize(x, "int8", [0.1, 0.2, 0.3, 0.25], [-5, -5, -5, -5], kernel, axis=0)
    assert_same(quantize(x, [0.1, 0.2, 0.3, 0.25], -5, "int8", axis=0, kernel=kernel), expected, x)


@pytest.mark.parametrize("kernel", KERNELS)
def test_one_scale_with_an_axis_is_per_tensor(kernel):
    """IsQuantizedPerChannel is ``scale->size > 1``: one scale is per-tensor whatever the axis says, so the
    optimized and XNNPACK arithmetic apply."""
    x = quantize_inputs(0.1, 3, "int8").reshape(1, -1)
    expected, _ = litert_quantize(x, "int8", 0.1, 3, kernel)
    assert_same(quantize(x, [0.1], [3], "int8", axis=0, kernel=kernel), expected, x)


# ---------------------------------------------------------------------------------------------
# DEQUANTIZE
# ---------------------------------------------------------------------------------------------
DEQUANTIZE_CASES = [
    ("int8", 0.0235, -7),
    ("int8", 0.1, 3),
    ("int8", 0.5, 127),
    ("uint8", 0.1, 128),
    ("uint8", 1 / 3, 7),
    ("uint8", FLT_MIN, 255),
    ("int16", 0.001, 0),
    ("int16", 3e-5, 0),
    ("int8", 3e38, 100),  # products overflow: inf, and inf + -inf = NaN in the optimized kernel
]


def dequantize_inputs(dtype, seed=0, tail=7):
    """Every value (int16: every value near 0 and both ends) and random ones; 8m + ``tail`` elements, the tail
    random too (where the optimized kernel's scalar loop takes over)."""
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    if info.bits == 16:
        every = np.concatenate([np.arange(-3000, 3000), np.arange(info.min, info.min + 50), np.arange(info.max - 50, info.max + 1)])
    else:
        every = np.arange(int(info.min), int(info.max) + 1)
    q = rng.permutation(np.concatenate([every, rng.integers(int(info.min), int(info.max) + 1, 1000)]).astype(dtype))
    return q[: len(q) - len(q) % 8 + tail - (8 if len(q) % 8 < tail else 0)]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype,scale,zero_point", DEQUANTIZE_CASES)
def test_dequantize_equals_the_interpreter(dtype, scale, zero_point, kernel):
    q = dequantize_inputs(dtype)
    expected, runner = litert_dequantize(q, scale, zero_point, kernel)
    assert runner.delegated == (kernel == "xnnpack" and dtype != "int16")
    assert_same(dequantize(q, scale, zero_point, kernel=kernel), expected)


@pytest.mark.parametrize("kernel", ("reference", "optimized"))
def test_dequantize_with_a_subnormal_scale(kernel):
    """The reference and optimized kernels take a subnormal scale (XNNPACK refuses it: see the errors)."""
    q = dequantize_inputs("int8")
    expected, _ = litert_dequantize(q, 1e-40, 1, kernel)
    assert_same(dequantize(q, 1e-40, 1, kernel=kernel), expected)


def test_optimized_dequantize_rounds_twice():
    """fl32(fl32(q * s) + fl32(-zp * s)) in the 8-blocks differs from the reference's fl32(s * (q - zp))."""
    q = np.arange(-128, 128).astype(np.int8)
    ref, opt = (litert_dequantize(q, 0.0235, -7, k)[0] for k in ("reference", "optimized"))
    assert (ref != opt).sum() == 36  # the survey's count, for these 256 values
    for kernel, expected in (("reference", ref), ("optimized", opt)):
        assert_same(dequantize(q, 0.0235, -7, kernel=kernel), expected)
    exact = np.array([float(Fraction(float(F32(0.0235))) * (v + 7)) for v in q.tolist()], np.float32)
    assert_same(ref, exact)  # the reference is the correctly rounded product, as ONNX's DequantizeLinear


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype,axis", [("int8", 0), ("int8", 2), ("uint8", 1)])
def test_per_channel_dequantize_equals_the_interpreter(dtype, axis, kernel):
    shape = (3, 5, 4)
    rng = np.random.default_rng(axis)
    info = np.iinfo(dtype)
    q = rng.integers(int(info.min), int(info.max) + 1, shape).astype(dtype)
    n = shape[axis]
    scales = [0.0235, 0.1, 1 / 3, 0.5, 3e-3][:n]
    zps = [int(z) for z in rng.integers(int(info.min), int(info.max) + 1, n)]
    expected, runner = litert_dequantize(q, scales, zps, kernel, axis=axis)
    assert not runner.delegated
    assert_same(dequantize(q, scales, zps, axis=axis, kernel=kernel), expected)


# ---------------------------------------------------------------------------------------------
# NaN, infinities, out of range: each family's x86 behaviour, and strict=True
# ---------------------------------------------------------------------------------------------
def test_nan_infinities_and_huge_values_per_family():
    """The reference and optimized kernels convert NaN, +-Inf and quotients beyond int32 to INT32_MIN and add the
    zero point in int32: the type minimum for zp >= 0, the maximum (wrapped) for zp < 0, whatever the sign.
    XNNPACK saturates by sign, and NaN gives the maximum. (Values from the interpreter.)"""
    x = np.array([np.nan, np.inf, -np.inf, 1e10, -1e10, 3e9, -3e9, 0.5] * 2 + [np.nan, np.inf, -np.inf, 1e10, -1e10, 3e9, -3e9], F32)
    nan_inf_huge = [np.nan, np.inf, -np.inf, 1e10, -1e10, 3e9, -3e9]
    assert np.array_equal(x[-7:], nan_inf_huge, equal_nan=True)
    for zp, wrapped in ((0, -128), (5, -128), (-7, 127)):
        for kernel in KERNELS:
            expected, _ = litert_quantize(x, "int8", 0.5, zp, kernel)
            got = quantize(x, 0.5, zp, "int8", kernel=kernel)
            assert_same(got, expected, x)
            special = got[np.abs(x) != 0.5]
            if kernel == "xnnpack":
                assert special.tolist() == [127, 127, -128, 127, -128, 127, -128] * 3
            else:
                assert (special == wrapped).all()


def test_in_range_quotient_can_wrap_when_the_zero_point_is_added():
    """x / s = 2147483520 fits int32, but + 200 overflows and wraps to a negative value: uint8 0, not 255
    (reference and optimized); XNNPACK saturates."""
    x = np.full(19, 2147483520.0, F32)
    for kernel, value in (("reference", 0), ("optimized", 0), ("xnnpack", 255)):
        expected, _ = litert_quantize(x, "uint8", 1.0, 200, kernel)
        assert (expected == value).all()
        assert_same(quantize(x, 1.0, 200, "uint8", kernel=kernel), expected, x)


def test_xnnpack_reads_subnormals_as_zero():
    """XNNPACK runs with denormals disabled: a subnormal x quantizes to the zero point even where x / s >= 0.5."""
    x = np.array([0.75 * FLT_MIN, -0.75 * FLT_MIN, 0.5 * FLT_MIN, FLT_MIN] * 4, F32)
    results = {k: litert_quantize(x, "int8", FLT_MIN, 0, k)[0] for k in KERNELS}
    assert results["reference"][:4].tolist() == [1, -1, 1, 1]
    assert results["xnnpack"][:4].tolist() == [0, 0, 0, 1]
    for kernel in KERNELS:
        assert_same(quantize(x, FLT_MIN, 0, "int8", kernel=kernel), results[kernel], x)


def _documented(x, scale, zero_point, dtype):
    """clamp(round(x / s) + zp): +-Inf and out-of-range quotients saturate by sign (for the finite values
    below the rounding rule does not matter: no quotient is near a tie)."""
    info = np.iinfo(dtype)
    out = []
    for v in x.tolist():
        if np.isinf(v):
            r = int(info.max) if v > 0 else int(info.min)
        else:
            q = Fraction(v) / Fraction(float(F32(scale)))
            r = int(round(q)) + zero_point
        out.append(min(max(r, int(info.min)), int(info.max)))
    return np.array(out, dtype=dtype)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype,zero_point", [("int8", -7), ("int8", 5), ("uint8", 200), ("int16", -3)])
def test_strict_saturates_what_the_kernels_leave_undefined(dtype, zero_point, kernel):
    huge = np.array([np.inf, -np.inf, 1e10, -1e10, 3e9, -3e9, 3.4e38, -3.4e38, 2147483520.0, -2147483648.0], F32)
    ordinary = quantize_inputs(1.0, zero_point, dtype)
    ordinary = ordinary[np.isfinite(ordinary) & (np.abs(ordinary) < 1e5)]
    x = np.concatenate([ordinary, huge, huge[:3]])
    got = quantize(x, 1.0, zero_point, dtype, kernel=kernel, strict=True)
    tail_start = len(x) - len(x) % 8
    assert_same(got[len(ordinary):], _documented(x[len(ordinary):], 1.0, zero_point, dtype))
    # Everything else is the kernel's own arithmetic, element for element (position included).
    expected, _ = litert_quantize(x, dtype, 1.0, zero_point, kernel)
    assert_same(got[: len(ordinary)], expected[: len(ordinary)], x[: len(ordinary)])
    assert tail_start > len(ordinary)  # some huge values run the optimized kernel's vector blocks
    with pytest.raises(ValueError, match="NaN"):
        quantize(np.array([1.0, np.nan], F32), 1.0, zero_point, dtype, kernel=kernel, strict=True)


# ---------------------------------------------------------------------------------------------
# Against ONNX QuantizeLinear: y = saturate(round_half_even(x / y_scale) + zp)
# ---------------------------------------------------------------------------------------------
def _onnx_exact(x, scale, zero_point, dtype):
    """ONNX QuantizeLinear, exactly (Fraction; Python's round() of a Fraction is half to even); NaN -> the
    type minimum and saturation, as qlinear's ONNX operator does (docs/semantics.md rows 6-7)."""
    info = np.iinfo(dtype)
    out = []
    for v in x.tolist():
        if np.isnan(v):
            out.append(int(info.min))
            continue
        r = (int(info.max) if v > 0 else int(info.min)) if np.isinf(v) else round(Fraction(v) / Fraction(float(F32(scale)))) + zero_point
        out.append(min(max(r, int(info.min)), int(info.max)))
    return np.array(out, dtype=dtype)


def test_reference_rounds_ties_away_from_zero_unlike_onnx():
    x = (np.arange(-10, 10) + 0.5).astype(F32) * F32(0.25)  # x / s exactly at k + 1/2
    ref, _ = litert_quantize(x, "int8", 0.25, 0, "reference")
    onnx = _onnx_exact(x, 0.25, 0, "int8")
    assert (ref != onnx).sum() == 10 and (np.abs(ref.astype(int) - onnx) <= 1).all()
    assert ref.tolist() == [int(np.sign(v) * np.floor(abs(v) + 0.5)) for v in (np.arange(-10, 10) + 0.5)]
    assert_same(quantize(x, 0.25, 0, "int8"), ref, x)


def test_multiplying_by_the_reciprocal_differs_from_dividing():
    """FBGEMM's example: s = 0.00214854861; x / s is 127.499992 (rounds to 127) but x * fl32(1/s) is 127.5
    (ties to even: 128). The optimized 8-blocks and XNNPACK multiply; the reference divides, as ONNX does."""
    s = F32(0.00214854861)
    x = np.full(8, F32(127.5) * s, F32)
    assert float(Fraction(float(x[0])) / Fraction(float(s))) < 127.5
    results = {k: litert_quantize(x, "int8", s, -10, k)[0] for k in KERNELS}
    assert results["reference"][0] == _onnx_exact(x[:1], s, -10, "int8")[0] == 127 - 10
    assert results["optimized"][0] == results["xnnpack"][0] == 128 - 10
    for kernel in KERNELS:
        assert_same(quantize(x, s, -10, "int8", kernel=kernel), results[kernel], x)


def test_optimized_tail_divides_in_double():
    """In the scalar tail the quotient is double(x) / s. Where the reference's float32 division rounds the
    quotient onto a tie k + 1/2 (and std::round then goes away from zero), the double quotient stays inside
    the tie, so the tail rounds toward zero: one apart, and equal to the exactly rounded quotient."""
    s = F32(0.1)
    k = np.arange(-60, 60)
    x = ((k + 0.5) * np.float64(s)).astype(F32)
    q32 = x / s  # the float32 quotient
    exact = [Fraction(float(v)) / Fraction(float(s)) for v in x.tolist()]
    inside = np.array([abs(e) < abs(t + Fraction(1, 2)) for e, t in zip(exact, k.tolist())])
    picked = x[(q32 == (k + 0.5)) & inside][:7]  # float32 division lands on the tie, the exact quotient is inside
    assert len(picked) == 7
    for kernel in ("reference", "optimized"):
        expected, _ = litert_quantize(picked, "int8", s, 0, kernel)  # 7 elements: all in the scalar tail
        assert_same(quantize(picked, s, 0, "int8", kernel=kernel), expected, picked)
    ref, _ = litert_quantize(picked, "int8", s, 0, "reference")
    opt, _ = litert_quantize(picked, "int8", s, 0, "optimized")
    onnx = _onnx_exact(picked, s, 0, "int8")  # the exact quotient is no tie: nearest
    assert (ref != opt).all() and (np.abs(ref.astype(int) - opt) == 1).all()
    assert np.array_equal(opt, np.array([int(np.floor(Fraction(float(v)) / Fraction(float(s)) + Fraction(1, 2))) for v in picked], np.int8))
    assert np.array_equal(onnx, opt)


def test_nan_and_infinity_differ_from_onnx():
    x = np.array([np.nan, np.inf, -np.inf, 1e10], F32)
    onnx = _onnx_exact(x, 0.5, -7, "int8").tolist()
    assert onnx == [-128, 127, -128, 127]
    assert litert_quantize(x, "int8", 0.5, -7, "reference")[0].tolist() == [127, 127, 127, 127]
    assert litert_quantize(x, "int8", 0.5, -7, "xnnpack")[0].tolist() == [127, 127, -128, 127]
    assert quantize(x, 0.5, -7, "int8").tolist() == [127, 127, 127, 127]
    assert quantize(x[1:], 0.5, -7, "int8", strict=True).tolist() == onnx[1:]


# ---------------------------------------------------------------------------------------------
# Errors: qlinear's, and the interpreter's that they mirror
# ---------------------------------------------------------------------------------------------
X = np.zeros((2, 3), F32)
Q8 = np.zeros((2, 3), np.int8)
Q16 = np.zeros((2, 3), np.int16)


@pytest.mark.parametrize("call,error,match", [
    (lambda: quantize(X, 0.1, 0, "int4"), ValueError, "dtype must be int8, uint8 or int16"),
    (lambda: quantize(X, 0.1, 0, "float32"), ValueError, "dtype must be"),
    (lambda: quantize(X, 0.1, 0, "int8", kernel="ruy"), ValueError, "kernel must be one of"),
    (lambda: quantize(X, 0.1, 0, "int8", kernel=1), TypeError, "kernel must be a string"),
    (lambda: quantize(X, 0.1, 0, "int8", strict=1), TypeError, "strict must be a bool"),
    (lambda: quantize(X.astype(complex), 0.1, 0, "int8"), TypeError, "x must hold real numbers"),
    (lambda: quantize(X, 0.0, 0, "int8"), ValueError, "scale must be positive and finite"),
    (lambda: quantize(X, -0.1, 0, "int8"), ValueError, "scale must be positive and finite"),
    (lambda: quantize(X, 1e-50, 0, "int8"), ValueError, "scale must be positive and finite once rounded to float32"),
    (lambda: quantize(X, np.nan, 0, "int8"), ValueError, "scale must be positive and finite"),
    (lambda: quantize(X, 1e39, 0, "int8"), ValueError, "scale must be positive and finite"),
    (lambda: quantize(X, 0.1, 128, "int8"), ValueError, r"zero_point must lie in the range of int8, \[-128, 127\]"),
    (lambda: quantize(X, 0.1, -1, "uint8"), ValueError, "zero_point must lie in the range of uint8"),
    (lambda: quantize(X, 0.1, 0.5, "int8"), TypeError, "zero_point must be an integer"),
    (lambda: quantize(X, 0.1, True, "int8"), TypeError, "zero_point must be an integer"),
    (lambda: quantize(X, [0.1, 0.2], 0, "int8"), ValueError, "no axis: per-channel quantization needs axis"),
    (lambda: quantize(X, [0.1, 0.2], 0, "int8", axis=1), ValueError, r"per-channel scale must have shape\[axis\] = 3"),
    (lambda: quantize(X, [0.1, 0.2], [0, 0, 0], "int8", axis=0), ValueError, "zero_point must have one value or as many as scale"),
    (lambda: quantize(X, 0.1, [0, 1], "int8"), ValueError, "one scale .per-tensor. needs one zero_point"),
    (lambda: quantize(X, [[0.1, 0.2]], 0, "int8", axis=0), ValueError, "scale must be a scalar or a 1-D array"),
    (lambda: quantize(X, 0.1, 0, "int8", axis=2), ValueError, r"axis .the quantized dimension. must be in \[-2, 2\)"),
    (lambda: quantize(X, 0.1, 0, "int8", axis=1.0), TypeError, "axis must be None or an int"),
    (lambda: quantize(X, 1e-40, 0, "int8", kernel="xnnpack"), ValueError, "kernel='xnnpack' needs a normal float32 scale"),
    (lambda: dequantize(Q8, 1e-40, 0, kernel="xnnpack"), ValueError, "kernel='xnnpack' needs a normal float32 scale"),
    (lambda: dequantize(X, 0.1, 0), TypeError, "q must have dtype int8, uint8 or int16"),
    (lambda: dequantize([1, 2], 0.1, 0), TypeError, "q must be an array"),
    (lambda: dequantize(Q16, 0.1, 3), ValueError, "an int16 input needs zero_point 0"),
    (lambda: dequantize(Q16, [0.1, 0.2], 0, axis=0), ValueError, "per-channel DEQUANTIZE takes uint8 and int8 only"),
    (lambda: dequantize(Q8, 0.1, 300), ValueError, "zero_point must lie in the range of int8"),
    (lambda: quantize(X, 0.1, 2**70, "int16"), ValueError, "zero_point must lie in the range of int16"),
    (lambda: quantize(X, 0.1, np.uint64(2**63 + 5), "uint8"), ValueError, "zero_point must lie in the range of uint8"),
    (lambda: quantize(X, "0.1", 0, "int8"), TypeError, "scale must hold real numbers"),
])
def test_argument_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_rules_qlinear_enforces_are_the_interpreters():
    """What qlinear refuses, the interpreter refuses too (or, for QUANTIZE under AUTO with a zero point outside
    the type or a scale XNNPACK rejects, crashes: not run here)."""
    def refused(op, in_t, out_t, kernel, x):
        with pytest.raises((RuntimeError, ValueError)) as info:
            Runner(build_model(op, [in_t], [out_t]), kernel)(x)
        return str(info.value)

    q16 = np.zeros(16, np.int16)
    for kernel in KERNELS:
        assert "zero_point != 0" in refused("DEQUANTIZE", Tensor((16,), "int16", 0.01, 3), Tensor((16,), "float32"), kernel, q16)
        assert "not supported for per-channel" in refused(
            "DEQUANTIZE", Tensor((2, 8), "int16", [0.1, 0.2], [0, 0]), Tensor((2, 8), "float32"), kernel, q16.reshape(2, 8))
    q8 = np.zeros(16, np.int8)
    assert "unsupported scale value" in refused("DEQUANTIZE", Tensor((16,), "int8", 1e-40, 0), Tensor((16,), "float32"), "xnnpack", q8)
    assert "unsupported zero-point value" in refused("DEQUANTIZE", Tensor((16,), "int8", 0.1, 200), Tensor((16,), "float32"), "xnnpack", q8)
    # The flatbuffer loader wants per-channel scales to number shape[quantized_dimension].
    assert "per-axis quantization" in refused("QUANTIZE", Tensor((2, 3), "float32"), Tensor((2, 3), "int8", [0.1, 0.2], [0, 0], 1), "reference",
                                              np.zeros((2, 3), F32))


def test_int16_quantize_takes_any_zero_point_in_range():
    """Unlike DEQUANTIZE, QUANTIZE's Prepare (float32 -> int16) has no zero-point rule in LiteRT 2.3.0."""
    x = np.linspace(-40, 40, 21, dtype=F32)
    for kernel in KERNELS:
        expected, _ = litert_quantize(x, "int16", 0.01, 1234, kernel)
        assert_same(quantize(x, 0.01, 1234, "int16", kernel=kernel), expected, x)


def test_inputs_are_converted_to_float32_and_shapes_kept():
    x64 = np.array([[0.15, -0.25], [1e-3, 7.0]])
    assert_same(quantize(x64, 0.1, 0, "int8"), quantize(x64.astype(F32), 0.1, 0, "int8"))
    assert quantize(np.int32(5), 0.5, 0, np.int8).shape == ()
    assert quantize([1.0, 2.0], 0.5, 0, np.dtype("uint8")).dtype == np.uint8
    assert dequantize(np.zeros((0, 3), np.uint8), 0.5, 0).shape == (0, 3)
