"""The numba QuantizeV2/Dequantize kernels against the NumPy reference of TensorFlow's CPU kernel, bit for bit.

Each case runs through `qlinear.tf.quantize_v2` / `qlinear.tf.dequantize` with the kernels (the reference
patched to fail, so the kernel really ran) and with `use_kernels(False)`: every mode, round mode, type,
narrow_range, per-tensor and per-axis at any axis, ranges that are narrow, wide, zero-width, subnormal or
huge, and inputs with NaN, infinities, subnormals, ties. ``strict=True`` stays on the reference.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import qlinear.tf
from qlinear.kernels import quantize_linear as kernels
from qlinear.kernels import threads
from qlinear.tf import quantize as tf_api
from suite import OUT_GARBAGE, examples, out_layouts, tf_types

TYPES = tf_types(["qint8", "quint8", "qint16", "quint16", "qint32"])
STORAGE = {"qint8": np.int8, "quint8": np.uint8, "qint16": np.int16, "quint16": np.uint16, "qint32": np.int32}
RANGE_VALUES = np.array([0.0, -0.0, 1.0, -1.0, 0.5, 6.0, -6.0, 127.0, -128.0, 1e-3, -1e-3, 1e-40, -1e-40, 1e-30,
                         3e38, -3e38, 1e6, -1e6, 2.5, -2.5, 255.0, 65535.0], np.float32)
X_SPECIAL = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1e-40, -1e-40, 0.5, -0.5, 1.5, 2.5, -2.5, 127.5, -128.5,
                      3e38, -3e38, 0.49999997, 1e-3], np.float32)


class _Boom(AssertionError):
    pass


def _fail(*args, **kwargs):
    raise _Boom("the reference ran although a kernel covers this case")


def _both(fn, parallel, *args, **kwargs):
    with pytest.MonkeyPatch.context() as m:
        m.setattr(tf_api._ref, "quantize_v2", _fail)
        m.setattr(tf_api._ref, "dequantize", _fail)
        if parallel:
            m.setattr(threads, "SPLIT_ALWAYS", True)
        with kernels.use_kernels(True), np.errstate(all="ignore"):
            fast = fn(*args, **kwargs)
    with kernels.use_kernels(False), np.errstate(all="ignore"):
        slow = fn(*args, **kwargs)
    return fast, slow


def _same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    bits = {1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize]
    bad = np.flatnonzero(np.ascontiguousarray(a).view(bits) != np.ascontiguousarray(b).view(bits))
    assert bad.size == 0, f"{bad.size} differ; first {bad[:4]}: {a.reshape(-1)[bad[:4]]} vs {b.reshape(-1)[bad[:4]]}"


@st.composite
def tf_cases(draw):
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=rank, max_size=rank)))
    mode = draw(st.sampled_from(["MIN_COMBINED", "MIN_FIRST", "SCALED"]))
    axis = -1 if mode == "MIN_FIRST" else draw(st.sampled_from([-1] + list(range(rank))))
    slices = 1 if axis < 0 else shape[axis]
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    pick = rng.random((slices, 2)) < 0.7
    ends = np.where(pick, rng.standard_normal((slices, 2)).astype(np.float32) * 10 ** rng.uniform(-3, 4, (slices, 2)),
                    rng.choice(RANGE_VALUES, (slices, 2))).astype(np.float32)
    ends.sort(axis=1)
    mins, maxs = ends[:, 0], ends[:, 1]
    if axis < 0:
        mins, maxs = mins[0], maxs[0]
    n = int(np.prod(shape))
    x = np.where(rng.random(n) < 0.7, rng.standard_normal(n) * 10 ** rng.uniform(-2, 3, n), rng.choice(X_SPECIAL, n))
    x = x.astype(np.float32).reshape(shape)
    return dict(x=x, mins=mins, maxs=maxs, mode=mode, axis=axis)


@settings(max_examples=examples(300))
@given(case=tf_cases(), T=st.sampled_from(TYPES), narrow=st.booleans(), half_to_even=st.booleans(),
       ensure=st.sampled_from([0.01, 0.0, 1e-6, 0.5]), parallel=st.booleans())
def test_quantize_v2_kernel_equals_reference(case, T, narrow, half_to_even, ensure, parallel):
    round_mode = "HALF_TO_EVEN" if half_to_even and case["mode"] == "SCALED" else "HALF_AWAY_FROM_ZERO"
    fast, slow = _both(qlinear.tf.quantize_v2, parallel, case["x"], case["mins"], case["maxs"], T, mode=case["mode"],
                       round_mode=round_mode, narrow_range=narrow, axis=case["axis"], ensure_minimum_range=ensure)
    for a, b in zip(fast, slow):
        _same(a, b)


@settings(max_examples=examples(300))
@given(case=tf_cases(), T=st.sampled_from(TYPES), narrow=st.booleans(), parallel=st.booleans(),
       bf16=st.booleans())
def test_dequantize_kernel_equals_reference(case, T, narrow, parallel, bf16):
    info = np.iinfo(STORAGE[T])
    rng = np.random.default_rng(abs(hash((T, case["x"].shape))) % 2**32)
    q = rng.integers(info.min, info.max, case["x"].shape, endpoint=True, dtype=np.int64).astype(STORAGE[T])
    q.reshape(-1)[:2] = [info.min, info.max][: q.size]
    fast, slow = _both(qlinear.tf.dequantize, parallel, q, case["mins"], case["maxs"], mode=case["mode"],
                       narrow_range=narrow, axis=case["axis"],
                       dtype="bfloat16" if bf16 and case["mode"] == "MIN_COMBINED" else "float32")
    _same(fast, slow)


@pytest.mark.parametrize("mode", ["MIN_COMBINED", "MIN_FIRST", "SCALED"])
@pytest.mark.parametrize("T", TYPES)
def test_large_inputs_take_the_parallel_path(mode, T):
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((7, 50_000)) * 40).astype(np.float32)
    axis = -1 if mode == "MIN_FIRST" else 0
    mins = np.float32(-30) if axis < 0 else -rng.random(7).astype(np.float32) * 50
    maxs = np.float32(50) if axis < 0 else rng.random(7).astype(np.float32) * 50
    fast, slow = _both(qlinear.tf.quantize_v2, False, x, mins, maxs, T, mode=mode, axis=axis)
    for a, b in zip(fast, slow):
        _same(a, b)
    fast, slow = _both(qlinear.tf.dequantize, False, slow[0], mins, maxs, mode=mode, axis=axis)
    _same(fast, slow)


def test_strict_stays_on_the_reference():
    x = np.linspace(-3, 3, 100, dtype=np.float32)
    with kernels.use_kernels(True):
        q, _, _ = qlinear.tf.quantize_v2(x, np.float32(-3), np.float32(3), "qint8", strict=True)
    with kernels.use_kernels(False):
        expected, _, _ = qlinear.tf.quantize_v2(x, np.float32(-3), np.float32(3), "qint8", strict=True)
    _same(q, expected)


# ----------------------------------------------------------------------------------------------- out=
ALL_TYPES = ["qint8", "quint8", "qint16", "quint16", "qint32"]
# (mode, axis, strict): per-tensor and per-axis (along the first axis, not the last), and strict=True
OUT_CASES = [("MIN_COMBINED", -1, False), ("MIN_COMBINED", 0, False), ("MIN_FIRST", -1, False), ("SCALED", -1, False),
             ("SCALED", 1, False), ("MIN_COMBINED", 0, True), ("SCALED", -1, True)]


def _kernel_switches(T):
    """Kernels on for the types whose kernels this run tests (`suite.tf_types`), and the reference for all."""
    return [True, False] if T in TYPES else [False]


def _check_out(fn, kernels_on, *args, **kwargs):
    """``fn(..., out=out)`` returns out itself (quantize_v2: as the tuple's first element, the ranges unchanged)
    holding the bits of ``fn(...)``, for a C-contiguous and a strided out; with the kernels on, the reference is
    patched to fail and the parallel path runs."""
    with pytest.MonkeyPatch.context() as m:
        if kernels_on:
            m.setattr(tf_api._ref, "quantize_v2", _fail)
            m.setattr(tf_api._ref, "dequantize", _fail)
            m.setattr(threads, "SPLIT_ALWAYS", True)
        with kernels.use_kernels(kernels_on), np.errstate(all="ignore"):
            expected = fn(*args, **kwargs)
            first = expected[0] if isinstance(expected, tuple) else expected
            for layout, out, untouched in out_layouts(first.shape, first.dtype):
                result = fn(*args, **kwargs, out=out)
                if isinstance(expected, tuple):
                    assert result[0] is out, layout
                    for a, b in zip(result[1:], expected[1:]):
                        _same(a, b)
                else:
                    assert result is out, layout
                _same(out, first)
                if untouched is not None:
                    assert (np.ascontiguousarray(untouched).view(np.uint8) == OUT_GARBAGE).all(), layout


def _out_case(mode, axis):
    rng = np.random.default_rng(31)
    x = np.where(rng.random(6 * 70) < 0.8, rng.standard_normal(6 * 70) * 20, rng.choice(X_SPECIAL, 6 * 70))
    x = x.astype(np.float32).reshape(6, 70)
    slices = 1 if axis < 0 else x.shape[axis]
    mins = -(rng.random(slices) * 30).astype(np.float32)
    maxs = (rng.random(slices) * 30).astype(np.float32)
    return (x, mins[0], maxs[0]) if axis < 0 else (x, mins, maxs)


@pytest.mark.parametrize("T", ALL_TYPES)
@pytest.mark.parametrize("mode, axis, strict", OUT_CASES)
def test_quantize_v2_out_equals_the_result_without_out(mode, axis, strict, T):
    x, mins, maxs = _out_case(mode, axis)
    if strict:
        x = np.nan_to_num(x, nan=0.0)  # strict=True rejects NaN
    for kernels_on in _kernel_switches(T):
        _check_out(qlinear.tf.quantize_v2, kernels_on, x, mins, maxs, T, mode=mode, axis=axis, strict=strict)


@pytest.mark.parametrize("T", ALL_TYPES)
@pytest.mark.parametrize("mode, axis, strict", OUT_CASES + [("MIN_COMBINED", -1, "bfloat16"),
                                                            ("MIN_COMBINED", 0, "bfloat16")])
def test_dequantize_out_equals_the_result_without_out(mode, axis, strict, T):
    _, mins, maxs = _out_case(mode, axis)
    info = np.iinfo(STORAGE[T])
    q = np.random.default_rng(32).integers(info.min, info.max, (6, 70), endpoint=True).astype(STORAGE[T])
    dtype = "bfloat16" if strict == "bfloat16" else "float32"
    for kernels_on in _kernel_switches(T):
        _check_out(qlinear.tf.dequantize, kernels_on, q, mins, maxs, mode=mode, axis=axis, strict=strict is True,
                   dtype=dtype)


@pytest.mark.parametrize("op", ["quantize_v2", "dequantize"])
def test_kernel_writes_into_out_without_a_result_sized_allocation(op):
    """With out=, the kernel allocates nothing of the result's size (NumPy reports its allocations to tracemalloc):
    a copy of the result, or a temporary of its size, would show in the peak."""
    T = TYPES[0]
    rng = np.random.default_rng(33)
    n = 1 << 22
    if op == "quantize_v2":
        x = rng.standard_normal(n, np.float32).reshape(4096, 1024)
        out = np.empty(x.shape, STORAGE[T])

        def call(**kw):
            return qlinear.tf.quantize_v2(x, np.float32(-2), np.float32(2), T, **kw)[0]
    else:
        info = np.iinfo(STORAGE[T])
        q = rng.integers(info.min, info.max, n, endpoint=True).astype(STORAGE[T]).reshape(4096, 1024)
        out = np.empty(q.shape, np.float32)

        def call(**kw):
            return qlinear.tf.dequantize(q, np.float32(-2), np.float32(2), **kw)
    with pytest.MonkeyPatch.context() as m, kernels.use_kernels(True):
        m.setattr(tf_api._ref, "quantize_v2", _fail)
        m.setattr(tf_api._ref, "dequantize", _fail)
        expected = call()  # also compiles and fills the caches
        tracemalloc.start()
        try:
            result = call(out=out)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert result is out
    _same(out, expected)
    assert peak < n // 64, f"{peak} bytes allocated during the call with out= (out holds {out.nbytes})"
