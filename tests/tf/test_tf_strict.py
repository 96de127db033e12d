"""strict=True: the documented formulas, exactly rounded and saturated, instead of the kernel.

Expected values are computed here independently, in exact rational arithmetic (fractions.Fraction)
element by element, from the documented formulas (tf.raw_ops.QuantizeV2 / Dequantize). Ranges are
chosen so that QuantizeV2's range adjustment (shared by both modes) leaves them unchanged
(min <= 0 <= max, ensure_minimum_range=0), so the test needs nothing from qlinear but the answer.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from qlinear.tf import dequantize, quantize_v2
from suite import FULL, tf_types

TYPES = tf_types({"qint8": np.int8, "quint8": np.uint8, "qint16": np.int16, "quint16": np.uint16, "qint32": np.int32})


@pytest.fixture(autouse=True)
def _reference_unless_full():
    """strict=True always runs on the reference; the non-strict calls here (the other side of each comparison)
    do too in the default run, so that this module compiles no kernel for the types tf_types leaves out; their
    kernels equal the reference in tests/kernels (every type with --full)."""
    from qlinear.kernels.quantize_linear import use_kernels

    with use_kernels(FULL):
        yield


def _round_half_away(v: Fraction) -> int:
    n = math.floor(abs(v) + Fraction(1, 2))
    return n if v >= 0 else -n


def exact_min_combined(x, mn, mx, dtype):
    info = np.iinfo(dtype)
    lo, hi = int(info.min), int(info.max)
    mn, mx = Fraction(float(np.float32(mn))), Fraction(float(np.float32(mx)))  # the op takes float32 ranges
    out = []
    for v in np.asarray(x, np.float32).ravel():
        c = min(max(Fraction(float(v)), mn), mx) if np.isfinite(v) else (mx if v > 0 else mn)
        level = (c - mn) * (hi - lo) / (mx - mn)
        out.append(min(max(lo + math.floor(level + Fraction(1, 2)), lo), hi))
    return np.array(out, dtype=np.int64).reshape(np.shape(x))


def exact_min_first(x, mn, mx, dtype):
    info = np.iinfo(dtype)
    lo, hi = int(info.min), int(info.max)
    bits = np.dtype(dtype).itemsize * 8
    mn, mx = Fraction(float(np.float32(mn))), Fraction(float(np.float32(mx)))  # the op takes float32 ranges
    range_scale = Fraction(2**bits - 1) / (mx - mn)  # = 2^bits / ((max - min) * range_adjust)
    out = []
    for v in np.asarray(x, np.float32).ravel():
        if not np.isfinite(v):
            out.append(hi if v > 0 else lo)
            continue
        q = _round_half_away(Fraction(float(v)) * range_scale) - _round_half_away(mn * range_scale) + lo
        out.append(min(max(q, lo), hi))
    return np.array(out, dtype=np.int64).reshape(np.shape(x))


def exact_scaled(x, scale, min_out, max_out, half_to_even=False):
    out = []
    for v in np.asarray(x, np.float32).ravel():
        if not np.isfinite(v):
            out.append(max_out if v > 0 else min_out)
            continue
        y = Fraction(float(v)) * Fraction(float(scale))
        r = round(y) if half_to_even else _round_half_away(y)  # Python's round(Fraction) is half-even
        out.append(min(max(r, min_out), max_out))
    return np.array(out, dtype=np.int64)


def _data(lo, hi, n=400, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(lo * 1.2, hi * 1.2, n).astype(np.float32)
    x[:6] = [lo, hi, 0.0, np.inf, -np.inf, (lo + hi) / 2]
    return x


RANGES = [(-1.0, 1.0), (-2.5, 7.25), (0.0, 6.0), (-3.0, 0.0), (-1e-3, 3e-3), (-1e6, 4e6)]


@pytest.mark.parametrize("T", list(TYPES))
@pytest.mark.parametrize("lo, hi", RANGES)
def test_strict_min_combined_is_exactly_rounded(T, lo, hi):
    x = _data(lo, hi)
    q, mn, mx = quantize_v2(x, lo, hi, T, ensure_minimum_range=0.0, strict=True)
    assert mn == np.float32(lo) and mx == np.float32(hi)
    np.testing.assert_array_equal(q, exact_min_combined(x, lo, hi, TYPES[T]))


@pytest.mark.parametrize("T", list(TYPES))
@pytest.mark.parametrize("lo, hi", RANGES)
def test_strict_min_first_is_exactly_rounded(T, lo, hi):
    x = _data(lo, hi, seed=1)
    q, _, _ = quantize_v2(x, lo, hi, T, mode="MIN_FIRST", ensure_minimum_range=0.0, strict=True)
    np.testing.assert_array_equal(q, exact_min_first(x, lo, hi, TYPES[T]))


@pytest.mark.parametrize("T", list(TYPES))
@pytest.mark.parametrize("narrow_range", [False, True])
@pytest.mark.parametrize("round_mode", ["HALF_AWAY_FROM_ZERO", "HALF_TO_EVEN"])
@pytest.mark.parametrize("lo, hi", RANGES)
def test_strict_scaled_is_exactly_rounded(T, narrow_range, round_mode, lo, hi):
    x = _data(lo, hi, seed=2)
    q, mn, mx = quantize_v2(x, lo, hi, T, mode="SCALED", round_mode=round_mode, narrow_range=narrow_range,
                            ensure_minimum_range=0.0, strict=True)
    info = np.iinfo(TYPES[T])
    min_out = int(info.min) + int(narrow_range)
    # The scale factor is the kernel's (it defines output_min/output_max, which strict keeps):
    # documented as min over the sides that apply of min_T / min_range and max_T / max_range.
    sides = []
    if min_out * lo > 0:
        sides.append(np.float32(np.float32(min_out) / np.float32(lo)))
    if info.max * hi > 0:
        sides.append(np.float32(np.float32(info.max) / np.float32(hi)))
    scale = min(sides) if sides else np.finfo(np.float32).max  # no side applies: FLT_MAX, as documented
    expected = exact_scaled(x, scale, min_out, int(info.max), round_mode == "HALF_TO_EVEN")
    np.testing.assert_array_equal(q, expected)


# --- the quirks strict=True removes, one by one (default = TensorFlow, strict = documented) ---
def test_strict_saturates_qint32_instead_of_wrapping():
    x = np.array([0.0, 0.5, 1.0], np.float32)
    assert quantize_v2(x, 0.0, 1.0, "qint32")[0].tolist() == [-(2**31), 0, -(2**31)]
    assert quantize_v2(x, 0.0, 1.0, "qint32", strict=True)[0].tolist() == [-(2**31), 0, 2**31 - 1]
    assert quantize_v2(x, 0.0, 1.0, "qint32", mode="SCALED")[0].tolist() == [0, 2**30, -(2**31)]
    assert quantize_v2(x, 0.0, 1.0, "qint32", mode="SCALED", strict=True)[0].tolist() == [0, 2**30, 2**31 - 1]


def test_strict_min_first_qint32_reaches_int32_max():
    x = np.array([500.0], np.float32)
    assert quantize_v2(x, -256.0, 256.0, "qint32", mode="MIN_FIRST")[0].tolist() == [2147483520]
    assert quantize_v2(x, -256.0, 256.0, "qint32", mode="MIN_FIRST", strict=True)[0].tolist() == [2**31 - 1]


def test_strict_rounds_unsigned_min_combined_instead_of_add_half_truncate():
    x = np.array([np.float32(0.49999997), 1.5, 2.5], np.float32)
    assert quantize_v2(x, 0.0, 255.0, "quint8")[0].tolist() == [1, 2, 3]  # 0.49999997f + 0.5f == 1.0f
    assert quantize_v2(x, 0.0, 255.0, "quint8", strict=True)[0].tolist() == [0, 2, 3]


def test_strict_signed_min_combined_uses_the_unsigned_grid():
    x = np.array([-1.0, 0.0, 1.0], np.float32)
    assert quantize_v2(x, -1.0, 1.0, "qint8")[0].tolist() == [-128, -1, 127]
    assert quantize_v2(x, -1.0, 1.0, "qint8", strict=True)[0].tolist() == [-128, 0, 127]
    # ... so qint8 is quint8 shifted by 128, exactly.
    rng = np.random.default_rng(3)
    y = rng.uniform(-1.2, 1.2, 1000).astype(np.float32)
    s8 = quantize_v2(y, -1.0, 1.0, "qint8", strict=True)[0].astype(np.int64)
    u8 = quantize_v2(y, -1.0, 1.0, "quint8", strict=True)[0].astype(np.int64)
    np.testing.assert_array_equal(s8 + 128, u8)


def test_strict_per_axis():
    x = np.array([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0]], np.float32)
    q, _, _ = quantize_v2(x, [-1.0, -2.0], [1.0, 2.0], "qint8", axis=0, ensure_minimum_range=0.0, strict=True)
    np.testing.assert_array_equal(q[0], exact_min_combined(x[0], -1.0, 1.0, np.int8))
    np.testing.assert_array_equal(q[1], exact_min_combined(x[1], -2.0, 2.0, np.int8))


# --- Dequantize ---
def _exact_dequantize(q, mn, mx, mode, narrow_range):
    info = np.iinfo(q.dtype)
    lo, hi = int(info.min), int(info.max)
    mn, mx = Fraction(float(np.float32(mn))), Fraction(float(np.float32(mx)))  # the op takes float32 ranges
    if mode == "SCALED":
        scale = mx / hi if lo == 0 else max(mn / (lo + int(narrow_range)), mx / hi)
        return [Fraction(int(v)) * scale for v in q.ravel()]
    return [mn + (int(v) - lo) * (mx - mn) / (hi - lo) for v in q.ravel()]


def _is_nearest_float32(values: np.ndarray, exact: list[Fraction]):
    """Each value is the float32 nearest the exact result (either neighbour at a near-tie)."""
    for v, e in zip(values.ravel().tolist(), exact):
        v32 = np.float32(v)
        up, down = np.nextafter(v32, np.float32(np.inf)), np.nextafter(v32, np.float32(-np.inf))
        err = abs(Fraction(float(v32)) - e)
        assert err <= abs(Fraction(float(up)) - e) and err <= abs(Fraction(float(down)) - e), (v, float(e))


@pytest.mark.parametrize("T", list(TYPES))
@pytest.mark.parametrize("mode", ["MIN_COMBINED", "MIN_FIRST", "SCALED"])
@pytest.mark.parametrize("narrow_range", [False, True])
@pytest.mark.parametrize("lo, hi", [(-1.0, 1.0), (-2.5, 7.25), (0.1, 6.0), (-3e-3, -1e-3), (-1e6, 4e6)])
def test_strict_dequantize_is_nearest_float32(T, mode, narrow_range, lo, hi):
    info = np.iinfo(TYPES[T])
    rng = np.random.default_rng(4)
    q = rng.integers(int(info.min), int(info.max), 300, endpoint=True).astype(TYPES[T])
    q[:3] = [info.min, info.max, 0]
    out = dequantize(q, lo, hi, mode=mode, narrow_range=narrow_range, strict=True)
    assert out.dtype == np.float32
    _is_nearest_float32(out, _exact_dequantize(q, lo, hi, mode, narrow_range))


def test_strict_dequantize_qint32_scaled_does_not_wrap():
    q = np.array([2**31 - 1], np.int32)
    assert dequantize(q, -1.0, 1.0, mode="SCALED").tolist() == [-1.0]  # TensorFlow's per-tensor wrap
    assert dequantize(q, -1.0, 1.0, mode="SCALED", strict=True).tolist() == [1.0]
