"""QuantizeV2/Dequantize kernels vs the NumPy reference on a fixed grid of edge cases, bit for bit.

The hypothesis suite (test_tf_quantize_kernels.py) draws random cases; this one enumerates the corners the
float32 arithmetic of TensorFlow's kernel is sensitive to, for every type, mode, round mode and narrow_range:
ranges that are zero-width, equal and nonzero, negative-only, positive-only, subnormal (flushed), at the
smallest normal, huge (overflowing the width to inf), the exact grids of each type (so inputs land on ties);
ensure_minimum_range 0, subnormal and the default; strict=True and not; inputs NaN, +-inf, +-0, subnormals, FLT_MAX, half-integers,
2^31 and its neighbours; and for Dequantize every 8-bit code, the ends of each type and the qint32 values that
round to 2^31. Per-tensor calls take one range each; per-axis calls take every range at once, one slice each,
along the first and the last axis. Each call runs serially and split across threads (the serial threshold
patched to 0), with the reference patched to fail so that the kernel really ran.
"""

from __future__ import annotations

import numpy as np
import pytest

import qlinear.tf
from qlinear.kernels import quantize_linear as kernels
from qlinear.kernels import threads
from qlinear.tf import quantize as tf_api
from suite import tf_types

pytest.importorskip("numba")

F32 = np.float32
TINY = float(np.finfo(np.float32).tiny)
FMAX = float(np.finfo(np.float32).max)
TYPES = tf_types({"qint8": np.int8, "quint8": np.uint8, "qint16": np.int16, "quint16": np.uint16, "qint32": np.int32})
MODES = [("MIN_COMBINED", "HALF_AWAY_FROM_ZERO"), ("MIN_FIRST", "HALF_AWAY_FROM_ZERO"),
         ("SCALED", "HALF_AWAY_FROM_ZERO"), ("SCALED", "HALF_TO_EVEN")]

RANGES = np.array([
    (0.0, 0.0), (-0.0, 0.0), (0.0, 1e-40), (-1e-40, 1e-40), (-TINY, TINY), (-2 * TINY, TINY), (-1e-38, 1e-38),
    (1.0, 1.0), (-1.0, -1.0), (-5.0, -1.0), (1.0, 5.0), (-3e38, 3e38), (-FMAX, FMAX), (0.0, FMAX), (-FMAX, 0.0),
    (-1e-30, 1e-30), (-1e-7, 2e-7), (-128.0, 127.0), (0.0, 255.0), (-32768.0, 32767.0), (0.0, 65535.0),
    (-2.0**31, 2.0**31), (-6.0, 6.0), (-0.5, 1e10), (-1e10, 0.25),
    # around the bounds below which the kernels keep every flush (scale 2^124, |min| 2^-102)
    (-1e-33, 1e-33), (-1e-36, 1e-36), (-6e-36, 6e-36), (-5.9e-36, 5.9e-36), (-2.0**-102, 1.0), (-2.0**-103, 1.0),
    (-2.0**-102, 2.0**-120), (-1e-44, 1e-37), (0.0, 1e-36), (0.0, 1e-33), (-2.0**-110, 1e-36), (-1e-36, 0.0),
], np.float32)
ENSURE = [0.01, 0.0, 1e-40]

_SPECIAL = [0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, 1e-40, -1e-40, TINY, -TINY, FMAX, -FMAX, 3e38, -3e38,
            0.49999997, -0.49999997, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 127.5, -128.5, 255.5, 32767.5, -32768.5,
            65535.5, 2.0**31, -2.0**31, 2147483520.0, 2.0**31 + 256, 1e-3, -1e-3,
            1.1e-38, -1.1e-38, 5e-39, -5e-39]  # large subnormals: visible when the scale is near FLT_MAX
with np.errstate(over="ignore"):
    SPECIAL = np.array(_SPECIAL, np.float32)
HALVES = np.arange(-300, 301, dtype=np.float32) / 2
FRACTIONS = np.array([-0.25, 0.0, 1 / 3, 0.5, 0.999, 1.0, 1.25], np.float64)


class _ReferenceRan(AssertionError):
    pass


def _fail(*args, **kwargs):
    raise _ReferenceRan("the reference ran although a kernel covers this case")


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _assert_same(fast, slow, what):
    for a, b in zip(fast, slow):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape, what
        bad = np.flatnonzero(_bits(a).reshape(-1) != _bits(b).reshape(-1))
        assert bad.size == 0, f"{what}: {bad.size} differ, first {bad[:4]}: {a.reshape(-1)[bad[:4]]} vs {b.reshape(-1)[bad[:4]]}"


def _compare(monkeypatch, fn, *args, **kwargs):
    """Kernel serially, kernel on threads, reference: all bit-identical."""
    with np.errstate(all="ignore"):
        with kernels.use_kernels(False):
            slow = fn(*args, **kwargs)
        with monkeypatch.context() as m:
            m.setattr(tf_api._ref, "quantize_v2", _fail)
            m.setattr(tf_api._ref, "dequantize", _fail)
            with kernels.use_kernels(True):
                serial = fn(*args, **kwargs)
                m.setattr(threads, "SPLIT_ALWAYS", True)
                split = fn(*args, **kwargs)
    if not isinstance(slow, tuple):
        slow, serial, split = (slow,), (serial,), (split,)
    _assert_same(serial, slow, f"serial {kwargs}")
    _assert_same(split, slow, f"threads {kwargs}")


def _no_nan(x):
    """strict=True rejects NaN inputs."""
    return np.where(np.isnan(x), F32(0), x)


def _inputs_for(lo, hi):
    """Special values, half-integers, and points across [lo, hi] (and beyond it)."""
    with np.errstate(all="ignore"):
        across = (F32(lo) + (np.float64(hi) - np.float64(lo)) * FRACTIONS).astype(np.float32)
    return np.concatenate([SPECIAL, HALVES, across])


@pytest.mark.parametrize("narrow", [False, True])
@pytest.mark.parametrize("mode,round_mode", MODES)
@pytest.mark.parametrize("T", list(TYPES))
def test_quantize_v2_per_tensor_edges(monkeypatch, T, mode, round_mode, narrow):
    for lo, hi in RANGES:
        x = _inputs_for(lo, hi)
        for ensure in ENSURE:
            for strict in (False, True):
                _compare(monkeypatch, qlinear.tf.quantize_v2, _no_nan(x) if strict else x, lo, hi, T, mode=mode,
                         round_mode=round_mode, narrow_range=narrow, ensure_minimum_range=ensure, strict=strict)


@pytest.mark.parametrize("narrow", [False, True])
@pytest.mark.parametrize("mode,round_mode", [m for m in MODES if m[0] != "MIN_FIRST"])
@pytest.mark.parametrize("T", list(TYPES))
def test_quantize_v2_per_axis_edges(monkeypatch, T, mode, round_mode, narrow):
    mins, maxs = RANGES[:, 0].copy(), RANGES[:, 1].copy()
    columns = np.stack([_inputs_for(lo, hi) for lo, hi in RANGES], axis=1)  # [values, slices]
    for ensure in ENSURE:
        for x, axis in ((columns, 1), (np.ascontiguousarray(columns.T), 0), (columns.T[:, None, :].copy(), 0)):
            for strict in (False, True):
                _compare(monkeypatch, qlinear.tf.quantize_v2, _no_nan(x) if strict else x, mins, maxs, T, mode=mode,
                         round_mode=round_mode, narrow_range=narrow, axis=axis, ensure_minimum_range=ensure,
                         strict=strict)


def _codes(T):
    info = np.iinfo(TYPES[T])
    if info.bits == 8:
        values = np.arange(info.min, info.max + 1)
    else:
        ends = [info.min, info.min + 1, info.min + 2, -1, 0, 1, info.max - 1, info.max]
        values = np.concatenate([ends, np.arange(-300, 301)]).clip(info.min, info.max)
    if T == "qint32":  # the largest values round to 2^31 in float32 (the per-tensor SCALED wrap)
        values = np.concatenate([values, [2**31 - 64, 2**31 - 65, 2**31 - 128, 2**31 - 129, 2**24 + 1, -(2**24) - 1]])
    return values.astype(TYPES[T])


@pytest.mark.parametrize("narrow", [False, True])
@pytest.mark.parametrize("mode", ["MIN_COMBINED", "MIN_FIRST", "SCALED"])
@pytest.mark.parametrize("T", list(TYPES))
def test_dequantize_edges(monkeypatch, T, mode, narrow):
    q = _codes(T)
    out_types = ["float32", "bfloat16"] if mode == "MIN_COMBINED" else ["float32"]
    for dtype in out_types:
        for strict in (False, True):
            for lo, hi in RANGES:
                _compare(monkeypatch, qlinear.tf.dequantize, q, lo, hi, mode=mode, narrow_range=narrow, dtype=dtype,
                         strict=strict)
            if mode != "MIN_FIRST":
                columns = np.repeat(q[:, None], len(RANGES), axis=1)
                for x, axis in ((columns, 1), (np.ascontiguousarray(columns.T), 0)):
                    _compare(monkeypatch, qlinear.tf.dequantize, x, RANGES[:, 0], RANGES[:, 1], mode=mode,
                             narrow_range=narrow, axis=axis, dtype=dtype, strict=strict)


@pytest.mark.parametrize("mode,round_mode", MODES)
def test_large_edges_on_threads(monkeypatch, mode, round_mode):
    """Large inputs (the default decides whether to split them; `_compare` then forces a split), with special values
    scattered through every chunk."""
    rng = np.random.default_rng(5)
    n = 3 * (1 << 20) + 7
    x = (rng.standard_normal(n) * 4).astype(np.float32)
    x[rng.integers(0, n, 2000)] = rng.choice(SPECIAL, 2000)
    for T in TYPES:
        _compare(monkeypatch, qlinear.tf.quantize_v2, x, F32(-3), F32(5), T, mode=mode, round_mode=round_mode)
        if mode != "MIN_FIRST":
            x2 = x[: n - n % 64].reshape(-1, 64)
            mins = -np.abs(rng.standard_normal(64)).astype(np.float32)
            maxs = np.abs(rng.standard_normal(64)).astype(np.float32)
            _compare(monkeypatch, qlinear.tf.quantize_v2, x2, mins, maxs, T, mode=mode, round_mode=round_mode, axis=1)
        if round_mode == "HALF_AWAY_FROM_ZERO":
            info = np.iinfo(TYPES[T])
            q = rng.integers(info.min, info.max, n, endpoint=True, dtype=np.int64).astype(TYPES[T])
            _compare(monkeypatch, qlinear.tf.dequantize, q, F32(-3), F32(5), mode=mode)


@pytest.mark.parametrize("mode,round_mode", [m for m in MODES if m[0] != "MIN_FIRST"])
def test_per_axis_rows_longer_than_a_prefetch_block(monkeypatch, mode, round_mode):
    """Per-axis along the last axis with 300 slices: each row is walked in blocks of 128 (plus a short one), with
    the reference's ranges repeated along it and special values in every block."""
    reps = -(-300 // len(RANGES))
    mins, maxs = np.tile(RANGES[:, 0], reps)[:300].copy(), np.tile(RANGES[:, 1], reps)[:300].copy()
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((20, 300)) * 10 ** rng.uniform(-3, 4, (20, 300))).astype(np.float32)
    x.reshape(-1)[rng.integers(0, x.size, 400)] = rng.choice(SPECIAL, 400)
    for T in TYPES:
        _compare(monkeypatch, qlinear.tf.quantize_v2, x, mins, maxs, T, mode=mode, round_mode=round_mode, axis=1)
        info = np.iinfo(TYPES[T])
        q = rng.integers(info.min, info.max, (20, 300), endpoint=True, dtype=np.int64).astype(TYPES[T])
        if round_mode == "HALF_AWAY_FROM_ZERO":
            _compare(monkeypatch, qlinear.tf.dequantize, q, mins, maxs, mode=mode, axis=1)
