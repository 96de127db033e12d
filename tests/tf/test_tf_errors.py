"""Bad input to qlinear.tf: every rule raises TypeError/ValueError naming the function, the argument
and the rule. Where TensorFlow's kernel rejects the same input, a second test checks that it really
does (so qlinear rejects exactly what TensorFlow rejects); where TensorFlow accepts it and qlinear
does not, the case is a documented deviation and the test checks that TensorFlow accepts it.
"""

from __future__ import annotations

import numpy as np
import pytest

from qlinear.tf import dequantize, quantize_v2

X = np.array([[-1.0, 0.0, 0.5], [1.0, 2.0, -3.0]], dtype=np.float32)  # shape (2, 3)
Q8 = np.array([[-128, 0, 5], [7, 127, -3]], dtype=np.int8)
NAN = float("nan")

# (id, args, kwargs, exception, message pattern, does TensorFlow reject it too?)
QUANTIZE_CASES = [
    ("unknown mode", (X, -1.0, 1.0, "qint8"), {"mode": "MIN_MAX"}, ValueError, r"quantize_v2: mode must be 'MIN_COMBINED', 'MIN_FIRST', 'SCALED', is 'MIN_MAX'", True),
    ("unknown round_mode", (X, -1.0, 1.0, "qint8"), {"round_mode": "HALF_UP"}, ValueError, r"quantize_v2: round_mode must be 'HALF_AWAY_FROM_ZERO', 'HALF_TO_EVEN', is 'HALF_UP'", True),
    ("HALF_TO_EVEN with MIN_COMBINED", (X, -1.0, 1.0, "qint8"), {"round_mode": "HALF_TO_EVEN"}, ValueError, r"quantize_v2: round_mode 'HALF_TO_EVEN' is only supported for mode 'SCALED', but mode is 'MIN_COMBINED'", True),
    ("HALF_TO_EVEN with MIN_FIRST", (X, -1.0, 1.0, "quint8"), {"round_mode": "HALF_TO_EVEN", "mode": "MIN_FIRST"}, ValueError, r"only supported for mode 'SCALED', but mode is 'MIN_FIRST'", True),
    ("max < min", (X, 1.0, -1.0, "qint8"), {}, ValueError, r"quantize_v2: max_range must not be less than min_range, got min_range=", True),
    ("max < min in one slice", (X, [-1.0, 2.0], [1.0, 1.5], "qint8"), {"axis": 0}, ValueError, r"quantize_v2: max_range must not be less than min_range at slice 1", True),
    ("per-tensor range with 2 values", (X, [-1.0, -2.0], 1.0, "qint8"), {}, ValueError, r"quantize_v2: min_range must be a single float when axis=-1, got shape \(2,\)", True),
    ("per-tensor max_range with 2 values", (X, -1.0, [1.0, 2.0], "qint8"), {}, ValueError, r"quantize_v2: max_range must be a single float when axis=-1", True),
    ("per-axis scalar range", (X, -1.0, 1.0, "qint8"), {"axis": 0}, ValueError, r"quantize_v2: min_range must be a 1-D array of size input.shape\[0\] = 2 when axis=0, got shape \(\)", True),
    ("per-axis range of the wrong size", (X, [-1.0, -1.0, -1.0], [1.0, 1.0, 1.0], "qint8"), {"axis": 0}, ValueError, r"min_range must be a 1-D array of size input.shape\[0\] = 2 when axis=0, got shape \(3,\)", True),
    ("per-axis range of rank 2", (X, [[-1.0, -1.0]], [[1.0, 1.0]], "qint8"), {"axis": 0}, ValueError, r"min_range must be a 1-D array .* got shape \(1, 2\)", True),
    ("per-axis max_range of the wrong size", (X, [-1.0, -1.0, -1.0], [1.0, 1.0], "qint8"), {"axis": 1}, ValueError, r"max_range must be a 1-D array of size input.shape\[1\] = 3 when axis=1, got shape \(2,\)", True),
    ("axis out of range", (X, [-1.0], [1.0], "qint8"), {"axis": 2}, ValueError, r"quantize_v2: axis must be less than the number of input dimensions \(2\), got axis=2", True),
    ("MIN_FIRST per axis", (X, [-1.0, -1.0], [1.0, 1.0], "quint8"), {"axis": 0, "mode": "MIN_FIRST"}, ValueError, r"quantize_v2: mode 'MIN_FIRST' is not implemented for per-axis quantization \(axis=0\)", True),
    ("T not a quantized type", (X, -1.0, 1.0, "float32"), {}, ValueError, r"quantize_v2: T must be one of qint8, quint8, qint16, quint16, qint32", True),
    ("T int64", (X, -1.0, 1.0, np.int64), {}, ValueError, r"quantize_v2: T must be one of", True),
    # TensorFlow accepts these; qlinear rejects them (docs/semantics.md, deviations).
    ("axis below -1", (X, -1.0, 1.0, "qint8"), {"axis": -2}, ValueError, r"quantize_v2: axis must be -1 \(per-tensor\) or a dimension index >= 0, got -2", False),
    ("NaN min_range", (X, NAN, 1.0, "qint8"), {}, ValueError, r"quantize_v2: min_range must be finite", False),
    ("inf max_range", (X, -1.0, float("inf"), "qint8"), {}, ValueError, r"quantize_v2: max_range must be finite", False),
    ("NaN ensure_minimum_range", (X, -1.0, 1.0, "qint8"), {"ensure_minimum_range": NAN}, ValueError, r"quantize_v2: ensure_minimum_range must be finite", False),
]

QUANTIZE_TYPE_CASES = [
    ("mode not a string", (X, -1.0, 1.0, "qint8"), {"mode": 1}, TypeError, r"quantize_v2: mode must be a string, got int"),
    ("narrow_range not a bool", (X, -1.0, 1.0, "qint8"), {"narrow_range": "yes"}, TypeError, r"quantize_v2: narrow_range must be a bool, got str"),
    ("axis not an int", (X, -1.0, 1.0, "qint8"), {"axis": 1.5}, TypeError, r"quantize_v2: axis must be an int, got float"),
    ("axis a bool", (X, -1.0, 1.0, "qint8"), {"axis": True}, TypeError, r"quantize_v2: axis must be an int, got bool"),
    ("strict not a bool", (X, -1.0, 1.0, "qint8"), {"strict": 1}, TypeError, r"quantize_v2: strict must be a bool, got int"),
    ("input of strings", (np.array(["a", "b"]), -1.0, 1.0, "qint8"), {}, TypeError, r"quantize_v2: input must be a real array-like of floats"),
    ("complex input", (np.array([1j]), -1.0, 1.0, "qint8"), {}, TypeError, r"quantize_v2: input must be a real array-like of floats"),
    ("range of strings", (X, "a", 1.0, "qint8"), {}, TypeError, r"quantize_v2: min_range must be a float or an array of floats"),
    ("ensure_minimum_range not a number", (X, -1.0, 1.0, "qint8"), {"ensure_minimum_range": "x"}, TypeError, r"quantize_v2: ensure_minimum_range must be a float, got str"),
]


@pytest.mark.parametrize("name, args, kwargs, exc, match, tf_rejects", QUANTIZE_CASES, ids=[c[0] for c in QUANTIZE_CASES])
def test_quantize_v2_rejects(name, args, kwargs, exc, match, tf_rejects):
    with pytest.raises(exc, match=match):
        quantize_v2(*args, **kwargs)


@pytest.mark.parametrize("name, args, kwargs, exc, match", QUANTIZE_TYPE_CASES, ids=[c[0] for c in QUANTIZE_TYPE_CASES])
def test_quantize_v2_type_errors(name, args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        quantize_v2(*args, **kwargs)


def test_quantize_v2_strict_rejects_nan_input():
    with pytest.raises(ValueError, match=r"quantize_v2: input contains NaN, which has no quantized value \(strict=True\)"):
        quantize_v2(np.array([0.0, NAN], np.float32), -1.0, 1.0, "qint8", strict=True)


@pytest.mark.parametrize("name, args, kwargs, exc, match, tf_rejects", QUANTIZE_CASES, ids=[c[0] for c in QUANTIZE_CASES])
def test_quantize_v2_rejects_what_tensorflow_rejects(tf_ops, name, args, kwargs, exc, match, tf_rejects):
    x, mn, mx, T = args
    T = np.dtype(T).name if not isinstance(T, str) else T
    if T in ("int64",):
        pytest.skip("a NumPy dtype has no TensorFlow quantized counterpart to try")
    attrs = dict(kwargs)
    if T == "float32":
        with pytest.raises(Exception):  # noqa: B017 - TF raises its own error types
            tf_ops.quantize_v2(x, mn, mx, "float32", **attrs)
        return
    if tf_rejects:
        with pytest.raises(Exception):  # noqa: B017
            tf_ops.quantize_v2(x, mn, mx, T, **attrs)
    else:
        tf_ops.quantize_v2(x, mn, mx, T, **attrs)  # TensorFlow accepts it: a documented deviation


DEQUANTIZE_CASES = [
    ("unknown mode", (Q8, -1.0, 1.0), {"mode": "MIN_MAX"}, ValueError, r"dequantize: mode must be 'MIN_COMBINED', 'MIN_FIRST', 'SCALED', is 'MIN_MAX'", True),
    ("float16 output", (Q8, -1.0, 1.0), {"dtype": "float16"}, ValueError, r"dequantize: dtype \(the output type\) must be bfloat16 or float32", True),
    ("bfloat16 with SCALED", (Q8, -1.0, 1.0), {"dtype": "bfloat16", "mode": "SCALED"}, ValueError, r"dequantize: when the output type is bfloat16, mode must be 'MIN_COMBINED', is 'SCALED'", True),
    ("bfloat16 with MIN_FIRST", (Q8, -1.0, 1.0), {"dtype": "bfloat16", "mode": "MIN_FIRST"}, ValueError, r"bfloat16, mode must be 'MIN_COMBINED', is 'MIN_FIRST'", True),
    ("axis out of range", (Q8, [-1.0], [1.0]), {"axis": 2}, ValueError, r"dequantize: axis must be less than the number of input dimensions \(2\), got axis=2", True),
    ("per-tensor range with 2 values", (Q8, [-1.0, -1.0], 1.0), {}, ValueError, r"dequantize: min_range must have as many elements as input has along the dequantization axis \(axis=-1: 1\), got 2", True),
    ("per-axis range of the wrong size", (Q8, [-1.0, -1.0], [1.0, 1.0]), {"axis": 1}, ValueError, r"dequantize: min_range must have as many elements as input has along the dequantization axis \(axis=1: 3\), got 2", True),
    ("per-axis max_range of the wrong size", (Q8, [-1.0, -1.0], [1.0]), {"axis": 0}, ValueError, r"dequantize: max_range must have as many elements .* \(axis=0: 2\), got 1", True),
    ("MIN_FIRST per axis", (Q8, [-1.0, -1.0], [1.0, 1.0]), {"axis": 0, "mode": "MIN_FIRST"}, ValueError, r"dequantize: mode 'MIN_FIRST' is not implemented for per-axis dequantization \(axis=0\)", True),
    # TensorFlow accepts these; qlinear rejects them (docs/semantics.md, deviations).
    ("axis below -1", (Q8, -1.0, 1.0), {"axis": -3}, ValueError, r"dequantize: axis must be -1 \(per-tensor\) or a dimension index >= 0, got -3", False),
    ("NaN max_range", (Q8, -1.0, NAN), {}, ValueError, r"dequantize: max_range must be finite", False),
]

DEQUANTIZE_TYPE_CASES = [
    ("list input", ([1, 2, 3], -1.0, 1.0), {}, TypeError, r"dequantize: input must be an array of int8, uint8, int16, uint16 or int32 \(its dtype is the quantized type\), got list"),
    ("int64 input", (np.array([1, 2], np.int64), -1.0, 1.0), {}, TypeError, r"dequantize: input must have dtype int8, uint8, int16, uint16 or int32, got int64"),
    ("float input", (np.array([1.0]), -1.0, 1.0), {}, TypeError, r"dequantize: input must have dtype .* got float64"),
    ("narrow_range not a bool", (Q8, -1.0, 1.0), {"narrow_range": 0}, TypeError, r"dequantize: narrow_range must be a bool, got int"),
    ("mode not a string", (Q8, -1.0, 1.0), {"mode": None}, TypeError, r"dequantize: mode must be a string, got NoneType"),
]


@pytest.mark.parametrize("name, args, kwargs, exc, match, tf_rejects", DEQUANTIZE_CASES, ids=[c[0] for c in DEQUANTIZE_CASES])
def test_dequantize_rejects(name, args, kwargs, exc, match, tf_rejects):
    with pytest.raises(exc, match=match):
        dequantize(*args, **kwargs)


@pytest.mark.parametrize("name, args, kwargs, exc, match", DEQUANTIZE_TYPE_CASES, ids=[c[0] for c in DEQUANTIZE_TYPE_CASES])
def test_dequantize_type_errors(name, args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        dequantize(*args, **kwargs)


@pytest.mark.parametrize("name, args, kwargs, exc, match, tf_rejects", DEQUANTIZE_CASES, ids=[c[0] for c in DEQUANTIZE_CASES])
def test_dequantize_rejects_what_tensorflow_rejects(tf_ops, name, args, kwargs, exc, match, tf_rejects):
    q, mn, mx = args
    if tf_rejects:
        with pytest.raises(Exception):  # noqa: B017 - TF raises its own error types
            tf_ops.dequantize(q, mn, mx, "qint8", **kwargs)
    else:
        tf_ops.dequantize(q, mn, mx, "qint8", **kwargs)


def test_output_range_shapes_follow_tensorflow():
    # Per-tensor (axis=-1, or an axis of length 1): scalar ranges; per-axis: one per slice.
    _, mn, mx = quantize_v2(X, [-1.0], [1.0], "qint8")
    assert mn.shape == () and mx.shape == () and mn.dtype == np.float32
    _, mn, mx = quantize_v2(X[:1], [-1.0], [1.0], "qint8", axis=0)
    assert mn.shape == () and mx.shape == ()
    _, mn, mx = quantize_v2(X, [-1.0, -2.0], [1.0, 2.0], "qint8", axis=0)
    assert mn.shape == (2,) and mx.shape == (2,) and mx.dtype == np.float32


@pytest.mark.parametrize("T", ["qint8", np.int8, np.dtype("int8"), type("FakeDType", (), {"name": "qint8"})()])
def test_T_spellings(T):
    q, _, _ = quantize_v2(X, -1.0, 1.0, T)
    assert q.dtype == np.int8


def test_input_is_converted_to_float32_like_tensorflow():
    # Python floats and float64 arrays are rounded to float32 first (tf.constant does the same for
    # Python values; the raw op itself only takes float32).
    as_list = quantize_v2([0.1, 0.7, 1e-3], 0.0, 1.0, "quint8")[0]
    as_f32 = quantize_v2(np.array([0.1, 0.7, 1e-3], np.float32), 0.0, 1.0, "quint8")[0]
    np.testing.assert_array_equal(as_list, as_f32)
    q, mn, mx = quantize_v2(np.float64(0.3), np.float64(0.1), np.float64(0.9), "quint8")
    assert q.shape == () and mx == np.float32(0.9)


def test_python_lists_match_tensorflow(tf_ops):
    ours = quantize_v2([0.1, 0.7, 1e-3], 0.0, 1.0, "quint8")
    theirs = tf_ops.quantize_v2([0.1, 0.7, 1e-3], 0.0, 1.0, "quint8")
    np.testing.assert_array_equal(ours[0], theirs[0])


def _read_only(shape, dtype):
    a = np.empty(shape, dtype)
    a.flags.writeable = False
    return a


_SHARED = np.zeros(6, np.float32)  # an input and an out in the same memory

# out= is qlinear's (NumPy's convention), not TensorFlow's: no TensorFlow counterpart to compare.
OUT_CASES = [
    ("out a list", lambda: quantize_v2(X, -1.0, 1.0, "qint8", out=[0] * 6), TypeError,
     r"quantize_v2: out must be a numpy.ndarray, got list"),
    ("out of the wrong shape", lambda: quantize_v2(X, -1.0, 1.0, "qint8", out=np.empty(6, np.int8)), ValueError,
     r"quantize_v2: out must have the result's shape \(2, 3\), got shape \(6,\)"),
    ("out of the wrong dtype", lambda: quantize_v2(X, -1.0, 1.0, "qint8", out=np.empty((2, 3), np.uint8)), TypeError,
     r"quantize_v2: out must have the result's dtype int8, got dtype uint8 \(the output type is T's storage type\)"),
    ("read-only out", lambda: quantize_v2(X, -1.0, 1.0, "qint8", out=_read_only((2, 3), np.int8)), ValueError,
     r"quantize_v2: out must be writeable, got a read-only array"),
    ("out sharing input's memory",
     lambda: quantize_v2(_SHARED.reshape(2, 3), -1.0, 1.0, "qint32", out=_SHARED.view(np.int32).reshape(2, 3)),
     ValueError, r"quantize_v2: out must not share memory with input"),
    ("dequantize out a tuple", lambda: dequantize(Q8, -1.0, 1.0, out=(0,) * 6), TypeError,
     r"dequantize: out must be a numpy.ndarray, got tuple"),
    ("dequantize out of the wrong shape", lambda: dequantize(Q8, -1.0, 1.0, out=np.empty((3, 2), np.float32)),
     ValueError, r"dequantize: out must have the result's shape \(2, 3\), got shape \(3, 2\)"),
    ("dequantize out of float32 for bfloat16",
     lambda: dequantize(Q8, -1.0, 1.0, dtype="bfloat16", out=np.empty((2, 3), np.float32)), TypeError,
     r"dequantize: out must have the result's dtype bfloat16, got dtype float32 \(the output type is the dtype "
     r"argument\)"),
    ("dequantize read-only out", lambda: dequantize(Q8, -1.0, 1.0, out=_read_only((2, 3), np.float32)), ValueError,
     r"dequantize: out must be writeable"),
    ("dequantize out sharing input's memory",
     lambda: dequantize(_SHARED.view(np.int32)[:3], -1.0, 1.0, mode="SCALED", out=_SHARED[2:5]), ValueError,
     r"dequantize: out must not share memory with input"),
    ("dequantize out sharing max_range's memory",
     lambda: dequantize(Q8, [-1.0, -1.0], _SHARED[:2], axis=0, out=_SHARED.reshape(2, 3)), ValueError,
     r"dequantize: out must not share memory with max_range"),
]


@pytest.mark.parametrize("name, call, exc, match", OUT_CASES, ids=[c[0] for c in OUT_CASES])
def test_out_is_checked(name, call, exc, match):
    with pytest.raises(exc, match=match):
        call()
