"""The per-slice constants `qlinear.kernels.tf_quantize` keeps between calls never leak into another call.

The table is keyed by the ranges' float32 bits and every attribute the constants depend on; a key that left
one out would hand a later call the constants of an earlier one. So each test runs calls that share all
but one input, in an order where the earlier call fills the table, and compares every result, bit for
bit, with the NumPy reference (`use_kernels(False)`, which never reads the table).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import qlinear.tf
from qlinear.kernels import quantize_linear as kernels
from qlinear.kernels import tf_quantize as fast
from suite import tf_types

F32 = np.float32
X = np.array([-3.0, -1.5, -0.5, -1e-3, 0.0, 0.49999997, 0.5, 1.5, 2.5, 6.0, 127.5, np.nan, np.inf, -np.inf],
             F32)


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _same(fast_result, slow_result, what):
    if not isinstance(fast_result, tuple):
        fast_result, slow_result = (fast_result,), (slow_result,)
    for a, b in zip(fast_result, slow_result):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape, what
        assert np.array_equal(_bits(a), _bits(b)), f"{what}: {a} vs {b}"


def _check(fn, *args, **kwargs):
    with np.errstate(all="ignore"):
        with kernels.use_kernels(False):
            slow = fn(*args, **kwargs)
        with kernels.use_kernels(True):
            result = fn(*args, **kwargs)
    _same(result, slow, f"{fn.__name__} {args[1:]} {kwargs}")
    return result


@pytest.fixture(autouse=True)
def _empty_tables():
    fast._quantize_constants_cache.clear()
    fast._dequantize_constants_cache.clear()
    yield


# Attribute sets that share one range; each differs from its neighbours in one attribute. Every mode for the
# types whose kernels this run compiles (`suite.tf_types`: each type's serial kernels take 15-20 s to compile per
# type cold); the other types once each, next to the same attributes of the first: T is in the key too.
_TYPES = ["qint8", "quint8", "qint16"]
QUANTIZE_ATTRIBUTES = [
    dict(T=T, mode=mode, round_mode=rm, narrow_range=narrow, ensure_minimum_range=ensure)
    for T, mode, narrow, ensure in itertools.product(tf_types(_TYPES), ["SCALED", "MIN_COMBINED", "MIN_FIRST"],
                                                     [False, True], [0.01, 0.5])
    for rm in (["HALF_TO_EVEN", "HALF_AWAY_FROM_ZERO"] if mode == "SCALED" else ["HALF_AWAY_FROM_ZERO"])
]
QUANTIZE_ATTRIBUTES[1:1] = [dict(QUANTIZE_ATTRIBUTES[0], T=T) for T in _TYPES if T not in tf_types(_TYPES)]
# Ranges whose float32 values differ in the last bit, in sign of zero, or only before the float32 conversion;
# and ranges on which each attribute changes the result: (-6, 1) narrow_range (SCALED: the min sets the
# scale), (-128, 127) round_mode (SCALED qint8: scale 1, so X's halves are ties), (0, 1e-3)
# ensure_minimum_range (the range is widened to it).
RANGES = [(-1.0, 1.0), (np.nextafter(F32(-1), F32(0)), 1.0), (-1.0, np.nextafter(F32(1), F32(2))), (0.0, 6.0),
          (-0.0, 6.0), (-2.5, 2.5), (-2.5000000001, 2.5), (-6.0, 1.0), (-128.0, 127.0), (0.0, 1e-3)]


def test_quantize_v2_per_tensor_attributes_and_ranges_do_not_share_constants():
    for (lo, hi), attrs in itertools.product(RANGES, QUANTIZE_ATTRIBUTES):
        attrs = dict(attrs)
        T = attrs.pop("T")
        _check(qlinear.tf.quantize_v2, X, lo, hi, T, **attrs)


def test_quantize_v2_per_axis_ranges_do_not_share_constants():
    x = np.tile(X, (3, 1)).T.copy()  # (14, 3): quantized along axis 1
    mins = np.array([-1.0, -2.0, 0.0], F32)
    maxs = np.array([1.0, 2.0, 6.0], F32)
    for mode in ("SCALED", "MIN_COMBINED"):
        _check(qlinear.tf.quantize_v2, x, mins, maxs, "qint8", mode=mode, axis=1)
        swapped = mins[[1, 0, 2]], maxs[[1, 0, 2]]  # the same bytes in another order are another range
        _check(qlinear.tf.quantize_v2, x, *swapped, "qint8", mode=mode, axis=1)
        _check(qlinear.tf.quantize_v2, x.T.copy(), mins, maxs, "qint8", mode=mode, axis=0)


@pytest.mark.parametrize("strict", [False, True])
def test_quantize_v2_output_ranges_are_the_callers_own(strict):
    x = np.tile(X[np.isfinite(X)], (3, 1)).T.copy()
    mins, maxs = np.array([-1.0, -2.0, -3.0], F32), np.array([1.0, 2.0, 3.0], F32)
    for mode in ("SCALED", "MIN_COMBINED"):
        _, out_min, out_max = _check(qlinear.tf.quantize_v2, x, mins, maxs, "qint8", mode=mode, axis=1, strict=strict)
        out_min[:] = 7  # the user may write into what they were given ...
        out_max[:] = 7
        _check(qlinear.tf.quantize_v2, x, mins, maxs, "qint8", mode=mode, axis=1, strict=strict)  # ... to no effect


def test_quantize_v2_many_slices_and_a_full_table(monkeypatch):
    monkeypatch.setattr(fast, "_CACHE_ENTRIES", 3)
    for k in range(8):
        _check(qlinear.tf.quantize_v2, X, -1.0 - k, 1.0 + k, "qint8", mode="SCALED")
    assert len(fast._quantize_constants_cache) <= 3
    slices = fast._CACHED_SLICES + 1  # more slices than are kept: computed on every call
    x = np.linspace(-4, 4, 4 * slices, dtype=F32).reshape(4, slices)
    mins = -np.linspace(0.5, 3, slices, dtype=F32)
    _check(qlinear.tf.quantize_v2, x, mins, -mins, "qint8", mode="MIN_COMBINED", axis=1)
    _check(qlinear.tf.quantize_v2, x, mins, -mins * 2, "qint8", mode="MIN_COMBINED", axis=1)


def test_dequantize_types_attributes_and_ranges_do_not_share_constants():
    compiled = tf_types({"qint8": np.int8, "quint8": np.uint8, "qint32": np.int32})  # as QUANTIZE_ATTRIBUTES
    sets = [(T, mode, narrow) for T, mode, narrow in itertools.product(compiled.values(), ["SCALED", "MIN_COMBINED",
                                                                                          "MIN_FIRST"], [False, True])]
    sets[1:1] = [(T, "SCALED", False) for T in (np.int8, np.uint8, np.int32) if T not in compiled.values()]
    for (lo, hi), (T, mode, narrow) in itertools.product(RANGES, sets):
        info = np.iinfo(T)
        q = np.array([info.min, -1 if info.min < 0 else 1, 0, 1, 7, info.max], T)
        _check(qlinear.tf.dequantize, q, lo, hi, mode=mode, narrow_range=narrow)
    q2 = np.tile(q, (2, 1)).T.copy()  # (6, 2)
    _check(qlinear.tf.dequantize, q2, np.array([-1, -2], F32), np.array([1, 2], F32), mode="SCALED", axis=1)
    _check(qlinear.tf.dequantize, q2, np.array([-2, -1], F32), np.array([2, 1], F32), mode="SCALED", axis=1)


def test_strict_quantize_v2_attributes_and_ranges_do_not_share_constants():
    x = X[np.isfinite(X)]  # strict=True rejects NaN
    for (lo, hi), attrs in itertools.product(RANGES, QUANTIZE_ATTRIBUTES):
        attrs = dict(attrs)
        T = attrs.pop("T")
        _check(qlinear.tf.quantize_v2, x, lo, hi, T, strict=True, **attrs)


def test_strict_and_bfloat16_dequantize_do_not_share_constants():
    for (lo, hi), T, narrow in itertools.product(RANGES, [np.int8, np.uint8, np.int32], [False, True]):
        info = np.iinfo(T)
        q = np.array([info.min, -1 if info.min < 0 else 1, 0, 1, 7, info.max], T)
        for mode in ("SCALED", "MIN_COMBINED", "MIN_FIRST"):
            _check(qlinear.tf.dequantize, q, lo, hi, mode=mode, narrow_range=narrow, strict=True)
        for strict in (True, False):  # bfloat16 output: MIN_COMBINED only
            _check(qlinear.tf.dequantize, q, lo, hi, narrow_range=narrow, strict=strict, dtype="bfloat16")


# Range ends where the float32 arithmetic of the constants has its edge cases: zeros of both signs, subnormals
# (flushed), the smallest normal, values whose products or quotients overflow, the types' own bounds.
EDGE_VALUES = np.array([0.0, -0.0, 1.0, -1.0, 1e-3, -6.0, 2.5, 127.0, -128.0, 65535.0, 1e-40, -1e-40,
                        1.1754944e-38, -1.1754944e-38, 1.1754945e-38, 3e38, -3.4028235e38], F32)
# ensure_minimum_range values: 1.1754945e-38 (just above the smallest normal) makes min_range + epsilon subnormal
ENSURE_VALUES = [F32(0.01), F32(0), F32(1e-40), F32(1.1754945e-38)]


def _same_constants(one, many, what):
    assert one is not None and many is not None, what
    assert len(one) == len(many), what
    for u, v in zip(one, many):
        u, v = np.asarray(u), np.asarray(v)
        assert u.dtype == v.dtype and u.shape == v.shape, f"{what}: {u!r} vs {v!r}"
        assert u.tobytes() == v.tobytes(), f"{what}: {u!r} vs {v!r}"


def test_one_slice_quantize_constants_equal_the_array_computation():
    for lo, hi in itertools.product(EDGE_VALUES, EDGE_VALUES):
        mins, maxs = np.array([lo], F32), np.array([hi], F32)
        for T, narrow, ensure in itertools.product(["qint8", "quint8", "qint16", "quint16", "qint32"], [False, True],
                                                   ENSURE_VALUES):
            dtype = np.dtype(qlinear.tf.quantize.TF_QUANTIZED_TYPES[T])
            for mode, rm in [("SCALED", "HALF_TO_EVEN"), ("SCALED", "HALF_AWAY_FROM_ZERO"),
                             ("MIN_COMBINED", "HALF_AWAY_FROM_ZERO")]:
                _same_constants(fast._quantize_constants_one_slice(mins, maxs, dtype, mode, rm, narrow, ensure),
                                fast._quantize_constants(mins, maxs, dtype, mode, rm, narrow, ensure, 1),
                                f"{T} {mode} {rm} narrow={narrow} ensure={ensure} range=({lo!r}, {hi!r})")
    assert fast._quantize_constants_one_slice(mins, maxs, dtype, "MIN_FIRST", "HALF_AWAY_FROM_ZERO", False,
                                              F32(0.01)) is None


def test_one_slice_dequantize_constants_equal_the_array_computation():
    for lo, hi in itertools.product(EDGE_VALUES, EDGE_VALUES):
        mins, maxs = np.array([lo], F32), np.array([hi], F32)
        for T, narrow, mode in itertools.product([np.int8, np.uint8, np.int16, np.uint16, np.int32], [False, True],
                                                 ["SCALED", "MIN_COMBINED"]):
            _same_constants(fast._dequantize_constants_one_slice(mins, maxs, np.dtype(T), mode, narrow),
                            fast._dequantize_constants(mins, maxs, np.dtype(T), mode, narrow, 1),
                            f"{T} {mode} narrow={narrow} range=({lo!r}, {hi!r})")
