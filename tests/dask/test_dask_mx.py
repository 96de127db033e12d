"""qlinear.mx on dask arrays: lazy, each chunk quantized once, and bit-identical to the NumPy path for every
format, axis and chunking (chunks that split a block included); NVFP4's tensor scale a lazy reduction."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import qlinear.mx as mx
from suite import examples

da = pytest.importorskip("dask.array")


def bits(a):
    a = np.asarray(a)
    return a.view(np.uint8) if a.dtype.itemsize == 1 else a.view(np.uint32)


def assert_same(lazy, eager):
    values = da.compute(*lazy)  # one compute: each chunk quantized once
    assert len(values) == len(eager)
    for got, want in zip(values, eager):
        got, want = np.asarray(got), np.asarray(want)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(bits(got), bits(want))


@st.composite
def cases(draw):
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 70), min_size=rank, max_size=rank)))
    chunks = tuple(draw(st.integers(1, d)) for d in shape)
    axis = draw(st.integers(-rank, rank - 1))
    fmt = draw(st.sampled_from(list(mx.FORMATS)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = (rng.standard_normal(shape) * np.exp2(rng.integers(-8, 8, shape))).astype(np.float32)
    if x.size > 3 and draw(st.booleans()):
        x.reshape(-1)[rng.integers(0, x.size)] = draw(st.sampled_from([np.inf, -np.inf, np.nan, 0.0]))
    return x, chunks, axis, fmt


@settings(max_examples=examples(120), deadline=None)
@given(cases())
def test_dask_equals_numpy(case):
    x, chunks, axis, fmt = case
    eager = mx.quantize(x, fmt, axis=axis)
    lazy = mx.quantize(da.from_array(x, chunks=chunks), fmt, axis=axis)
    assert all(isinstance(a, da.Array) for a in lazy)
    assert_same(lazy, eager)
    g = {"global_scale": lazy[2]} if fmt == "nvfp4" else {}
    back = mx.dequantize(lazy[0], lazy[1], axis=axis, **g)
    assert isinstance(back, da.Array)
    want = mx.dequantize(eager[0], eager[1], axis=axis, **({"global_scale": eager[2]} if g else {}))
    np.testing.assert_array_equal(bits(back.compute()), bits(want))


def test_nvfp4_given_tensor_scale_and_numpy_scales():
    x = np.random.default_rng(1).standard_normal((6, 100)).astype(np.float32)
    g = np.float32(0.0004)
    lazy = mx.quantize(da.from_array(x, chunks=(4, 30)), "nvfp4", global_scale=g)
    assert isinstance(lazy[2], np.ndarray) and lazy[2] == g
    eager = mx.quantize(x, "nvfp4", global_scale=g)
    assert_same(lazy[:2], eager[:2])
    # dask codes with the NumPy block scales and tensor scale
    y = mx.dequantize(lazy[0], eager[1], global_scale=eager[2])
    np.testing.assert_array_equal(y.compute(), mx.dequantize(*eager[:2], global_scale=eager[2]))


def test_chunk_edges_move_to_block_edges():
    x = da.ones((4, 100), dtype=np.float32, chunks=(4, 30))  # edges 30, 60, 90 split blocks of 32
    codes, scales = mx.quantize(x, "mxfp4")
    assert all(edge % 32 == 0 for edge in np.cumsum(codes.chunks[1])[:-1])
    assert scales.chunks[1] == tuple(-(-c // 32) for c in codes.chunks[1])


def test_nothing_is_computed_until_asked_and_each_chunk_once():
    calls = []

    def counting(block):
        calls.append(block.size)
        return block

    x = da.ones((8, 64), dtype=np.float32, chunks=(4, 32)).map_blocks(counting)
    calls.clear()  # dask's own dtype inference for map_blocks(counting) calls it once
    codes, scales = mx.quantize(x, "mxfp8_e4m3")
    assert calls == []
    da.compute(codes, scales)
    assert calls == [128] * 4
    calls.clear()
    codes, scales, g = mx.quantize(x, "nvfp4")
    assert calls == []
    da.compute(codes, scales, g)
    assert calls == [128] * 4  # one task per chunk feeds both passes (the tensor maximum, then the codes)


def test_errors():
    x = da.from_array(np.ones((6, 64), np.float32), chunks=3)
    with pytest.raises(TypeError, match="x must be float32"):
        mx.quantize(x.astype(np.int32), "mxfp4")
    with pytest.raises(TypeError, match="not a dask array"):
        mx.quantize(x, "nvfp4", global_scale=da.from_array(np.float32(1)))
    unknown = x[x[:, 0] > 0]  # unknown chunk sizes
    with pytest.raises(ValueError, match="chunks of unknown size"):
        mx.quantize(unknown, "mxfp4")
    with pytest.raises(ValueError, match="need"):  # the scales' shape, as for NumPy
        mx.dequantize(mx.quantize(x, "mxfp4")[0], np.ones((6, 3), np.uint8).view(mx.FORMATS["mxfp4"].scale_type.dtype))
