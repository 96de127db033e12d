"""qlinear.tf against tensorflow-cpu itself: bit-identical outputs and output ranges.

A deterministic grid runs every valid mode x round_mode x narrow_range x T x (per-tensor, per-axis)
combination over every kind of range; hypothesis then draws random shapes, axes, attributes,
ranges (tiny, huge, negative-only, positive-only, equal bounds, ensure_minimum_range 0) and inputs
(specials, subnormals, values at and around the range ends).

Left out, because TensorFlow's own result depends on the code path an element takes (Eigen's
vector loop or its scalar tail, see docs/semantics.md): NaN inputs to MIN_COMBINED and SCALED, and
for qint8/qint16 MIN_COMBINED the zero-width range (min = max = 0 with ensure_minimum_range 0),
whose 0 * inf is NaN inside the kernel. NaN inputs to MIN_FIRST are deterministic and included.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from qlinear.tf import dequantize, quantize_v2
from suite import examples, kernels_for, tf_types

pytest.importorskip("tensorflow")

F32 = np.float32
FLT_MIN = float(np.finfo(np.float32).tiny)
TYPES = tf_types(["qint8", "quint8", "qint16", "quint16", "qint32"])
STORAGE = {"qint8": np.int8, "quint8": np.uint8, "qint16": np.int16, "quint16": np.uint16, "qint32": np.int32}

# Every valid attribute combination of QuantizeV2 (HALF_TO_EVEN exists only for SCALED).
COMBOS = [
    (mode, rm, nr, T)
    for mode in ("MIN_COMBINED", "MIN_FIRST", "SCALED")
    for rm in (("HALF_AWAY_FROM_ZERO", "HALF_TO_EVEN") if mode == "SCALED" else ("HALF_AWAY_FROM_ZERO",))
    for nr in (False, True)
    for T in TYPES
]

# (name, min, max, ensure_minimum_range)
RANGE_KINDS = [
    ("symmetric", -1.0, 1.0, 0.01),
    ("asymmetric", -2.5, 7.25, 0.01),
    ("positive-only", 0.3, 6.0, 0.01),
    ("negative-only", -6.0, -0.3, 0.01),
    ("tiny", -3e-7, 5e-7, 0.0),
    ("tiny-nudged", -3e-7, 5e-7, 0.01),
    ("subnormal", -1e-39, 2e-39, 0.0),
    ("huge", -3e37, 1e38, 0.01),
    ("equal", 2.0, 2.0, 0.01),
    ("equal-zero", 0.0, 0.0, 0.01),
    ("equal-zero-no-minimum", 0.0, 0.0, 0.0),
]


def _assert_same_quantize(ours, theirs):
    q, mn, mx = ours
    tq, tmn, tmx = theirs
    assert q.dtype == tq.dtype and q.shape == tq.shape
    np.testing.assert_array_equal(q, tq)
    for a, b in ((mn, tmn), (mx, tmx)):
        a = np.asarray(a)
        assert a.dtype == np.float32 and a.shape == b.shape
        assert a.tobytes() == b.tobytes(), (a, b)


def _assert_same_float_bits(ours, theirs):
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    if ours.tobytes() != theirs.tobytes():
        bits = np.uint16 if ours.dtype.itemsize == 2 else np.uint32
        diff = np.flatnonzero(ours.reshape(-1).view(bits) != theirs.reshape(-1).view(bits))
        raise AssertionError(f"{diff.size} elements differ, first at {diff[:5]}: ours {ours.reshape(-1)[diff[:5]]} tf {theirs.reshape(-1)[diff[:5]]}")


def _ftz(v: float) -> float:
    v = float(F32(v))
    return 0.0 if abs(v) < FLT_MIN else v


def _nan_inside_kernel(mode, T, lo, hi, ensure, narrow_range=False):
    """True when the kernel's scale overflows float32 (then 0 * inf = NaN and inf reach the
    float -> int conversion), for the types whose result there depends on the code path:
    MIN_COMBINED's (max T - min T) / (max_range - min_range), or SCALED's scale factor when both
    sides overflow. Recomputed here from the kernel's rules, in float32 with flush-to-zero as
    TensorFlow runs it."""
    if mode == "MIN_FIRST" or T not in ("qint8", "qint16"):
        return False
    lo, hi = _ftz(lo), _ftz(hi)
    min_r = min(0.0, lo)
    eps = _ftz(max(1.0, abs(lo), abs(hi)) * _ftz(ensure))
    max_r = max(0.0, hi, _ftz(min_r + eps))
    info = np.iinfo(STORAGE[T])
    with np.errstate(all="ignore"):
        if mode == "MIN_COMBINED":
            width = _ftz(max_r - min_r)
            return width == 0.0 or not np.isfinite(F32(float(info.max - info.min) / width))
        min_out, max_out = info.min + int(narrow_range), info.max
        flt_max = float(np.finfo(np.float32).max)
        from_min = float(F32(min_out / min_r)) if min_out * min_r > 0 else flt_max
        from_max = float(F32(max_out / max_r)) if max_out * max_r > 0 else flt_max
    return not np.isfinite(min(from_min, from_max))


def _grid_input(lo, hi, n=203, seed=0):
    """Values across and beyond [lo, hi], its ends, halfway points, specials and subnormals."""
    rng = np.random.default_rng(seed)
    width = max(abs(lo), abs(hi), 1e-30)
    x = rng.uniform(-1.5 * width, 1.5 * width, n)
    specials = [0.0, -0.0, lo, hi, (lo + hi) / 2, np.inf, -np.inf, 0.5, -0.5, 1.5, 2.5, 1e-40, -1e-40, 3e38, -3e38]
    x[: len(specials)] = specials
    return x.astype(np.float32)


@pytest.mark.parametrize("kind", RANGE_KINDS, ids=[k[0] for k in RANGE_KINDS])
@pytest.mark.parametrize("mode, round_mode, narrow_range, T", COMBOS, ids=["-".join(map(str, c)) for c in COMBOS])
def test_grid_per_tensor(tf_ops, mode, round_mode, narrow_range, T, kind):
    _, lo, hi, ensure = kind
    assume_ok = not _nan_inside_kernel(mode, T, lo, hi, ensure, narrow_range)
    if not assume_ok:
        pytest.skip("TensorFlow's result is code-path dependent here (NaN inside the kernel)")
    x = _grid_input(lo, hi)
    attrs = dict(mode=mode, round_mode=round_mode, narrow_range=narrow_range, ensure_minimum_range=ensure)
    ours = quantize_v2(x, lo, hi, T, **attrs)
    _assert_same_quantize(ours, tf_ops.quantize_v2(x, lo, hi, T, **attrs))
    # Dequantize what TensorFlow produced, with its output range, in every mode it allows.
    q, mn, mx = ours
    for dmode in ("MIN_COMBINED", "MIN_FIRST", "SCALED"):
        dattrs = dict(mode=dmode, narrow_range=narrow_range)
        _assert_same_float_bits(dequantize(q, mn, mx, **dattrs), tf_ops.dequantize(q, mn, mx, T, **dattrs))
    _assert_same_float_bits(
        dequantize(q, mn, mx, dtype="bfloat16"), tf_ops.dequantize(q, mn, mx, T, dtype="bfloat16")
    )


@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize(
    "mode, round_mode, narrow_range, T",
    [c for c in COMBOS if c[0] != "MIN_FIRST"],
    ids=["-".join(map(str, c)) for c in COMBOS if c[0] != "MIN_FIRST"],
)
def test_grid_per_axis(tf_ops, mode, round_mode, narrow_range, T, axis):
    # Each slice gets a different kind of range, so every slice takes its own path.
    shape = [3, 4, 5]
    kinds = [k for k in RANGE_KINDS if not _nan_inside_kernel(mode, T, *k[1:], narrow_range)]
    n = shape[axis]
    chosen = [kinds[(i * 3 + axis) % len(kinds)] for i in range(n)]
    mins = np.array([k[1] for k in chosen], np.float32)
    maxs = np.array([k[2] for k in chosen], np.float32)
    ensure = 0.01 if all(k[3] for k in chosen) else 0.0
    if any(_nan_inside_kernel(mode, T, k[1], k[2], ensure, narrow_range) for k in chosen):
        ensure = 0.01
    x = _grid_input(float(mins.min()), float(maxs.max()), n=60, seed=axis).reshape(shape)
    attrs = dict(mode=mode, round_mode=round_mode, narrow_range=narrow_range, axis=axis, ensure_minimum_range=ensure)
    ours = quantize_v2(x, mins, maxs, T, **attrs)
    _assert_same_quantize(ours, tf_ops.quantize_v2(x, mins, maxs, T, **attrs))
    q, mn, mx = ours
    for dmode in ("MIN_COMBINED", "SCALED"):
        dattrs = dict(mode=dmode, narrow_range=narrow_range, axis=axis)
        _assert_same_float_bits(dequantize(q, mn, mx, **dattrs), tf_ops.dequantize(q, mn, mx, T, **dattrs))


# ---------------------------------------------------------------------------------------------
# Hypothesis
# ---------------------------------------------------------------------------------------------
def _float32(min_value=None, max_value=None, **kw):
    """float32 values; bounds are rounded inward to float32 (hypothesis requires exact ones)."""
    if min_value is not None:
        m = F32(min_value)
        min_value = float(m if m >= min_value else np.nextafter(m, F32(np.inf)))
    if max_value is not None:
        m = F32(max_value)
        max_value = float(m if m <= max_value else np.nextafter(m, F32(-np.inf)))
    return st.floats(min_value=min_value, max_value=max_value, width=32, **kw)


@st.composite
def range_pair(draw):
    """One (min, max) of a chosen kind; |bounds| <= 1e38 keeps max - min finite."""
    kind = draw(st.sampled_from(["any", "tiny", "huge", "negative", "positive", "equal", "zero-one-side", "unit"]))
    if kind == "tiny":
        a, b = draw(_float32(-1e-30, 1e-30)), draw(_float32(-1e-30, 1e-30))
    elif kind == "huge":
        a, b = draw(_float32(-1e38, 1e38)), draw(_float32(-1e38, 1e38))
    elif kind == "negative":
        a, b = draw(_float32(-1e6, 0.0)), draw(_float32(-1e6, 0.0))
    elif kind == "positive":
        a, b = draw(_float32(0.0, 1e6)), draw(_float32(0.0, 1e6))
    elif kind == "equal":
        a = b = draw(_float32(-1e6, 1e6))
    elif kind == "zero-one-side":
        a, b = 0.0, draw(_float32(-1e3, 1e3))
    elif kind == "unit":
        a, b = draw(st.sampled_from([-1.0, 0.0, -0.5])), draw(st.sampled_from([1.0, 0.5, 6.0, 255.0]))
    else:
        a, b = draw(_float32(-1e9, 1e9)), draw(_float32(-1e9, 1e9))
    return (a, b) if a <= b else (b, a)


@st.composite
def quantize_case(draw):
    mode = draw(st.sampled_from(["MIN_COMBINED", "MIN_FIRST", "SCALED"]))
    round_mode = draw(st.sampled_from(["HALF_AWAY_FROM_ZERO", "HALF_TO_EVEN"])) if mode == "SCALED" else "HALF_AWAY_FROM_ZERO"
    T = draw(st.sampled_from(TYPES))
    narrow_range = draw(st.booleans())
    ensure = draw(st.one_of(st.sampled_from([0.01, 0.0, 1e-6, 1.0]), _float32(0.0, 1.0)))
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=6))
    axis = -1
    if draw(st.booleans()):
        axis = draw(st.integers(0, len(shape) - 1))
        if mode == "MIN_FIRST" and shape[axis] != 1:
            axis = -1
    slices = 1 if axis == -1 else shape[axis]
    pairs = [draw(range_pair()) for _ in range(slices)]
    assume(not any(_nan_inside_kernel(mode, T, a, b, ensure, narrow_range) for a, b in pairs))
    lo = min(a for a, _ in pairs)
    hi = max(b for _, b in pairs)
    width = max(abs(lo), abs(hi), 1e-30)
    bound = float(F32(1.5 * min(width, 2e38)))
    near = _float32(-bound, bound)
    specials = st.sampled_from([0.0, -0.0, lo, hi, np.inf, -np.inf, 0.5, 1.5, -2.5, 1e-40, 3e38, 0.49999997])
    elements = st.one_of(near, specials, _float32(allow_nan=False), _float32(-1e-37, 1e-37))
    if mode == "MIN_FIRST":
        elements = st.one_of(elements, st.just(np.nan))
    x = draw(hnp.arrays(np.float32, shape, elements=elements))
    if axis == -1:
        mins, maxs = np.float32(pairs[0][0]), np.float32(pairs[0][1])
    else:
        mins = np.array([a for a, _ in pairs], np.float32)
        maxs = np.array([b for _, b in pairs], np.float32)
    attrs = dict(mode=mode, round_mode=round_mode, narrow_range=narrow_range, axis=axis, ensure_minimum_range=ensure)
    return x, mins, maxs, T, attrs


@settings(max_examples=examples(1500))
@given(case=quantize_case())
def test_hypothesis_quantize_v2(tf_ops, case):
    x, mins, maxs, T, attrs = case
    _assert_same_quantize(quantize_v2(x, mins, maxs, T, **attrs), tf_ops.quantize_v2(x, mins, maxs, T, **attrs))


@st.composite
def dequantize_case(draw):
    T = draw(st.sampled_from(TYPES))
    mode = draw(st.sampled_from(["MIN_COMBINED", "MIN_FIRST", "SCALED"]))
    narrow_range = draw(st.booleans())
    dtype = draw(st.sampled_from(["float32", "bfloat16"])) if mode == "MIN_COMBINED" else "float32"
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=6))
    axis = -1
    if mode != "MIN_FIRST" and draw(st.booleans()):
        axis = draw(st.integers(0, len(shape) - 1))
    slices = 1 if axis == -1 else shape[axis]
    info = np.iinfo(STORAGE[T])
    q = draw(hnp.arrays(STORAGE[T], shape, elements=st.one_of(
        st.integers(int(info.min), int(info.max)), st.sampled_from([int(info.min), int(info.max), 0])
    )))
    # Dequantize checks no order of min and max: unordered pairs are drawn too.
    pairs = [draw(st.one_of(range_pair(), st.tuples(_float32(-1e9, 1e9), _float32(-1e9, 1e9)))) for _ in range(slices)]
    mins = np.array([a for a, _ in pairs], np.float32)
    maxs = np.array([b for _, b in pairs], np.float32)
    if axis == -1:
        mins, maxs = mins[0], maxs[0]
    return q, mins, maxs, T, dict(mode=mode, narrow_range=narrow_range, axis=axis, dtype=dtype)


@settings(max_examples=examples(1000))
@given(case=dequantize_case())
def test_hypothesis_dequantize(tf_ops, case):
    q, mins, maxs, T, attrs = case
    _assert_same_float_bits(dequantize(q, mins, maxs, **attrs), tf_ops.dequantize(q, mins, maxs, T, **dict(attrs)))


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_large_per_axis_tensor(tf_ops, axis):
    # Slices long and short enough to mix Eigen's vectorised chips with scalar tails.
    rng = np.random.default_rng(axis)
    shape = (7, 33, 129)
    x = (rng.standard_normal(shape) * 5).astype(np.float32)
    n = shape[axis]
    mins = -rng.uniform(0.0, 6.0, n).astype(np.float32)
    maxs = rng.uniform(0.0, 6.0, n).astype(np.float32)
    for T in TYPES:
        for mode, round_mode in (("MIN_COMBINED", "HALF_AWAY_FROM_ZERO"), ("SCALED", "HALF_TO_EVEN"), ("SCALED", "HALF_AWAY_FROM_ZERO")):
            attrs = dict(mode=mode, round_mode=round_mode, axis=axis)
            ours = quantize_v2(x, mins, maxs, T, **attrs)
            _assert_same_quantize(ours, tf_ops.quantize_v2(x, mins, maxs, T, **attrs))
            dattrs = dict(mode=mode, axis=axis)
            _assert_same_float_bits(dequantize(ours[0], mins, maxs, **dattrs), tf_ops.dequantize(ours[0], mins, maxs, T, **dattrs))


def test_large_tensor_crosses_tensorflow_threads(tf_ops):
    # Big enough for Eigen to split the work over threads and vector blocks.
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(200_003) * 3).astype(np.float32)
    x[::97] = 4.1
    for T in TYPES:
        for mode in ("MIN_COMBINED", "MIN_FIRST", "SCALED"):
            attrs = dict(mode=mode)
            _assert_same_quantize(quantize_v2(x, -2.5, 4.1, T, **attrs), tf_ops.quantize_v2(x, -2.5, 4.1, T, **attrs))


# ---------------------------------------------------------------------------------------------
# Each kernel quirk listed in docs/semantics.md, shown on the real TensorFlow kernel
# ---------------------------------------------------------------------------------------------
QUIRKS = [
    # (name, x, min, max, T, attrs, TensorFlow's output)
    ("signed MIN_COMBINED rounds after the shift", [-1.0, 0.0, 1.0], -1.0, 1.0, "qint8", {}, [-128, -1, 127]),
    ("unsigned MIN_COMBINED adds 0.5f and truncates", [0.49999997, 0.25, 1.5], 0.0, 255.0, "quint8", {}, [1, 0, 2]),
    ("qint32 MIN_COMBINED wraps at max_range", [0.0, 0.5, 1.0], 0.0, 1.0, "qint32", {}, [-(2**31), 0, -(2**31)]),
    ("qint32 SCALED wraps at max_range", [0.0, 0.5, 1.0], 0.0, 1.0, "qint32", {"mode": "SCALED"}, [0, 2**30, -(2**31)]),
    ("qint32 MIN_FIRST tops out at 2147483520", [500.0], -256.0, 256.0, "qint32", {"mode": "MIN_FIRST"}, [2147483520]),
    ("quint8 SCALED narrow_range never outputs 0", [-1.0, 0.0, 1.0], -1.0, 1.0, "quint8", {"mode": "SCALED", "narrow_range": True}, [1, 1, 255]),
    ("MIN_FIRST NaN is 0 for 8-bit T", [float("nan")], -1.0, 1.0, "qint8", {"mode": "MIN_FIRST"}, [0]),
    ("MIN_FIRST NaN is INT32_MIN for qint32", [float("nan")], -1.0, 1.0, "qint32", {"mode": "MIN_FIRST"}, [-(2**31)]),
]


@pytest.mark.parametrize("name, x, lo, hi, T, attrs, expected", QUIRKS, ids=[q[0] for q in QUIRKS])
def test_quirk_on_tensorflow(tf_ops, name, x, lo, hi, T, attrs, expected):
    x = np.array(x, np.float32)
    theirs = tf_ops.quantize_v2(x, lo, hi, T, **attrs)
    assert theirs[0].tolist() == expected  # the quirk is real on this TensorFlow
    with kernels_for(T):
        ours = quantize_v2(x, lo, hi, T, **attrs)
    _assert_same_quantize(ours, theirs)


def test_quirk_scaled_output_range_from_scale_factor(tf_ops):
    # Docs example: qint8, [-10, 9] -> scale 12.8, output_max 9.921875; narrow_range moves both ends.
    for narrow_range in (False, True):
        ours = quantize_v2([0.0], -10.0, 9.0, "qint8", mode="SCALED", narrow_range=narrow_range)
        _assert_same_quantize(ours, tf_ops.quantize_v2([0.0], -10.0, 9.0, "qint8", mode="SCALED", narrow_range=narrow_range))
    assert quantize_v2([0.0], -10.0, 9.0, "qint8", mode="SCALED")[2] == np.float32(9.921875)


def test_quirk_dequantize_qint32_scaled_per_tensor_wraps(tf_ops):
    q = np.array([2**31 - 1, 2147483584, 2147483583], np.int32)
    theirs = tf_ops.dequantize(q, -1.0, 1.0, "qint32", mode="SCALED")
    assert theirs[0] == -1.0 and theirs[1] == -1.0 and theirs[2] > 0
    _assert_same_float_bits(dequantize(q, -1.0, 1.0, mode="SCALED"), theirs)
    # The per-axis path does not wrap.
    q2 = np.stack([q, q])
    theirs = tf_ops.dequantize(q2, [-1.0, -1.0], [1.0, 1.0], "qint32", mode="SCALED", axis=0)
    assert theirs[0, 0] > 0
    _assert_same_float_bits(dequantize(q2, [-1.0, -1.0], [1.0, 1.0], mode="SCALED", axis=0), theirs)


def test_quirk_dequantize_qint32_min_combined_divides_by_2_pow_32(tf_ops):
    q = np.array([-(2**31), 0, 2**31 - 1], np.int32)
    theirs = tf_ops.dequantize(q, 0.0, 4294967295.0, "qint32")
    _assert_same_float_bits(dequantize(q, 0.0, 4294967295.0), theirs)


def test_quirk_axis_of_length_one_takes_the_per_tensor_path(tf_ops):
    x = np.array([[0.1, 0.2, 0.3]], np.float32)
    attrs = dict(mode="MIN_FIRST", axis=0)
    ours = quantize_v2(x, [0.0], [0.3], "quint8", **attrs)
    theirs = tf_ops.quantize_v2(x, [0.0], [0.3], "quint8", **attrs)
    assert theirs[1].shape == ()  # scalar output ranges, MIN_FIRST allowed
    _assert_same_quantize(ours, theirs)


def test_quirk_subnormal_ranges_are_zero(tf_ops):
    # TensorFlow runs kernels with FTZ/DAZ: the subnormal range +-1e-38 acts as 0, so no side of
    # SCALED's scale applies and the scale is FLT_MAX (IEEE arithmetic would give 128 / 1e-38 = inf
    # and output_min -0.0).
    attrs = dict(mode="SCALED", ensure_minimum_range=0.0)
    theirs = tf_ops.quantize_v2([0.0], -1e-38, 1e-38, "qint8", **attrs)
    assert theirs[1] == np.float32(-128) / np.finfo(np.float32).max
    _assert_same_quantize(quantize_v2([0.0], -1e-38, 1e-38, "qint8", **attrs), theirs)
