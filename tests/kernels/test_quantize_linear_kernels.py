"""The numba QuantizeLinear/DequantizeLinear kernels against the NumPy reference, bit for bit.

Every case runs through `qlinear.quantize_linear` / `qlinear.dequantize_linear` twice: with the kernels
(and the reference patched to fail, so the kernel really ran) and with `use_kernels(False)`. The
cases cover every input, scale, precision and output type of opset 28, every granularity at any axis
(blocked with a short last block), zero points present or absent, both saturate modes, and edge values:
ties, signed zeros, NaN, infinities, huge, subnormal, the float8/6/4 rounding thresholds. Half the cases
run the parallel kernel on small inputs (the serial threshold lowered to 0), so chunk boundaries fall
inside rows and blocks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc
from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import qlinear
from qlinear import dtypes, schemas
from qlinear.kernels import quantize_linear as kernels
from qlinear.kernels import threads
from qlinear.ops import quantize_linear as ops
from suite import OUT_GARBAGE, examples, out_layouts

Q28 = schemas.schema_for("QuantizeLinear", None, "test")
DQ28 = schemas.schema_for("DequantizeLinear", None, "test")
Q_OUTPUTS = [dtypes.get(n) for n in Q28.quantized_types]
DQ_INPUTS = [dtypes.get(n) for n in DQ28.quantized_types]

# Values around which results change: ties, the float8/6/4 and float16 thresholds, extremes.
SPECIAL = np.array(
    [0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, 0.5, -0.5, 1.5, 2.5, -2.5, 127.5, 128.5, -128.5, 255.5, 256.0,
     -129.0, 32767.5, 65535.5, 2.0**31, -(2.0**31), 2.0**31 + 256, 3.4e38, -3.4e38, 1e-45, -1e-45, 1e-40, 1.2e-38,
     448.0, 464.0, 465.0, 480.0, 240.0, 248.0, 57344.0, 61440.0, 61441.0, 6.0, 6.5, 7.0, 7.5, 7.75, 8.0, 28.0, 30.0,
     32.0, 0.25, 0.75, 2.0**-9, 2.0**-10, 3 * 2.0**-11, 2.0**-16, 2.0**-17, 2.0**-18, 65504.0, 65519.0, 65520.0,
     2.0**-24, 2.0**-25, 3 * 2.0**-26, 1.0 / 3, 2.0 / 3],
    np.float64,
)
SCALES = np.array([1.0, 0.5, 2.0, 0.25, 0.1, 0.7, 3.0, 1e-3, 1.0 / 3, 2.0**-10, 1e-30, 1e30, 2.0**-126, 0.0, -1.0,
                   -0.3, np.nan, np.inf, 65504.0, 1e-7], np.float64)


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def _x_values(rng, shape, dtype) -> np.ndarray:
    n = int(np.prod(shape))
    if dtype == np.int32:
        wide = rng.integers(-(2**31), 2**31, n, dtype=np.int64)
        small = rng.integers(-600, 600, n)
        near = rng.choice([2**24 + 2**16 + 1, 2**24 + 1, -(2**31), 2**31 - 1, 65519, 65520, 16777217], n)
        pick = rng.integers(0, 3, n)
        return np.choose(pick, [wide, small, near]).astype(np.int32).reshape(shape)
    normal = rng.standard_normal(n) * 10.0 ** rng.uniform(-4, 4, n)
    ties = rng.integers(-700, 700, n) + 0.5
    special = rng.choice(SPECIAL, n) * rng.choice([1.0, 2.0, 0.5, 0.7], n)
    pick = rng.integers(0, 3, n)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.choose(pick, [normal, ties, special]).astype(dtype).reshape(shape)


def _params(rng, shape, dtype) -> np.ndarray:
    values = np.where(rng.random(shape) < 0.8, rng.choice(SCALES[:10], shape), rng.choice(SCALES, shape))
    if np.dtype(dtype) == np.int32:
        return rng.integers(-5, 60, shape).astype(np.int32)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(values).astype(dtype)


def _zero_point(rng, shape, t: dtypes.ElementType) -> np.ndarray:
    if t.is_integer:
        near_edges = rng.choice([t.qmin, t.qmax, 0, t.qmin + 1, t.qmax - 1], shape)
        anywhere = rng.integers(t.qmin, t.qmax, shape, endpoint=True, dtype=np.int64)
        return np.where(rng.random(shape) < 0.5, near_edges, anywhere).astype(t.dtype)
    with np.errstate(over="ignore"):
        return rng.choice([0.0, 0.0, -0.0, 1.0, -0.5, 2.0], shape).astype(t.dtype)


@st.composite
def layouts(draw, allow_block=True):
    rank = draw(st.integers(0, 4))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=rank, max_size=rank)))
    kinds = ["tensor"] + (["axis"] + (["block"] if allow_block else []) if rank else [])
    kind = draw(st.sampled_from(kinds))
    axis = draw(st.integers(-rank, rank - 1)) if rank else 1
    block = 0
    if kind == "tensor":
        param_shape = draw(st.sampled_from([(), (1,)]))
    elif kind == "axis":
        param_shape = (shape[axis],)
    else:
        block = draw(st.integers(1, shape[axis] + 2))
        param_shape = list(shape)
        param_shape[axis] = -(-shape[axis] // block)
        param_shape = tuple(param_shape)
    return shape, param_shape, axis, block


class _Boom(AssertionError):
    pass


def _fail(*args, **kwargs):
    raise _Boom("the reference ran although a kernel covers this case")


def _both(fn, parallel: bool, *args, **kwargs):
    """(kernel result, reference result); the reference is patched out while the kernel path runs."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(ops.reference, "quantize_linear", _fail)
        m.setattr(ops.reference, "dequantize_linear", _fail)
        if parallel:
            m.setattr(threads, "SPLIT_ALWAYS", True)
        with kernels.use_kernels(True), np.errstate(all="ignore"):
            fast = fn(*args, **kwargs)
    with kernels.use_kernels(False), np.errstate(all="ignore"):
        slow = fn(*args, **kwargs)
    return fast, slow


def _assert_identical(fast: np.ndarray, slow: np.ndarray) -> None:
    assert fast.dtype == slow.dtype and fast.shape == slow.shape
    bad = np.flatnonzero(_bits(fast) != _bits(slow))
    assert bad.size == 0, f"{bad.size} of {fast.size} differ; first {bad[:4]}: {fast.reshape(-1)[bad[:4]]} vs {slow.reshape(-1)[bad[:4]]}"


X_TYPES = [np.float32, np.float16, ml_dtypes.bfloat16, np.int32]
SCALE_TYPES = [np.float32, np.float16, ml_dtypes.bfloat16, np.int32, ml_dtypes.float8_e8m0fnu]
PRECISIONS = [None, "float", "float16", "bfloat16", "double"]


@settings(max_examples=examples(400))
@given(
    layout=layouts(),
    x_type=st.sampled_from(X_TYPES),
    scale_type=st.sampled_from(SCALE_TYPES),
    output=st.sampled_from(Q_OUTPUTS),
    precision=st.sampled_from(PRECISIONS),
    with_zero_point=st.booleans(),
    saturate=st.sampled_from([0, 1]),
    parallel=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_quantize_kernel_equals_reference(layout, x_type, scale_type, output, precision,
                                          with_zero_point, saturate, parallel, seed):
    shape, param_shape, axis, block = layout
    rng = np.random.default_rng(seed)
    x = _x_values(rng, shape, x_type)
    scale = _params(rng, param_shape, scale_type)
    zp = _zero_point(rng, param_shape, output) if with_zero_point else None
    kwargs = dict(axis=axis, block_size=block, output_dtype=output.dtype, precision=precision)
    if output.kind == "float8":
        kwargs["saturate"] = saturate
    fast, slow = _both(qlinear.quantize_linear, parallel, x, scale, zp, **kwargs)
    _assert_identical(fast, slow)


@settings(max_examples=examples(300))
@given(
    layout=layouts(),
    x_type=st.sampled_from(DQ_INPUTS),
    scale_type=st.sampled_from([np.float32, np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e8m0fnu]),
    output=st.sampled_from([None, np.float32, np.float16, ml_dtypes.bfloat16]),
    with_zero_point=st.booleans(),
    parallel=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_dequantize_kernel_equals_reference(layout, x_type, scale_type, output, with_zero_point,
                                            parallel, seed):
    shape, param_shape, axis, block = layout
    rng = np.random.default_rng(seed)
    if scale_type == ml_dtypes.float8_e8m0fnu and output is None:
        output = np.float32
    if x_type.is_integer:
        x = rng.integers(x_type.qmin, x_type.qmax, shape, endpoint=True, dtype=np.int64).astype(x_type.dtype)
    else:
        x = rng.integers(0, 1 << x_type.bits, shape).astype(np.uint8).view(x_type.dtype)
    scale = _params(rng, param_shape, scale_type)
    zp = _zero_point(rng, param_shape, x_type) if with_zero_point else None
    fast, slow = _both(qlinear.dequantize_linear, parallel, x, scale, zp, axis=axis, block_size=block,
                       output_dtype=output)
    _assert_identical(fast, slow)


@pytest.mark.parametrize("output", Q_OUTPUTS, ids=lambda t: t.onnx_name)
@pytest.mark.parametrize("x_type", X_TYPES, ids=lambda t: np.dtype(t).name)
def test_quantize_every_output_larger_than_the_serial_threshold(x_type, output):
    """Sizes above the serial threshold, the real parallel path: per-tensor, per-axis (last axis) and
    blocked (middle and last axis, short last block)."""
    rng = np.random.default_rng(7)
    x = _x_values(rng, (3, 37, 401), x_type)
    kw = dict(output_dtype=output.dtype)
    cases = [
        (np.float32(0.37), dict()),
        (_params(rng, (401,), np.float32), dict(axis=-1)),
        (_params(rng, (3, 10, 401), np.float32), dict(axis=1, block_size=4)),
        # along the last axis: runs of whole blocks, a short last block, chunk boundaries inside blocks
        (_params(rng, (3, 37, 101), np.float32), dict(axis=-1, block_size=4)),
        (_params(rng, (3, 37, 13), np.float32), dict(axis=-1, block_size=32)),
        # segments longer than the kernels' prefetch block (128 elements): blocks of 150 along the last axis,
        # and per-axis along the middle axis (segments of 401)
        (_params(rng, (3, 37, 3), np.float32), dict(axis=-1, block_size=150)),
        (_params(rng, (37,), np.float32), dict(axis=1)),
    ]
    for scale, extra in cases:
        zp = _zero_point(rng, np.shape(scale), output)
        for parallel in (False, True):  # True: two chunks, the boundary inside a prefetch block
            fast, slow = _both(qlinear.quantize_linear, parallel, x, scale.astype(np.float32), zp, **kw, **extra)
            _assert_identical(fast, slow)


@pytest.mark.parametrize("x_type", DQ_INPUTS, ids=lambda t: t.onnx_name)
def test_dequantize_every_input_larger_than_the_serial_threshold(x_type):
    rng = np.random.default_rng(8)
    shape = (5, 33, 301)
    if x_type.is_integer:
        x = rng.integers(x_type.qmin, x_type.qmax, shape, endpoint=True, dtype=np.int64).astype(x_type.dtype)
    else:
        x = rng.integers(0, 1 << x_type.bits, shape).astype(np.uint8).view(x_type.dtype)
    for scale, extra in [(np.float32(0.37), {}), (_params(rng, (33,), np.float32), dict(axis=1)),
                         (_params(rng, (2, 33, 301), np.float32), dict(axis=0, block_size=3)),
                         (_params(rng, (5, 33, 38), np.float32), dict(axis=-1, block_size=8))]:
        for output in (np.float32, np.float16, ml_dtypes.bfloat16):
            zp = _zero_point(rng, np.shape(scale), x_type)
            for parallel in (False, True):  # True: two chunks, the boundary inside a prefetch block
                fast, slow = _both(qlinear.dequantize_linear, parallel, x, scale, zp, output_dtype=output, **extra)
                _assert_identical(fast, slow)


def test_non_contiguous_input():
    x = _x_values(np.random.default_rng(3), (40, 30), np.float32).T[::2]
    fast, slow = _both(qlinear.quantize_linear, True, x, np.float32(0.3), np.int8(1))
    _assert_identical(fast, slow)


def test_empty_input():
    for shape in [(0,), (3, 0, 2)]:
        y = qlinear.quantize_linear(np.zeros(shape, np.float32), np.float32(1), np.uint8(0))
        assert y.shape == shape and y.dtype == np.uint8
        z = qlinear.dequantize_linear(y, np.float32(1), np.uint8(0))
        assert z.shape == shape and z.dtype == np.float32


# ----------------------------------------------------------------------------------------------- threads
def test_set_num_threads_validates():
    with pytest.raises(ValueError, match=r"set_num_threads: n must lie in \[1, \d+\]"):
        threads.set_num_threads(0)
    with pytest.raises(TypeError, match="set_num_threads: n must be an int"):
        threads.set_num_threads(1.5)


def test_one_thread_and_all_threads_agree():
    x = _x_values(np.random.default_rng(4), (200_000,), np.float32)
    before = threads.get_num_threads()
    try:
        threads.set_num_threads(1)
        assert threads.get_num_threads() == 1
        one = qlinear.quantize_linear(x, np.float32(0.3), np.int8(1))
        threads.set_num_threads(before)
        many = qlinear.quantize_linear(x, np.float32(0.3), np.int8(1))
    finally:
        threads.set_num_threads(before)
    _assert_identical(one, many)


def test_concurrent_calls_from_threads():
    rng = np.random.default_rng(5)
    xs = [_x_values(rng, (100_000,), np.float32) for _ in range(8)]
    with kernels.use_kernels(False), np.errstate(all="ignore"):
        expected = [qlinear.quantize_linear(x, np.float32(0.3), np.uint8(9)) for x in xs]
    with ThreadPoolExecutor(4) as pool, np.errstate(all="ignore"):
        got = list(pool.map(lambda x: qlinear.quantize_linear(x, np.float32(0.3), np.uint8(9)), xs * 3))
    for g, e in zip(got, expected * 3):
        _assert_identical(g, e)


def test_concurrent_calls_with_table_converted_parameters():
    """Threads converting large 1-byte parameter arrays (float8 zero points, e8m0 scales) through the shared code
    tables at the same time, first use included, get the reference's results."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((32, 4096)) * 10).astype(np.float32)
    scales = (0.05 + rng.random((32, 128))).astype(np.float32)
    zp = rng.integers(0, 0x7E, (32, 128)).astype(np.uint8).view(ml_dtypes.float8_e5m2)
    codes = rng.integers(0, 64, (32, 4096)).astype(np.uint8).view(ml_dtypes.float6_e2m3fn)
    e8m0 = rng.integers(110, 140, (32, 128)).astype(np.uint8).view(ml_dtypes.float8_e8m0fnu)
    calls = [lambda: qlinear.quantize_linear(x, scales, zp, axis=1, block_size=32),
             lambda: qlinear.dequantize_linear(codes, e8m0, None, axis=1, block_size=32, output_dtype="float")]
    with kernels.use_kernels(False), np.errstate(all="ignore"):
        expected = [call() for call in calls]
    kernels._CODE_TABLES.clear()
    with ThreadPoolExecutor(4) as pool, np.errstate(all="ignore"):
        got = list(pool.map(lambda i: calls[i % 2](), range(16)))
    for i, g in enumerate(got):
        _assert_identical(g, expected[i % 2])


def test_concurrent_calls_under_the_workqueue_layer():
    """numba's workqueue layer aborts on concurrent parallel calls; qlinear serialises them."""
    from processes import under_workqueue

    printed = under_workqueue(
        """
        import numpy as np, numba, qlinear
        from concurrent.futures import ThreadPoolExecutor
        x = np.linspace(-300, 300, 200_000, dtype=np.float32)
        ref = qlinear.quantize_linear(x, np.float32(0.7), np.uint8(128))
        with ThreadPoolExecutor(4) as pool:
            outs = list(pool.map(lambda _: qlinear.quantize_linear(x, np.float32(0.7), np.uint8(128)), range(16)))
        assert all(np.array_equal(o, ref) for o in outs)
        print("ok", numba.config.THREADING_LAYER)
        """
    )
    assert printed == "ok workqueue"


def test_numba_num_threads_environment_is_honoured():
    script = "import qlinear.kernels.threads as t; print(t.get_num_threads())"
    env = dict(os.environ, NUMBA_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "1"


def test_import_qlinear_loads_no_numba():
    """`import qlinear` compiles nothing: numba itself is imported by the first kernel call."""
    script = "import sys, qlinear; print('numba' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize("granularity", ["tensor", "axis", "block"])
@pytest.mark.parametrize("output", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_nan_times_nan_keeps_x_nan(granularity, output):
    """DequantizeLinear of NaN float8 codes (both signs) with NaN scales: the result is x's NaN (its sign), in
    the kernel and in the reference, per tensor (NumPy's array-times-scalar loop alone would return the
    scale's) and per axis / blocked alike (docs/semantics.md, K3)."""
    codes = np.array([0x7F, 0xFF] * 512, np.uint8).view(ml_dtypes.float8_e4m3fn).reshape(4, 256)
    scale = {"tensor": np.array(np.nan, np.float32), "axis": np.full(256, np.nan, np.float32),
             "block": np.full((4, 128), np.nan, np.float32)}[granularity]
    extra = {"tensor": {}, "axis": dict(axis=1), "block": dict(axis=1, block_size=2)}[granularity]
    fast, slow = _both(qlinear.dequantize_linear, False, codes, scale, None, output_dtype=output, **extra)
    _assert_identical(fast, slow)
    negative = np.signbit(fast.astype(np.float32))
    assert np.isnan(fast.astype(np.float32)).all()
    np.testing.assert_array_equal(negative, np.signbit(codes.astype(np.float32)))


@pytest.mark.parametrize("granularity", ["tensor", "block"])
@pytest.mark.parametrize("zp_code", [0x7F, 0xFF])
def test_quantize_nan_zero_point_keeps_x_nan(granularity, zp_code):
    """QuantizeLinear to float8 with NaN zero points (both signs): where x / scale is NaN too, the byte is x's
    NaN (its sign), as the reference's q + zero_point gives it; elsewhere the zero point's NaN. The kernel adds
    without a NaN check only when no zero point is NaN."""
    x = np.array([np.nan, -np.nan, 1.0, -1.0, 0.0, -0.0, np.inf, -np.inf] * 64, np.float32).reshape(4, 128)
    if granularity == "tensor":
        zp = np.array(zp_code, np.uint8).view(ml_dtypes.float8_e4m3fn)
        fast, slow = _both(qlinear.quantize_linear, False, x, np.float32(0.5), zp)
    else:
        codes = np.tile(np.array([zp_code, 0x00, 0x38, zp_code ^ 0x80], np.uint8), 32).reshape(4, 32)
        fast, slow = _both(qlinear.quantize_linear, False, x, np.full((4, 32), 0.5, np.float32),
                           codes.view(ml_dtypes.float8_e4m3fn), axis=1, block_size=4)
    _assert_identical(fast, slow)
    nan_x = np.isnan(x)
    np.testing.assert_array_equal(fast.view(np.uint8)[nan_x], np.where(np.signbit(x[nan_x]), 0xFF, 0x7F))


SMALL_FLOAT_OUTPUTS = [t for t in dtypes.TYPES if t.is_small_float]
ONE_BYTE_ML_DTYPES = [t for t in dtypes.TYPES if t.dtype.itemsize == 1 and t.dtype.kind not in "iub"]


_FLOAT_CHAINS = [(np.float32,), (np.float16, np.float32), (ml_dtypes.bfloat16, np.float32), (np.float64,)]
_TABLE_CASES = [(t, chain) for t in ONE_BYTE_ML_DTYPES
                for chain in _FLOAT_CHAINS + ([(np.int32,)] if t.is_integer else [])]


@pytest.mark.parametrize("source, chain", _TABLE_CASES,
                         ids=[f"{t.onnx_name}-{'-'.join(np.dtype(d).name for d in c)}" for t, c in _TABLE_CASES])
def test_parameter_tables_convert_as_astype(source, chain):
    """Large 1-byte parameter arrays (float8/6/4 zero points, e8m0 scales, sub-byte integer zero points) are
    converted through a table of every code; the values, NaN bits included, are ml_dtypes' own astype of the
    same array."""
    codes = np.tile(np.arange(256, dtype=np.uint8), 9)  # above the table threshold
    if source.bits < 8:
        codes &= (1 << source.bits) - 1
    array = codes.view(source.dtype).reshape(36, 64)
    chain = tuple(np.dtype(d) for d in chain)
    expected = array.reshape(-1)
    with np.errstate(all="ignore"):
        for dtype in chain:
            expected = expected.astype(dtype)
        got = kernels._converted(array, *chain)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(_bits(got), _bits(expected))


def test_blocked_parameters_past_the_table_threshold_match_the_reference():
    """Q to float8 with 4096 non-zero float8 zero points, DQ of float4 with 4096 e8m0 scales, DQ of float8 with
    float8 zero points: kernel and reference alike."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((64, 2048)) * 20).astype(np.float32)
    zp = rng.integers(0, 256, (64, 64)).astype(np.uint8)
    zp[(zp & 0x7F) == 0x7F] = 0x01  # no NaN zero points
    zp = zp.view(ml_dtypes.float8_e4m3fn)
    scales = (0.05 + rng.random((64, 64))).astype(np.float32)
    fast, slow = _both(qlinear.quantize_linear, True, x, scales, zp, axis=1, block_size=32)
    _assert_identical(fast, slow)
    codes = rng.integers(0, 16, (64, 2048)).astype(np.uint8).view(ml_dtypes.float4_e2m1fn)
    e8m0 = rng.integers(100, 150, (64, 64)).astype(np.uint8).view(ml_dtypes.float8_e8m0fnu)
    fast, slow = _both(qlinear.dequantize_linear, True, codes, e8m0, None, axis=1, block_size=32,
                       output_dtype="float")
    _assert_identical(fast, slow)
    f8 = rng.integers(0, 256, (64, 2048)).astype(np.uint8).view(ml_dtypes.float8_e4m3fn)
    fast, slow = _both(qlinear.dequantize_linear, True, f8, scales, zp, axis=1, block_size=32)
    _assert_identical(fast, slow)


@pytest.mark.parametrize("output", SMALL_FLOAT_OUTPUTS, ids=lambda t: t.onnx_name)
def test_byte_zero_is_positive_zero(output):
    """The driver reads an all-zero-bytes zero point as +0 without converting it (ml_dtypes is the oracle)."""
    value = np.zeros(1, np.uint8).view(output.dtype).astype(np.float32)[0]
    assert value == 0 and not np.signbit(value)


@pytest.mark.parametrize("granularity", ["tensor", "block"])
@pytest.mark.parametrize("saturate", [True, False])
@pytest.mark.parametrize("output", SMALL_FLOAT_OUTPUTS, ids=lambda t: t.onnx_name)
def test_quantize_zero_zero_point_turns_negative_zero_positive(output, saturate, granularity):
    """Zero points that are all +0 take a rule that never reads them but still adds +0: -0 (and a negative
    quotient too small to be non-zero) becomes +0 as in the reference's q + zero_point, so a signed-zero format
    writes 0x00 where the same call without a zero point writes the sign."""
    x = np.array([-0.0, 0.0, -1e-45, -1e-30, -1.0, 1.0, np.nan, -np.inf] * 64, np.float32).reshape(4, 128)
    if granularity == "tensor":
        scale, zp, kw = np.float32(0.5), np.zeros((), output.dtype), {}
    else:
        scale, zp, kw = np.full((4, 32), 0.5, np.float32), np.zeros((4, 32), output.dtype), dict(axis=1, block_size=4)
    fast, slow = _both(qlinear.quantize_linear, False, x, scale, zp, saturate=saturate, **kw)
    _assert_identical(fast, slow)
    assert fast.view(np.uint8)[0, 0] == 0  # -0 + 0 is +0
    if np.zeros(1, np.float32).astype(output.dtype).view(np.uint8)[0] != np.float32(-0.0).astype(output.dtype).view(np.uint8):
        no_zero_point, _ = _both(qlinear.quantize_linear, False, x, scale, None, saturate=saturate,
                                 output_dtype=output.onnx_name, **kw)
        assert no_zero_point.view(np.uint8)[0, 0] != 0  # without a zero point the sign stays


@pytest.mark.parametrize("granularity", ["tensor", "block"])
def test_dequantize_nan_zero_point_keeps_x_nan(granularity):
    """DequantizeLinear of float8 NaN codes (both signs) with NaN zero points: x's NaN (its sign), in the kernel
    and in the reference."""
    codes = np.array([0x7F, 0xFF, 0x38, 0xB8] * 256, np.uint8).view(ml_dtypes.float8_e4m3fn).reshape(4, 256)
    if granularity == "tensor":
        zp = np.array(0xFF, np.uint8).view(ml_dtypes.float8_e4m3fn)
        fast, slow = _both(qlinear.dequantize_linear, False, codes, np.float32(0.5), zp)
    else:
        zp = np.tile(np.array([0x7F, 0xFF, 0x00], np.uint8), 86)[:128].reshape(4, 32).view(ml_dtypes.float8_e4m3fn)
        fast, slow = _both(qlinear.dequantize_linear, False, codes, np.full((4, 32), 0.5, np.float32), zp,
                           axis=1, block_size=8)
    _assert_identical(fast, slow)
    nan_x = np.isnan(codes.astype(np.float32))
    np.testing.assert_array_equal(np.signbit(fast[nan_x]), np.signbit(codes.astype(np.float32)[nan_x]))


# ----------------------------------------------------------------------------------------------- out=
# x of shape (6, 70): per-tensor; per-axis along axis 0 (not the last, so rows take one scale each); blocked along
# the last axis in blocks of 32 (a short last block of 6).
OUT_GRANULARITIES = {"tensor": ((), 1, 0), "axis": ((6,), 0, 0), "block": ((6, 3), 1, 32)}
OUT_QUANTIZED = ["uint8", "int8", "int16", "int4", "float8e4m3fn"]
OUT_FLOATS = [np.float32, np.float16, ml_dtypes.bfloat16]
def _check_out(fn, kernels_on: bool, expected_dtype, *args, **kwargs):
    """``fn(..., out=out)`` returns out itself, holding the bits of ``fn(...)``, for each layout of out; with the
    kernels on, the reference is patched to fail (the kernel wrote the result) and the parallel path runs."""
    with pytest.MonkeyPatch.context() as m:
        if kernels_on:
            m.setattr(ops.reference, "quantize_linear", _fail)
            m.setattr(ops.reference, "dequantize_linear", _fail)
            m.setattr(threads, "SPLIT_ALWAYS", True)
        with kernels.use_kernels(kernels_on), np.errstate(all="ignore"):
            expected = fn(*args, **kwargs)
            assert expected.dtype == np.dtype(expected_dtype)
            for layout, out, untouched in out_layouts(expected.shape, expected.dtype):
                result = fn(*args, **kwargs, out=out)
                assert result is out, layout
                _assert_identical(np.ascontiguousarray(out), expected)
                if untouched is not None:
                    assert (np.ascontiguousarray(untouched).view(np.uint8) == OUT_GARBAGE).all(), layout


@pytest.mark.parametrize("kernels_on", [True, False], ids=["kernels", "reference"])
@pytest.mark.parametrize("output", OUT_QUANTIZED)
@pytest.mark.parametrize("granularity", list(OUT_GRANULARITIES))
def test_quantize_out_equals_the_result_without_out(granularity, output, kernels_on):
    rng = np.random.default_rng(21)
    pshape, axis, block = OUT_GRANULARITIES[granularity]
    t = dtypes.get(output)
    x = _x_values(rng, (6, 70), np.float32)  # NaN, infinities, ties, huge and tiny values
    scale = _params(rng, pshape, np.float32)
    _check_out(qlinear.quantize_linear, kernels_on, t.dtype, x, scale, _zero_point(rng, pshape, t), axis=axis,
               block_size=block)
    _check_out(qlinear.quantize_linear, kernels_on, t.dtype, x, scale, axis=axis, block_size=block, output_dtype=output)


@pytest.mark.parametrize("kernels_on", [True, False], ids=["kernels", "reference"])
@pytest.mark.parametrize("output", OUT_FLOATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("x_type", OUT_QUANTIZED)
@pytest.mark.parametrize("granularity", list(OUT_GRANULARITIES))
def test_dequantize_out_equals_the_result_without_out(granularity, x_type, output, kernels_on):
    rng = np.random.default_rng(22)
    pshape, axis, block = OUT_GRANULARITIES[granularity]
    t = dtypes.get(x_type)
    if t.is_integer:
        x = rng.integers(t.qmin, t.qmax, (6, 70), endpoint=True).astype(t.dtype)
    else:  # every byte, NaN codes included
        x = rng.integers(0, 256, (6, 70), dtype=np.uint8).view(t.dtype)
    scale = _params(rng, pshape, np.float32)
    _check_out(qlinear.dequantize_linear, kernels_on, output, x, scale, _zero_point(rng, pshape, t), axis=axis,
               block_size=block, output_dtype=np.dtype(output))


@pytest.mark.parametrize("kernels_on", [True, False], ids=["kernels", "reference"])
def test_out_of_any_layout_scalar_or_empty(kernels_on):
    """A Fortran-ordered, an unaligned and a subclass out; a 0-d and an empty result."""
    x = _x_values(np.random.default_rng(23), (5, 8), np.float32)
    q = qlinear.quantize_linear(x, np.float32(0.25), np.uint8(100))
    with kernels.use_kernels(kernels_on), np.errstate(all="ignore"):
        expected = qlinear.dequantize_linear(q, np.float32(0.25), np.uint8(100))
        fortran = np.empty((5, 8), np.float32, order="F")
        unaligned = np.frombuffer(bytearray(4 * 40 + 1), np.uint8)[1:].view(np.float32).reshape(5, 8)
        assert not unaligned.flags.aligned
        subclass = np.empty((5, 8), np.float32).view(type("Sub", (np.ndarray,), {}))
        for out in (fortran, unaligned, subclass):
            assert qlinear.dequantize_linear(q, np.float32(0.25), np.uint8(100), out=out) is out
            _assert_identical(np.ascontiguousarray(out), expected)
        out = np.empty((), np.int8)
        assert qlinear.quantize_linear(np.float32(3.0), np.float32(0.5), np.int8(1), out=out) is out
        assert out == 7
        out = np.empty((3, 0), np.uint8)
        assert qlinear.quantize_linear(np.zeros((3, 0), np.float32), np.float32(1), out=out) is out


@pytest.mark.parametrize("case", ["quantize uint8", "quantize int8 blocked", "dequantize float32"])
def test_kernel_writes_into_out_without_a_result_sized_allocation(case):
    """With out=, the kernel's only allocations are its per-call constants (NumPy reports its allocations to
    tracemalloc): a copy of the result, or a temporary of its size, would show in the peak."""
    rng = np.random.default_rng(24)
    n = 1 << 22
    if case == "quantize uint8":
        x = rng.standard_normal(n, np.float32).reshape(4096, 1024)
        args, kwargs, out = (x, np.float32(0.02), np.uint8(128)), {}, np.empty(x.shape, np.uint8)
        fn, budget = qlinear.quantize_linear, n // 64
    elif case == "quantize int8 blocked":  # the converted zero points are a float32 per block: 128 KB here
        x = rng.standard_normal(n, np.float32).reshape(4096, 1024)
        pshape = (4096, 1024 // 128)
        args = (x, (0.01 + rng.random(pshape)).astype(np.float32), rng.integers(-8, 8, pshape).astype(np.int8))
        kwargs, out = dict(axis=1, block_size=128), np.empty(x.shape, np.int8)
        fn, budget = qlinear.quantize_linear, n // 8
    else:
        q = rng.integers(0, 256, n, dtype=np.uint8).reshape(4096, 1024)
        args, kwargs, out = (q, np.float32(0.02), np.uint8(128)), {}, np.empty(q.shape, np.float32)
        fn, budget = qlinear.dequantize_linear, n // 64
    with pytest.MonkeyPatch.context() as m, kernels.use_kernels(True):
        m.setattr(ops.reference, "quantize_linear", _fail)
        m.setattr(ops.reference, "dequantize_linear", _fail)
        expected = fn(*args, **kwargs)  # also compiles and fills the caches
        tracemalloc.start()
        try:
            result = fn(*args, **kwargs, out=out)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert result is out
    _assert_identical(out, expected)
    assert peak < budget, f"{peak} bytes allocated during the call with out= (out holds {out.nbytes})"
