"""qlinear.tf.quantize_v2 / dequantize on dask arrays: lazy output, output ranges as NumPy values, bit-identical
to the NumPy path in every mode, per-tensor and per-axis (chunks that split the axis included)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import qlinear
from suite import examples, tf_types

da = pytest.importorskip("dask.array")

MODES = [("MIN_COMBINED", "HALF_AWAY_FROM_ZERO"), ("MIN_FIRST", "HALF_AWAY_FROM_ZERO"),
         ("SCALED", "HALF_AWAY_FROM_ZERO"), ("SCALED", "HALF_TO_EVEN")]


@st.composite
def cases(draw):
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=rank, max_size=rank)))
    chunks = tuple(draw(st.integers(1, d)) for d in shape)
    mode, round_mode = draw(st.sampled_from(MODES))
    axis = -1 if mode == "MIN_FIRST" else draw(st.sampled_from([-1] + list(range(rank))))
    T = draw(st.sampled_from(tf_types(["qint8", "quint8", "qint16", "quint16", "qint32"])))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    count = 1 if axis == -1 else shape[axis]
    low = -rng.random(count).astype(np.float32) * 4
    high = rng.random(count).astype(np.float32) * 4
    if axis == -1:
        low, high = low[0], high[0]
    kwargs = dict(mode=mode, round_mode=round_mode, narrow_range=draw(st.booleans()), axis=axis,
                  strict=draw(st.booleans()))
    return x, chunks, low, high, T, kwargs


@settings(max_examples=examples(120))
@given(cases())
def test_dask_equals_numpy(case):
    x, chunks, low, high, T, kwargs = case
    q, out_min, out_max = qlinear.tf.quantize_v2(x, low, high, T, **kwargs)
    lazy, lazy_min, lazy_max = qlinear.tf.quantize_v2(da.from_array(x, chunks=chunks), low, high, T, **kwargs)
    assert isinstance(lazy, da.Array)
    np.testing.assert_array_equal(lazy.compute(), q)
    np.testing.assert_array_equal(lazy_min, out_min)
    np.testing.assert_array_equal(lazy_max, out_max)
    assert np.shape(lazy_min) == np.shape(out_min)

    dq_kwargs = {k: kwargs[k] for k in ("mode", "narrow_range", "axis", "strict")}
    back = qlinear.tf.dequantize(lazy, out_min, out_max, **dq_kwargs)
    assert isinstance(back, da.Array)
    np.testing.assert_array_equal(back.compute(), qlinear.tf.dequantize(q, out_min, out_max, **dq_kwargs))


@pytest.mark.parametrize("call", [
    lambda x: qlinear.tf.quantize_v2(x, np.zeros(3, np.float32), np.ones(3, np.float32), "qint8", axis=1),
    lambda x: qlinear.tf.quantize_v2(x, np.float32(1), np.float32(0), "qint8"),
    lambda x: qlinear.tf.quantize_v2(x, np.float32(0), np.float32(1), "qint8", mode="MIN_COMBINED", round_mode="HALF_TO_EVEN"),
    lambda x: qlinear.tf.dequantize(x.astype(np.int8), np.zeros(4, np.float32), np.ones(4, np.float32), axis=1, mode="MIN_FIRST"),
])
def test_errors_are_those_of_the_numpy_path(call):
    x = np.ones((6, 4), np.float32)
    with pytest.raises((ValueError, TypeError)) as numpy_error:
        call(x)
    with pytest.raises(numpy_error.type) as dask_error:
        call(da.from_array(x, chunks=3))
    assert str(dask_error.value) == str(numpy_error.value)


@pytest.mark.parametrize("call", [
    lambda x: qlinear.tf.quantize_v2(x, np.float32(0), np.float32(1), "quint8", out=np.empty((6, 4), np.uint8)),
    lambda x: qlinear.tf.dequantize(x.astype(np.uint8), np.float32(0), np.float32(1), out=np.empty((6, 4), np.float32)),
])
def test_out_is_refused_for_dask_input(call):
    x = da.from_array(np.ones((6, 4), np.float32), chunks=3)
    with pytest.raises(TypeError, match=r"(quantize_v2|dequantize): out= is for NumPy arrays; input is a dask array"):
        call(x)
