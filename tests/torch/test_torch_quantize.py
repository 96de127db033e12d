"""qlinear.torch against torch itself: bit-identical int_repr() and float32 bits.

Every comparison calls the installed torch (CPU, x86) on the same float32 input. The cases: random values
over every dtype and zero point, tie-heavy values (x / s exactly at .5 with power-of-two scales, and scales
whose float32 reciprocal is inexact, where multiplying by it and dividing round differently), NaN, ±Inf,
values at and beyond ±2^31, per-tensor and per-channel, and fake quantization over several quant_min /
quant_max ranges. torch 2.13.0 alone adds the zero point before rounding (FBGEMM's LEGACY path); with it
installed the comparisons use ``legacy=True``, and the LEGACY arithmetic is otherwise checked against the
exact transcription in torch_exact.py (as is ``strict=True``, which no torch computes).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch_exact as ex
from hypothesis import given, settings
from hypothesis import strategies as st
from suite import examples

import qlinear
import qlinear.torch as qt

torch = pytest.importorskip("torch", reason="torch (the oracle of qlinear.torch) is not installed: uv sync")

# torch 2.15 warns that quantized tensor creation is deprecated; the operators are unchanged.
pytestmark = pytest.mark.filterwarnings("ignore:.*quantized tensor creation functions:UserWarning")

LEGACY = torch.__version__.startswith("2.13.")
F32 = np.float32
RANGES = {"quint8": (0, 255), "qint8": (-128, 127), "qint32": (-(2**31), 2**31 - 1)}
ZERO_POINTS = {
    "quint8": [0, 1, 3, 127, 128, 200, 255],
    "qint8": [-128, -77, -1, 0, 3, 127],
    "qint32": [-(2**31), -5, 0, 3, 12345, 2**31 - 1],
}
SPECIALS = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 3.4e38, -3.4e38, 1e19, -1e19,
                     2147483520.0, -2147483648.0, 2147483648.0, -2147483904.0, 2147483392.0, 16777217.0,
                     -16777217.0, 33554436.0], np.float32)


# ---------------------------------------------------------------------------------------------
# torch, NumPy in and out
# ---------------------------------------------------------------------------------------------
def t_per_tensor(x, scale, zero_point, dtype):
    return torch.quantize_per_tensor(torch.from_numpy(np.array(x, dtype=F32)), float(scale), int(zero_point),
                                     getattr(torch, dtype)).int_repr().numpy()


def t_per_channel(x, scales, zero_points, axis, dtype):
    return torch.quantize_per_channel(
        torch.from_numpy(np.array(x, dtype=F32)), torch.tensor(np.asarray(scales, np.float64)),
        torch.tensor(np.asarray(zero_points, np.int64)), axis, getattr(torch, dtype)).int_repr().numpy()


def t_fake_per_tensor(x, scale, zero_point, qmin, qmax):
    return torch.fake_quantize_per_tensor_affine(torch.from_numpy(np.array(x, dtype=F32)), float(scale),
                                                 int(zero_point), qmin, qmax).numpy()


def t_fake_per_channel(x, scales, zero_points, axis, qmin, qmax):
    return torch.fake_quantize_per_channel_affine(
        torch.from_numpy(np.array(x, dtype=F32)), torch.tensor(np.asarray(scales, F32)),
        torch.tensor(np.asarray(zero_points, np.int32)), axis, qmin, qmax).numpy()


def assert_same(ours, theirs, context=""):
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, (ours.dtype, theirs.dtype, ours.shape, theirs.shape)
    if ours.tobytes() != theirs.tobytes():
        a, b = ours.reshape(-1), theirs.reshape(-1)
        if ours.dtype.kind == "f":
            a, b = a.view(np.uint32), b.view(np.uint32)
        bad = np.flatnonzero(a != b)
        raise AssertionError(f"{context}: {bad.size} of {a.size} differ, first at {bad[:5]}: "
                             f"qlinear {ours.reshape(-1)[bad[:5]]}, torch {theirs.reshape(-1)[bad[:5]]}")


def per_tensor(x, scale, zp, dtype, **kw):
    return qt.quantize_per_tensor(x, scale, zp, dtype, legacy=LEGACY, **kw)


def per_channel(x, scales, zps, axis, dtype, **kw):
    return qt.quantize_per_channel(x, scales, zps, axis, dtype, legacy=LEGACY, **kw)


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------
RNG_SEED = 20260421


def _scales(rng):
    """Power-of-two scales (x * (1/s) is x / s), decimal ones (0.1: inexact reciprocal), random ones."""
    return [1.0, 0.5, 2.0**-7, 2.0**-20, 0.1, 0.3, 1 / 3, 0.00214854861, 0.02, 7.5, float(rng.uniform(1e-3, 1)),
            float(rng.uniform(1e-6, 1e-3))]


def _values(rng, scale, n=1031):
    """n values (odd: the AVX2 loop's masked remainder runs too) over the int8 and int32 grids and beyond,
    with ties: half-integer multiples of the scale."""
    s = F32(scale)
    grid = rng.integers(-300, 300, n // 3).astype(np.float64) + 0.5
    ties = (grid * float(s)).astype(F32)  # x / s at .5 up to the float32 rounding of x
    normal = (rng.standard_normal(n // 3) * 150 * float(s)).astype(F32)
    wide = (rng.standard_normal(n - 2 * (n // 3)) * 2.0**rng.integers(0, 40, n - 2 * (n // 3)) * float(s)).astype(F32)
    return np.concatenate([ties, normal, wide, SPECIALS])


# ---------------------------------------------------------------------------------------------
# quantize_per_tensor / quantize_per_channel
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["quint8", "qint8", "qint32"])
def test_quantize_per_tensor_equals_torch(dtype):
    rng = np.random.default_rng(RNG_SEED)
    for scale in _scales(rng):
        x = _values(rng, scale)
        for zp in ZERO_POINTS[dtype]:
            assert_same(per_tensor(x, scale, zp, dtype), t_per_tensor(x, scale, zp, dtype), f"{dtype} s={scale} zp={zp}")


def test_large_tensors_split_across_threads_equal_torch():
    """torch hands each of its threads a slice of the tensor (fbgemmPartition1D); every slice's AVX2 loop and
    masked remainder compute the same function, so the split does not show."""
    rng = np.random.default_rng(RNG_SEED + 8)
    x = np.concatenate([_values(rng, 0.05, 100_003), np.repeat(SPECIALS, 101)])
    rng.shuffle(x)
    for dtype, zp in (("quint8", 131), ("qint8", -7), ("qint32", 5)):
        assert_same(per_tensor(x, 0.05, zp, dtype), t_per_tensor(x, 0.05, zp, dtype), dtype)
    assert_same(qt.fake_quantize_per_tensor_affine(x, 0.05, 3, -8, 7), t_fake_per_tensor(x, 0.05, 3, -8, 7))


@pytest.mark.parametrize("dtype", ["quint8", "qint8", "qint32"])
def test_quantize_per_channel_equals_torch(dtype):
    rng = np.random.default_rng(RNG_SEED + 1)
    for shape, axis in [((5, 211), 0), ((3, 4, 37), 1), ((2, 3, 5, 7), 3), ((1,), 0), ((9, 0, 2), 2)]:
        c = shape[axis]
        scales = rng.choice(_scales(rng), c)
        zps = rng.choice(ZERO_POINTS[dtype], c)
        x = rng.choice(_values(rng, 0.1), shape) * np.expand_dims(scales / 0.1, tuple(i for i in range(len(shape)) if i != axis)).astype(F32)
        x = x.astype(F32)
        assert_same(per_channel(x, scales, zps, axis, dtype), t_per_channel(x, scales, zps, axis, dtype),
                    f"{dtype} {shape} axis={axis}")


@pytest.mark.parametrize("dtype", ["quint8", "qint8", "qint32"])
def test_specials_nan_inf_and_beyond_int32_equal_torch(dtype):
    """NaN, ±Inf, ±huge, around ±2^31 and 2^24, every zero point, alone and inside a vector."""
    for zp in ZERO_POINTS[dtype]:
        for scale in (1.0, 0.25, 3e-5):
            for x in (SPECIALS, np.repeat(SPECIALS, 9)):
                assert_same(per_tensor(x, scale, zp, dtype), t_per_tensor(x, scale, zp, dtype), f"{dtype} zp={zp}")
                xc = x.reshape(1, -1)
                assert_same(per_channel(xc, [scale], [zp], 0, dtype), t_per_channel(xc, [scale], [zp], 0, dtype),
                            f"per-channel {dtype} zp={zp}")


def test_documented_x86_outcomes_of_specials():
    """The x86 outcomes docs/torch.md states, pinned against torch (and against the statement)."""
    x = np.array([np.nan, np.inf, -np.inf, 1e10, -1e10], F32)
    cases = [  # (dtype, zp, per-tensor, per-channel)
        ("quint8", 3, [255, 255, 0, 255, 0], [0, 255, 0, 255, 0]),
        ("quint8", 200, [0, 0, 0, 0, 0], [0, 255, 0, 255, 0]),  # int32 wrap of the zero point addition
        ("qint8", 0, [127, 127, -128, 127, -128], [0, 127, -128, 127, -128]),
        ("qint8", -5, [127, 127, 127, 127, 127], [0, 127, -128, 127, -128]),  # -Inf + (-5) wraps to +
        ("qint32", 0, [-(2**31), 2**31 - 1, -(2**31), 2**31 - 1, -(2**31)], [-(2**31), 2**31 - 1, -(2**31), 2**31 - 1, -(2**31)]),
    ]
    for dtype, zp, tensor_expected, channel_expected in cases:
        assert_same(per_tensor(x, 1.0, zp, dtype), t_per_tensor(x, 1.0, zp, dtype), dtype)
        assert_same(per_channel(x.reshape(1, -1), [1.0], [zp], 0, dtype), t_per_channel(x.reshape(1, -1), [1.0], [zp], 0, dtype))
        # the statements, measured on torch 2.15.0 (legacy=True differs per tensor: no wrap-around there)
        assert qt.quantize_per_tensor(x, 1.0, zp, dtype).tolist() == tensor_expected, (dtype, zp)
        assert qt.quantize_per_channel(x.reshape(1, -1), [1.0], [zp], 0, dtype).ravel().tolist() == channel_expected
        if dtype != "qint32":  # ONNX QuantizeLinear (no int32 output): NaN -> the type minimum, the rest saturates
            lo, hi = RANGES[dtype]
            zp_typed = np.dtype(qt.TORCH_QUANTIZED_TYPES[dtype]).type(zp)
            assert qlinear.quantize_linear(x, F32(1), zp_typed).tolist() == [lo, hi, lo, hi, lo]
            assert qt.quantize_per_tensor(x[1:], 1.0, zp, dtype, strict=True).tolist() == [hi, lo, hi, lo]


def test_qint32_zero_point_is_added_in_float32():
    """qint32 (FBGEMM's scalar path): zero_point + nearbyint(x * inv) is a float32 sum, so above 2^24 it rounds:
    x = 2^24 + 2 with zero point 1 is the tie 2^24 + 3 between two float32 values, and gives the even one,
    2^24 + 4. strict=True adds exactly."""
    x = np.array([2.0**24 + 2, -(2.0**25) + 4, 2.0**30], F32)
    ours = per_tensor(x, 1.0, 1, "qint32")
    assert_same(ours, t_per_tensor(x, 1.0, 1, "qint32"))
    exact = x.astype(np.int64) + 1
    assert (ours != exact).any()
    assert ours[0] == 2**24 + 4 and exact[0] == 2**24 + 3
    strict = qt.quantize_per_tensor(x, 1.0, 1, "qint32", strict=True)
    assert strict.tolist() == exact.tolist()


def test_multiplying_by_the_float32_reciprocal_differs_from_dividing():
    """torch multiplies by float32(1 / s); dividing in float32 (ONNX QuantizeLinear's x / y_scale) rounds
    differently where the reciprocal is inexact. The first case is FBGEMM's own example: x * inv is 127.5
    (a tie, to 128), x / s is 127.499992 (to 127)."""
    rng = np.random.default_rng(RNG_SEED + 2)
    xs, ss = [F32(0.273939937)], [F32(0.00214854861)]
    while len(xs) < 64:  # search ties x = (k + 1/2) s, and their float32 neighbours, where the two round apart
        s = F32(rng.uniform(1e-3, 1.0))
        x0 = F32((int(rng.integers(0, 250)) + 0.5) * float(s))
        for x in (x0, np.nextafter(x0, F32(np.inf)), np.nextafter(x0, F32(-np.inf))):
            if ex.quantize_multiply(x, s, 0, 0, 255) != ex.quantize_divide(x, s, 0, 0, 255):
                xs.append(F32(x))
                ss.append(s)
    for x, s in zip(xs, ss):
        q = per_tensor(np.array([x]), s, 0, "quint8")
        assert_same(q, t_per_tensor(np.array([x]), s, 0, "quint8"), f"x={x!r} s={s!r}")
        assert int(q[0]) == ex.quantize_multiply(x, s, 0, 0, 255)
        assert int(q[0]) != ex.quantize_divide(x, s, 0, 0, 255)
        onnx = qlinear.quantize_linear(np.array([x], F32), F32(s), np.uint8(0))
        assert int(onnx[0]) == ex.quantize_divide(x, s, 0, 0, 255)
    assert per_tensor(np.array([xs[0]]), ss[0], 0, "quint8")[0] == 128
    assert qlinear.quantize_linear(np.array([xs[0]]), ss[0], np.uint8(0))[0] == 127


@settings(max_examples=examples(200), deadline=None)
@given(
    dtype=st.sampled_from(["quint8", "qint8", "qint32"]),
    n=st.integers(0, 40),
    scale=st.one_of(st.floats(1e-30, 1e30), st.sampled_from([1.0, 0.1, 2.0**-10, 1 / 3])),
    zp_pick=st.integers(0, 10**9),
    seed=st.integers(0, 2**32 - 1),
)
def test_quantize_per_tensor_random_equals_torch(dtype, n, scale, zp_pick, seed):
    lo, hi = RANGES[dtype]
    zp = lo + zp_pick % (hi - lo + 1)
    rng = np.random.default_rng(seed)
    kind = seed % 3
    with np.errstate(over="ignore"):
        x = (rng.standard_normal(n) * 2.0 ** rng.integers(-10, 40, n) * scale if kind == 0
             else (rng.integers(-2000, 2000, n) + 0.5) * scale if kind == 1
             else rng.choice(SPECIALS, n)).astype(F32)
    if np.isinf(np.float32(1) / np.float32(scale)) or np.float32(scale) == 0:
        return
    assert_same(per_tensor(x, scale, zp, dtype), t_per_tensor(x, scale, zp, dtype), f"{dtype} s={scale} zp={zp}")


# ---------------------------------------------------------------------------------------------
# LEGACY (torch 2.13.0) and the version in use
# ---------------------------------------------------------------------------------------------
def test_zero_point_before_or_after_rounding_on_ties():
    """The survey's tie inputs: x / s = .5, 1.5, 2.5, -.5, -1.5 with zero point 3."""
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5], F32)
    after = qt.quantize_per_tensor(x, 1.0, 3, "quint8")
    before = qt.quantize_per_tensor(x, 1.0, 3, "quint8", legacy=True)
    assert after.tolist() == [3, 5, 5, 3, 1]  # rne(x) + 3
    assert before.tolist() == [4, 4, 6, 2, 2]  # rne(x + 3)
    assert_same(before if LEGACY else after, t_per_tensor(x, 1.0, 3, "quint8"))
    assert qlinear.quantize_linear(x, F32(1), np.uint8(3)).tolist() == after.tolist()  # ONNX adds it after too
    # fake quantization adds it after rounding in every version
    fake = qt.fake_quantize_per_tensor_affine(x, 1.0, 3, 0, 255)
    assert fake.tolist() == [0.0, 2.0, 2.0, 0.0, -2.0]
    assert_same(fake, t_fake_per_tensor(x, 1.0, 3, 0, 255))


def _fused_and_unfused_apart(rng, count):
    """Inputs where torch 2.13.0's fused (AVX2 fmadd) and unfused (scalar) x * inv + zp round to different
    integers: x * inv just off a tie, cancelling against the zero point."""
    found = []
    while len(found) < count:
        s = F32(rng.uniform(0.01, 0.2))
        zp = int(rng.integers(0, 100))
        x0 = F32((int(rng.integers(-40, 40)) + 0.5) * float(s))
        for x in (x0, np.nextafter(x0, F32(1)), np.nextafter(x0, F32(-1))):
            fused = ex.quantize_legacy(x, s, zp, 0, 255, fused=True)
            if fused != ex.quantize_legacy(x, s, zp, 0, 255, fused=False):
                found.append((F32(x), s, zp))
    return found


def test_legacy_arithmetic_equals_the_exact_transcription():
    """legacy=True against FBGEMM LEGACY's formulas evaluated exactly, on ties and on the cases where the fused
    and unfused additions round apart (and against torch itself when it is 2.13.0)."""
    rng = np.random.default_rng(RNG_SEED + 3)
    cases = _fused_and_unfused_apart(rng, 24)
    for s in (0.1, 0.3, 2.0**-5):
        for zp in (0, 3, 128, 255):
            x = ((rng.integers(-400, 400, 64) + 0.5) * s).astype(F32)
            cases += [(v, F32(s), zp) for v in x]
    for x, s, zp in cases:
        xs = np.full(9, x, F32)
        t = qt.quantize_per_tensor(xs, s, zp, "quint8", legacy=True)
        c = qt.quantize_per_channel(xs.reshape(1, -1), [s], [zp], 0, "quint8", legacy=True).ravel()
        assert (t == ex.quantize_legacy(x, s, zp, 0, 255, fused=True)).all(), (x, s, zp)
        assert (c == ex.quantize_legacy(x, s, zp, 0, 255, fused=False)).all(), (x, s, zp)
        if LEGACY:
            assert_same(t, t_per_tensor(xs, s, zp, "quint8"))
            assert_same(c.reshape(1, -1), t_per_channel(xs.reshape(1, -1), [s], [zp], 0, "quint8"))
    i32 = qt.quantize_per_tensor(np.array([c[0] for c in cases], F32), 0.1, 7, "qint32", legacy=True)
    assert i32.tolist() == [ex.quantize_legacy(c[0], 0.1, 7, *RANGES["qint32"], fused=False) for c in cases]


def test_installed_torch_version_behaviour():
    """Records which arithmetic the installed torch has: 2.13.0 adds the zero point before rounding, every
    other version measured (2.5.1, 2.12.1, 2.14.0, 2.14.1, 2.15.0) after."""
    x = np.array([2.5], F32)
    expected = 6 if LEGACY else 5
    assert int(t_per_tensor(x, 1.0, 3, "quint8")[0]) == expected, torch.__version__


# ---------------------------------------------------------------------------------------------
# strict=True
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["quint8", "qint8", "qint32"])
def test_strict_saturates_and_equals_the_exact_formula(dtype):
    lo, hi = RANGES[dtype]
    rng = np.random.default_rng(RNG_SEED + 4)
    specials = SPECIALS[~np.isnan(SPECIALS)]
    for scale in (1.0, 0.1, 3e-5):
        x = np.concatenate([_values(rng, scale, 61), specials])
        x = x[~np.isnan(x)]
        for zp in ZERO_POINTS[dtype]:
            expected = [ex.quantize_strict(v, scale, zp, lo, hi) for v in x]
            assert qt.quantize_per_tensor(x, scale, zp, dtype, strict=True).tolist() == expected
            assert qt.quantize_per_channel(x.reshape(1, -1), [scale], [zp], 0, dtype, strict=True).ravel().tolist() == expected
            # on finite values whose sum stays within [2^-24 ... 2^24] the kernel agrees with strict
            q = x.astype(np.float64) / scale
            inside = np.isfinite(x) & (np.abs(q) < 2**23) & (np.abs(q + zp) < 2**23)
            assert_same(qt.quantize_per_tensor(x[inside], scale, zp, dtype, strict=True, legacy=LEGACY),
                        t_per_tensor(x[inside], scale, zp, dtype))


def test_strict_fake_quantize_equals_the_exact_formula():
    rng = np.random.default_rng(RNG_SEED + 5)
    for qmin, qmax, zp in [(0, 255, 3), (-128, 127, -3), (-(2**31), 2**31 - 1, 12345), (-8, 7, 0)]:
        for scale in (0.1, 0.3, 1e-3):
            x = np.concatenate([_values(rng, scale, 40), np.array([np.inf, -np.inf, 3e38], F32)])
            x = x[~np.isnan(x)]
            expected = np.array([ex.fake_quantize_strict(v, scale, zp, qmin, qmax) for v in x], F32)
            ours = qt.fake_quantize_per_tensor_affine(x, scale, zp, qmin, qmax, strict=True)
            assert_same(ours, expected, "per-tensor")
            ours = qt.fake_quantize_per_channel_affine(x.reshape(1, -1), [scale], [zp], 0, qmin, qmax, strict=True)
            assert_same(ours.ravel(), expected, "per-channel")


# ---------------------------------------------------------------------------------------------
# fake_quantize_per_tensor_affine / fake_quantize_per_channel_affine
# ---------------------------------------------------------------------------------------------
QUANT_RANGES = [(0, 255, 0), (0, 255, 3), (0, 255, 128), (-128, 127, 0), (-128, 127, -3), (-127, 127, 0), (0, 15, 7),
                (-8, 7, 0), (5, 5, 5), (2, 200, 100), (-(2**31), 2**31 - 1, 0), (-(2**31), 2**31 - 1, 2**31 - 1),
                (-(2**31), 2**31 - 1, 12345), (-(2**20), 2**20, -77)]


def test_fake_quantize_per_tensor_equals_torch():
    rng = np.random.default_rng(RNG_SEED + 6)
    for scale in _scales(rng):
        x = _values(rng, scale, 257)
        for qmin, qmax, zp in QUANT_RANGES:
            assert_same(qt.fake_quantize_per_tensor_affine(x, scale, zp, qmin, qmax),
                        t_fake_per_tensor(x, scale, zp, qmin, qmax), f"s={scale} [{qmin}, {qmax}] zp={zp}")


def test_fake_quantize_per_channel_equals_torch():
    rng = np.random.default_rng(RNG_SEED + 7)
    for shape, axis in [((4, 131), 0), ((3, 6, 11), 1), ((2, 2, 3, 5), 3), ((7,), 0)]:
        c = shape[axis]
        scales = rng.choice(_scales(rng), c).astype(F32)
        for qmin, qmax, zp in QUANT_RANGES:
            zps = np.clip(zp + rng.integers(-3, 4, c), qmin, qmax)
            x = rng.choice(_values(rng, 0.1, 257), shape).astype(F32)
            assert_same(qt.fake_quantize_per_channel_affine(x, scales, zps, axis, qmin, qmax),
                        t_fake_per_channel(x, scales, zps, axis, qmin, qmax), f"{shape} axis={axis} [{qmin}, {qmax}]")


def test_fake_quantize_specials_equal_torch_and_the_documented_outcomes():
    x = np.array([np.nan, np.inf, -np.inf, 1e19, -1e19, 3e9], F32)
    t = qt.fake_quantize_per_tensor_affine(x, 1.0, 3, 0, 255)
    c = qt.fake_quantize_per_channel_affine(x.reshape(1, -1), [1.0], [3], 0, 0, 255).ravel()
    assert_same(t, t_fake_per_tensor(x, 1.0, 3, 0, 255))
    assert_same(c, t_fake_per_channel(x.reshape(1, -1), [1.0], [3], 0, 0, 255).ravel())
    assert t.tolist() == [-3.0, 252.0, -3.0, 252.0, -3.0, 252.0]  # NaN -> quant_min
    assert c.tolist() == [-3.0, -3.0, -3.0, -3.0, -3.0, 252.0]  # NaN, +Inf, |x| >= 2^63 -> quant_min
    s = qt.fake_quantize_per_channel_affine(x[1:].reshape(1, -1), [1.0], [3], 0, 0, 255, strict=True).ravel()
    assert s.tolist() == [252.0, -3.0, 252.0, -3.0, 252.0]


def test_fake_quantize_int32_range_rounds_the_zero_point_sum_and_the_product():
    """With an int32 range the kernel's float32 sums and conversions show: zero_point + q rounds above 2^24,
    and per tensor (q - zp) is converted to float32 before the product, per channel it is multiplied in double."""
    x = np.array([0.5, 1.5, -3e9, 2.0**24 + 1, 123456789.0, -987654321.0], F32)
    for zp in (2**31 - 1, 12345, -(2**31) + 7):
        for scale in (1.0, 0.3):
            t = qt.fake_quantize_per_tensor_affine(x, scale, zp, -(2**31), 2**31 - 1)
            c = qt.fake_quantize_per_channel_affine(x.reshape(1, -1), [scale], [zp], 0, -(2**31), 2**31 - 1).ravel()
            assert_same(t, t_fake_per_tensor(x, scale, zp, -(2**31), 2**31 - 1), f"zp={zp} s={scale}")
            assert_same(c, t_fake_per_channel(x.reshape(1, -1), [scale], [zp], 0, -(2**31), 2**31 - 1).ravel())
    # zero point 2^31 - 1 is 2^31 in float32: 0.5 and 1.5 both land on quant_max, then (q - zp) = 0
    assert qt.fake_quantize_per_tensor_affine(np.array([1.5], F32), 1.0, 2**31 - 1, -(2**31), 2**31 - 1)[0] == 0


# ---------------------------------------------------------------------------------------------
# torch's own checks: qlinear rejects what torch rejects (and a few things torch accepts)
# ---------------------------------------------------------------------------------------------
X2 = np.ones((2, 3), F32)
TORCH_REJECTS = [
    ("quint8 zero point 256", lambda: qt.quantize_per_tensor(X2, 1.0, 256, "quint8"),
     lambda: t_per_tensor(X2, 1.0, 256, "quint8")),
    ("qint8 zero point 128", lambda: qt.quantize_per_tensor(X2, 1.0, 128, "qint8"),
     lambda: t_per_tensor(X2, 1.0, 128, "qint8")),
    ("per-channel zero point -1 for quint8", lambda: qt.quantize_per_channel(X2, [1.0, 1.0], [0, -1], 0, "quint8"),
     lambda: t_per_channel(X2, [1.0, 1.0], [0, -1], 0, "quint8")),
    ("per-channel negative axis", lambda: qt.quantize_per_channel(X2, [1.0] * 3, [0] * 3, -1, "quint8"),
     lambda: t_per_channel(X2, [1.0] * 3, [0] * 3, -1, "quint8")),
    ("per-channel axis = ndim", lambda: qt.quantize_per_channel(X2, [1.0] * 3, [0] * 3, 2, "quint8"),
     lambda: t_per_channel(X2, [1.0] * 3, [0] * 3, 2, "quint8")),
    ("per-channel lengths differ", lambda: qt.quantize_per_channel(X2, [1.0, 1.0], [0], 0, "quint8"),
     lambda: t_per_channel(X2, [1.0, 1.0], [0], 0, "quint8")),
    ("per-channel length is not the axis'", lambda: qt.quantize_per_channel(X2, [1.0] * 3, [0] * 3, 0, "quint8"),
     lambda: t_per_channel(X2, [1.0] * 3, [0] * 3, 0, "quint8")),
    ("per-channel 0-d input", lambda: qt.quantize_per_channel(np.float32(1), [1.0], [0], 0, "quint8"),
     lambda: t_per_channel(np.float32(1), [1.0], [0], 0, "quint8")),
    ("fake quant_min > quant_max", lambda: qt.fake_quantize_per_tensor_affine(X2, 1.0, 0, 5, 4),
     lambda: t_fake_per_tensor(X2, 1.0, 0, 5, 4)),
    ("fake zero point outside the range", lambda: qt.fake_quantize_per_tensor_affine(X2, 1.0, 300, 0, 255),
     lambda: t_fake_per_tensor(X2, 1.0, 300, 0, 255)),
    ("fake per-channel zero point outside", lambda: qt.fake_quantize_per_channel_affine(X2, [1.0, 1.0], [0, 300], 0, 0, 255),
     lambda: t_fake_per_channel(X2, [1.0, 1.0], [0, 300], 0, 0, 255)),
    ("fake per-channel negative axis", lambda: qt.fake_quantize_per_channel_affine(X2, [1.0] * 3, [0] * 3, -1, 0, 255),
     lambda: t_fake_per_channel(X2, [1.0] * 3, [0] * 3, -1, 0, 255)),
    ("fake per-channel lengths differ", lambda: qt.fake_quantize_per_channel_affine(X2, [1.0, 1.0], [0, 0, 0], 0, 0, 255),
     lambda: t_fake_per_channel(X2, [1.0, 1.0], [0, 0, 0], 0, 0, 255)),
    ("fake per-channel length is not the axis'", lambda: qt.fake_quantize_per_channel_affine(X2, [1.0] * 3, [0] * 3, 0, 0, 255),
     lambda: t_fake_per_channel(X2, [1.0] * 3, [0] * 3, 0, 0, 255)),
    ("fake per-channel quant_min > quant_max", lambda: qt.fake_quantize_per_channel_affine(X2, [1.0, 1.0], [0, 0], 0, 5, 4),
     lambda: t_fake_per_channel(X2, [1.0, 1.0], [0, 0], 0, 5, 4)),
]


@pytest.mark.parametrize("name, ours, theirs", TORCH_REJECTS, ids=[c[0] for c in TORCH_REJECTS])
def test_rejected_by_torch_and_by_qlinear(name, ours, theirs):
    with pytest.raises((RuntimeError, IndexError)):
        theirs()
    with pytest.raises(ValueError):
        ours()


TORCH_ACCEPTS = [  # qlinear's own rules (docs/torch.md): torch computes with these
    ("scale 0", lambda: qt.quantize_per_tensor(X2, 0.0, 0, "quint8"), lambda: t_per_tensor(X2, 0.0, 0, "quint8")),
    ("negative scale", lambda: qt.quantize_per_tensor(X2, -1.0, 0, "quint8"), lambda: t_per_tensor(X2, -1.0, 0, "quint8")),
    ("NaN scale", lambda: qt.quantize_per_tensor(X2, float("nan"), 0, "quint8"),
     lambda: t_per_tensor(X2, float("nan"), 0, "quint8")),
    ("scale below float32", lambda: qt.quantize_per_tensor(X2, 1e-50, 0, "quint8"), lambda: t_per_tensor(X2, 1e-50, 0, "quint8")),
    ("per-channel zero scale", lambda: qt.quantize_per_channel(X2, [0.0, 1.0], [0, 0], 0, "quint8"),
     lambda: t_per_channel(X2, [0.0, 1.0], [0, 0], 0, "quint8")),
    ("fake scale 0", lambda: qt.fake_quantize_per_tensor_affine(X2, 0.0, 0, 0, 255), lambda: t_fake_per_tensor(X2, 0.0, 0, 0, 255)),
    ("fake per-channel negative scale", lambda: qt.fake_quantize_per_channel_affine(X2, [-1.0, 1.0], [0, 0], 0, 0, 255),
     lambda: t_fake_per_channel(X2, [-1.0, 1.0], [0, 0], 0, 0, 255)),
    ("fake range beyond int32", lambda: qt.fake_quantize_per_tensor_affine(X2, 1.0, 0, -(2**40), 2**40),
     lambda: t_fake_per_tensor(X2, 1.0, 0, -(2**40), 2**40)),
]


@pytest.mark.parametrize("name, ours, theirs", TORCH_ACCEPTS, ids=[c[0] for c in TORCH_ACCEPTS])
def test_accepted_by_torch_rejected_by_qlinear(name, ours, theirs):
    theirs()
    with pytest.raises(ValueError):
        ours()
