"""QuantizeLinear/DequantizeLinear on dask arrays: lazy, and bit-identical to the NumPy path for every
granularity and chunking (chunks that split a block or a per-axis dimension included)."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import qlinear
from suite import examples

da = pytest.importorskip("dask.array")

OUTPUTS = ["uint8", "int8", "int16", "uint4", "int4", "int2", "float8e4m3fn", "float4e2m1"]


def bits(a):
    return a.view(np.uint8) if a.dtype.itemsize == 1 else a


@st.composite
def cases(draw):
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 12), min_size=rank, max_size=rank)))
    chunks = tuple(draw(st.integers(1, d)) for d in shape)
    kind = draw(st.sampled_from(["tensor", "axis", "block"]))
    axis = draw(st.integers(-rank, rank - 1))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    if kind == "tensor":
        param_shape, block_size = (), 0
    elif kind == "axis":
        param_shape, block_size = (shape[axis],), 0
    else:
        block_size = draw(st.integers(1, shape[axis]))
        param_shape = list(shape)
        param_shape[axis] = -(-shape[axis] // block_size)
        param_shape = tuple(param_shape)
    output = draw(st.sampled_from(OUTPUTS))
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    scale = (rng.random(param_shape) + 0.05).astype(np.float32)
    zp = None
    if draw(st.booleans()):
        t = qlinear.dtypes.get(output)
        if t.is_integer:
            zp = rng.integers(t.qmin, t.qmax + 1, size=param_shape).astype(t.dtype)
        else:
            zp = np.zeros(param_shape, t.dtype)
    return x, chunks, scale, zp, dict(axis=axis, block_size=block_size, output_dtype=output)


@settings(max_examples=examples(150))
@given(cases())
def test_dask_equals_numpy(case):
    x, chunks, scale, zp, kwargs = case
    expected = qlinear.quantize_linear(x, scale, zp, **kwargs)
    lazy = qlinear.quantize_linear(da.from_array(x, chunks=chunks), scale, zp, **kwargs)
    assert isinstance(lazy, da.Array)
    actual = lazy.compute()
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    np.testing.assert_array_equal(bits(actual), bits(expected))

    kwargs.pop("output_dtype")
    back = qlinear.dequantize_linear(lazy, scale, zp, **kwargs)
    assert isinstance(back, da.Array)
    np.testing.assert_array_equal(back.compute(), qlinear.dequantize_linear(expected, scale, zp, **kwargs))


def test_blocked_chunk_edges_move_to_block_edges():
    x = da.zeros((4, 100), dtype=np.float32, chunks=(4, 30))  # edges 30, 60, 90 split blocks of 32
    y = qlinear.quantize_linear(x, np.ones((4, 4), np.float32), axis=1, block_size=32)
    assert all(edge % 32 == 0 for edge in np.cumsum(y.chunks[1])[:-1])
    np.testing.assert_array_equal(y.compute(), np.zeros((4, 100), np.uint8))


def test_nothing_is_computed_until_asked():
    calls = []

    def counting(block):
        calls.append(block.size)
        return block

    x = da.ones((8, 8), dtype=np.float32, chunks=4).map_blocks(counting)
    calls.clear()  # dask's own dtype inference for map_blocks(counting) calls it once
    y = qlinear.quantize_linear(x, np.float32(0.5), np.uint8(0))
    assert calls == []
    y.compute()
    assert calls == [16, 16, 16, 16]


@pytest.mark.parametrize("make_call", [
    lambda x: qlinear.quantize_linear(x, np.ones(5, np.float32), axis=1),
    lambda x: qlinear.quantize_linear(x, np.ones((6, 3), np.float32), axis=1, block_size=2),
    lambda x: qlinear.quantize_linear(x.astype(np.float64), np.float32(1)),
    lambda x: qlinear.dequantize_linear(x.astype(np.uint8), np.ones((6, 4), np.float32), np.zeros((6, 3), np.uint8), axis=1, block_size=2),
])
def test_errors_are_those_of_the_numpy_path(make_call):
    x = np.ones((6, 4), np.float32)
    with pytest.raises((ValueError, TypeError)) as numpy_error:
        make_call(x)
    with pytest.raises(numpy_error.type) as dask_error:
        make_call(da.from_array(x, chunks=3))
    assert str(dask_error.value) == str(numpy_error.value)


def test_unknown_chunk_sizes_are_refused():
    x = da.from_array(np.ones(10, np.float32), chunks=5)
    x = x[x > 0]  # unknown chunk sizes
    with pytest.raises(ValueError, match=r"x has unknown dimensions \(a dask array with chunks of unknown size\)"):
        qlinear.quantize_linear(x, np.ones(5, np.float32), axis=0, block_size=2)
    with pytest.raises(ValueError, match="unknown chunk sizes along the blocked axis"):
        qlinear.dask_adapter.block_aligned_chunks((5, float("nan")), 2, "quantize_linear")


@pytest.mark.parametrize("call", [
    lambda x: qlinear.quantize_linear(x, np.float32(0.5), np.uint8(0), out=np.empty((6, 4), np.uint8)),
    lambda x: qlinear.dequantize_linear(x.astype(np.uint8), np.float32(0.5), out=np.empty((6, 4), np.float32)),
])
def test_out_is_refused_for_dask_input(call):
    x = da.from_array(np.ones((6, 4), np.float32), chunks=3)
    with pytest.raises(TypeError, match=r"_linear: out= is for NumPy arrays; x is a dask array"):
        call(x)
