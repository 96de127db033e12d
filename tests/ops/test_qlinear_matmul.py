"""qlinear_matmul (ONNX QLinearMatMul-10/21): differential tests against the int64 NumPy reference, the onnx
reference evaluator and onnxruntime; float16/bfloat16 scales; worst cases; overflow; argument errors."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qlinear.ops._quant_args import AccumulatorOverflowError
from qlinear.ops.qlinear_matmul import qlinear_matmul
from qlinear.reference.matmul import matmul_accumulate
from qlinear.reference.requantize import requantize, requantize_multiplier
from suite import other_paths

from ._conv_family_cases import matmul_cases
from ._conv_family_peers import cpu_has_vnni, make_model, onnxruntime_exact_for_weights, run_onnxruntime, run_reference
from suite import examples

f32, f16, bf16 = np.float32, np.float16, ml_dtypes.bfloat16
U8, S8 = np.dtype(np.uint8), np.dtype(np.int8)
NAMES = ("a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "y_scale", "y_zero_point")


def spec_shaped(case):
    """The case's parameters with the spec's meaning made explicit for numpy broadcasting: an (M,) per-row
    vector becomes (M, 1); a one-element per-tensor value becomes 0-d."""
    def fix(value, row_vector=False):
        value = np.asarray(value)
        if value.size == 1 and value.ndim <= 1:
            return value.reshape(())
        return value.reshape(-1, 1) if row_vector else value

    def drop_vector_axes(value, axis):
        # numpy.matmul drops M for a 1-D a and N for a 1-D b: the parameters lose that axis too.
        return value[(Ellipsis, 0) + (slice(None),) * (-1 - axis)] if value.ndim >= -axis else value

    row = case.a_granularity == "row-vector"
    a_scale, a_zp = fix(case.a_scale, row), fix(case.a_zero_point, row)
    b_scale, b_zp = fix(case.b_scale), fix(case.b_zero_point)
    if case.b.ndim == 1:
        a_scale = drop_vector_axes(a_scale, -1)  # zero points still apply to the operands' own axes
    if case.a.ndim == 1 and b_scale.ndim >= 2:
        b_scale = drop_vector_axes(b_scale, -2)
    return (case.a, a_scale, a_zp, case.b, b_scale, b_zp, fix(case.y_scale), fix(case.y_zero_point))


def model_of(args, opset):
    return make_model("QLinearMatMul", list(zip(NAMES, map(np.asarray, args))), [np.asarray(args[7]).dtype], opset)


@settings(max_examples=examples(150))
@given(case=matmul_cases(scale_types=(f32, f16, bf16)))
def test_matches_int64_reference_transcription(case):
    a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = spec_shaped(case)
    acc = matmul_accumulate(a, a_zp, b, b_zp)
    for mode in ("float64", "float32"):
        expected = requantize(acc, requantize_multiplier(a_scale, b_scale, y_scale, mode), y_zp, mode)
        np.testing.assert_array_equal(qlinear_matmul(*case.args(), requantize=mode), expected, strict=True)


@settings(max_examples=examples(250))
@given(case=matmul_cases(scale_types=(f32, f16, bf16)), opset=st.sampled_from([10, 21]))
def test_matches_onnx_reference_evaluator(case, opset):
    if case.a_scale.dtype != f32:
        opset = 21
    expected = run_reference(model_of(spec_shaped(case), opset), case.a)[0]
    np.testing.assert_array_equal(qlinear_matmul(*case.args(), opset=opset), expected, strict=True)


def test_onnx_reference_reads_a_row_vector_along_k():
    """Documented deviation: for a 2-D a (M, K) the spec's per-row "M element vector" is broadcast by the
    reference against K: an error when M != K (and per-K values when M == K). qlinear reads it per row."""
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (2, 3), dtype=np.uint8)
    b = rng.integers(-128, 128, (3, 4), dtype=np.int8)
    args = (a, np.array([0.1, 0.2], f32), np.array([1, 2], np.uint8), b, f32(0.05), np.int8(0), f32(1.0), np.uint8(100))
    with pytest.raises(ValueError, match="broadcast"):
        run_reference(model_of(args, 21), a)
    per_row = (a, args[1].reshape(2, 1), args[2].reshape(2, 1)) + args[3:]
    np.testing.assert_array_equal(qlinear_matmul(*args), run_reference(model_of(per_row, 21), a)[0], strict=True)


# The (a, b, y) types onnxruntime 1.32 implements QLinearMatMul for (others: NOT_IMPLEMENTED).
ONNXRUNTIME_TYPES = [(U8, U8, U8), (U8, S8, U8), (S8, S8, S8)]


@settings(max_examples=examples(250))
@given(case=matmul_cases(type_combos=ONNXRUNTIME_TYPES, scale_types=(f32, f16), a_granularities=("tensor",),
                         b_granularities=("tensor", "column-exact")))
def test_matches_onnxruntime_with_float32_requantization(case):
    """onnxruntime takes a per-tensor a, and b per tensor or b.shape[:-2] + (1, N); float32 or float16 scales."""
    if not onnxruntime_exact_for_weights(case.b, case.a.dtype):
        return
    expected = run_onnxruntime(model_of(case.args(), 21), case.a)[0]
    np.testing.assert_array_equal(qlinear_matmul(*case.args(), requantize="float32"), expected, strict=True)


@pytest.mark.parametrize("a_zp,b_zp", [(np.full((3, 1), 2, np.uint8), np.int8(0)), (np.uint8(2), np.zeros(5, np.int8))])
def test_onnxruntime_refuses_per_row_a_and_column_vector_of_batched_b(a_zp, b_zp):
    """Documented peer limitation: onnxruntime takes a per-tensor a only, and for a batched b a per-column
    parameter only of shape b.shape[:-2] + (1, N) (an (N,) vector only when b is 2-D)."""
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, (3, 4), dtype=np.uint8)
    b = rng.integers(-128, 128, (2, 4, 5), dtype=np.int8)
    args = (a, np.full(np.shape(a_zp), 0.1, f32), a_zp, b, np.full(np.shape(b_zp), 0.1, f32), b_zp, f32(3), np.uint8(100))
    with pytest.raises(Exception, match="QLinearMatmul : (input|weight) zero point must be"):
        run_onnxruntime(model_of(args, 21), a)
    np.testing.assert_array_equal(qlinear_matmul(*args), run_reference(model_of(args, 21), a)[0], strict=True)


def test_onnxruntime_takes_a_column_vector_for_2d_b():
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, (3, 4), dtype=np.uint8)
    b = rng.integers(-128, 128, (4, 5), dtype=np.int8)
    if not onnxruntime_exact_for_weights(b, a.dtype):
        b >>= 1  # into [-64, 63], where onnxruntime is exact without VNNI too (docs/semantics.md)
    args = (a, f32(0.1), np.uint8(2), b, np.linspace(0.01, 0.05, 5, dtype=f32), np.arange(-2, 3).astype(np.int8), f32(3), np.uint8(100))
    np.testing.assert_array_equal(qlinear_matmul(*args, requantize="float32"), run_onnxruntime(model_of(args, 21), a)[0], strict=True)


def test_float16_scales_each_mode_matches_its_peer():
    """With float16 scales the onnx reference computes the multiplier in float16 and onnxruntime in float32;
    search a fixed sequence of cases for one where they disagree and check each mode against its peer. Without
    VNNI the int8 weights are [-64, 63], lest onnxruntime's int16 saturation be the disagreement found."""
    rng = np.random.default_rng(2024)
    for _ in range(200):
        a = rng.integers(0, 256, (4, 16), dtype=np.uint8)
        b = rng.integers(-128, 128, (16, 4), dtype=np.int8)
        if not onnxruntime_exact_for_weights(b, a.dtype):
            b >>= 1
        sa, sb = (f16(v) for v in np.exp(rng.uniform(-6, 0, 2)))
        sy = f16(float(sa) * float(sb) * 74 * 74 * 4 / 64 * rng.uniform(0.25, 4))
        args = (a, sa, np.uint8(rng.integers(256)), b, sb, np.int8(rng.integers(-128, 128)), sy, np.uint8(rng.integers(256)))
        model = model_of(args, 21)
        reference, onnxruntime = run_reference(model, a)[0], run_onnxruntime(model, a)[0]
        if np.any(reference != onnxruntime):
            break
    else:
        pytest.fail("no float16 case where the peers disagree")
    np.testing.assert_array_equal(qlinear_matmul(*args), reference, strict=True)
    np.testing.assert_array_equal(qlinear_matmul(*args, requantize="float32"), onnxruntime, strict=True)


def test_onnxruntime_full_range_int8_weights():
    """Exact with VNNI; without VNNI onnxruntime saturates pairs of u8*s8 products to int16 (docs/semantics.md)."""
    a = np.full((4, 64), 255, np.uint8)
    b = np.full((64, 3), -128, np.int8)
    b[:, 1] = 127
    args = (a, f32(1.0), np.uint8(0), b, f32(1.0), np.int8(0), f32(255 * 128 * 64 / 100), np.uint8(128))
    model = model_of(args, 21)
    np.testing.assert_array_equal(qlinear_matmul(*args), run_reference(model, a)[0], strict=True)
    got = run_onnxruntime(model, a)[0]
    expected = qlinear_matmul(*args, requantize="float32")
    if cpu_has_vnni():
        np.testing.assert_array_equal(got, expected, strict=True)
    else:
        assert np.any(got != expected), "onnxruntime became exact without VNNI: update docs/semantics.md"


@pytest.mark.parametrize("types", [(U8, U8, U8), (U8, S8, U8), (S8, S8, S8), (S8, U8, U8), (U8, U8, S8)])
@pytest.mark.parametrize("a_high,b_high", [(True, False), (False, True), (True, True)])
def test_worst_case_extremes_match_reference_evaluator(types, a_high, b_high):
    a_t, b_t, y_t = types
    ai, bi, yi = np.iinfo(a_t), np.iinfo(b_t), np.iinfo(y_t)
    a = np.full((2, 3, 40), ai.max if a_high else ai.min, a_t)
    b = np.full((40, 5), bi.max if b_high else bi.min, b_t)
    a_zp = a_t.type(ai.min if a_high else ai.max)
    b_zp = np.full((1, 5), bi.min if b_high else bi.max, b_t)
    for y_zp in (yi.min, yi.max):
        args = (a, f32(0.5), a_zp, b, np.full((1, 5), 3e-4, f32), b_zp, f32(2.5), y_t.type(y_zp))
        np.testing.assert_array_equal(qlinear_matmul(*args), run_reference(model_of(args, 21), a)[0], strict=True)


def test_accumulator_leaving_int32_is_an_error():
    k = 33026  # 33026 * 255 * 255 > 2**31 - 1
    a = np.full((1, k), 255, np.uint8)
    b = np.zeros((k, 1), np.uint8)
    with pytest.raises(AccumulatorOverflowError, match=r"qlinear_matmul: the exact accumulator .* leaves the int32 range"):
        qlinear_matmul(a, f32(1), np.uint8(0), b, f32(1), np.uint8(255), f32(1), np.uint8(0))


def _valid():
    return dict(a=np.zeros((2, 3, 4), np.uint8), a_scale=f32(0.1), a_zero_point=np.uint8(0),
                b=np.zeros((4, 5), np.int8), b_scale=np.full(5, 0.1, f32), b_zero_point=np.zeros(5, np.int8),
                y_scale=f32(0.2), y_zero_point=np.uint8(0))


ERRORS = [
    ({"a": np.zeros((2, 3, 4), np.uint16)}, TypeError,
     "qlinear_matmul: a must have dtype uint8 or int8 or float8_e4m3fn or float8_e4m3fnuz or float8_e5m2 or float8_e5m2fnuz, got uint16"),
    ({"a": np.zeros((2, 3, 4), np.uint16), "opset": 10}, TypeError, "qlinear_matmul: a must have dtype uint8 or int8, got uint16"),
    # float8 a/b/y are QLinearMatMul-21 types (tests/ops/test_qlinear_matmul_float8.py); opset 10 has none.
    ({"b": np.zeros((4, 5), ml_dtypes.float8_e4m3fn), "opset": 10}, TypeError,
     r"qlinear_matmul: float8 b \(float8_e4m3fn\) needs QLinearMatMul-21 \(opset >= 21\); QLinearMatMul-10 allows uint8 or int8, got opset 10"),
    ({"y_zero_point": np.asarray(0, ml_dtypes.float8_e5m2), "opset": 10}, TypeError, r"qlinear_matmul: float8 y_zero_point \(float8_e5m2\) needs QLinearMatMul-21"),
    ({"a": np.zeros((), np.uint8)}, ValueError, "qlinear_matmul: a and b must have at least 1 dimension"),
    ({"b": np.zeros((3, 5), np.int8), "b_scale": f32(1), "b_zero_point": np.int8(0)}, ValueError,
     r"qlinear_matmul: the last dimension of a \(4\) must equal the second-to-last dimension of b \(3\)"),
    ({"b": np.zeros((3, 4, 5), np.int8)}, ValueError, r"qlinear_matmul: the batch dimensions of a \(2,\) and b \(3,\) do not broadcast"),
    ({"a_scale": np.full(3, 0.1, f32)}, ValueError, r"qlinear_matmul: a_scale must be a scalar \(per tensor\) or per row of a, shape \(2, 3, 1\), got shape \(3,\)"),
    ({"a_zero_point": np.zeros((2, 3), np.uint8)}, ValueError, r"qlinear_matmul: a_zero_point must be a scalar \(per tensor\) or per row of a"),
    ({"b_scale": np.full((5, 1), 0.1, f32)}, ValueError, r"qlinear_matmul: b_scale must be a scalar \(per tensor\) or per column of b, shape \(5,\)"),
    ({"b_zero_point": np.zeros(4, np.int8)}, ValueError, r"qlinear_matmul: b_zero_point must be a scalar \(per tensor\) or per column of b"),
    ({"y_scale": np.full(5, 0.1, f32)}, ValueError, r"qlinear_matmul: y_scale must be a scalar or a 1-element 1-D tensor"),
    ({"y_zero_point": np.zeros(2, np.uint8)}, ValueError, r"qlinear_matmul: y_zero_point must be a scalar or a 1-element 1-D tensor"),
    ({"a_zero_point": np.int8(0)}, TypeError, r"qlinear_matmul: a_zero_point must have the dtype of a \(uint8\), got int8"),
    ({"b_zero_point": np.uint8(0)}, TypeError, r"qlinear_matmul: b_zero_point must have the dtype of b \(int8\), got uint8"),
    ({"y_zero_point": np.int16(0)}, TypeError, r"qlinear_matmul: y_zero_point must have dtype uint8 or int8 or float8_e4m3fn or .*, got int16"),
    ({"y_zero_point": np.int16(0), "opset": 10}, TypeError, r"qlinear_matmul: y_zero_point must have dtype uint8 or int8, got int16"),
    ({"a_scale": f16(0.1), "b_scale": f16(0.1)}, TypeError,
     r"qlinear_matmul: a_scale, b_scale and y_scale must share one dtype \(TS\), got float16, float16, float32"),
    ({"a_scale": f16(0.1), "b_scale": f16(0.1), "y_scale": f16(0.2), "opset": 10}, TypeError,
     r"qlinear_matmul: a_scale must have dtype float32, got float16"),
    ({"a_scale": np.float64(0.1)}, TypeError, r"qlinear_matmul: a_scale must have dtype float32 or float16 or bfloat16, got float64"),
    ({"b_scale": np.full(5, -0.1, f32)}, ValueError, r"qlinear_matmul: b_scale must be positive and finite"),
    ({"opset": 9}, ValueError, r"qlinear_matmul: opset must be >= 10 \(QLinearMatMul's first version\), got 9"),
    ({"opset": "21"}, TypeError, r"qlinear_matmul: opset must be an integer or None, got str"),
    ({"requantize": "rne"}, ValueError, r"qlinear_matmul: requantize must be one of 'float64', 'float32', 'tflite', 'tflite-single', 'xnnpack', got 'rne'"),
    ({"a_scale": f32(1e-30), "b_scale": np.full(5, 1e-30, f32), "y_scale": f32(1e30)}, None, None),
    ({"a_scale": f32(1e30), "b_scale": np.full(5, 1e30, f32)}, ValueError, r"qlinear_matmul: a_scale \* b_scale / y_scale overflows float32"),
]


@pytest.mark.parametrize("change,error,message", ERRORS, ids=[str(m)[:60] for _, _, m in ERRORS])
def test_argument_errors(change, error, message):
    kwargs = {**_valid(), **change}
    if error is None:  # an underflowing multiplier is legal: every output is the zero point
        assert np.all(qlinear_matmul(**kwargs) == 0)
        return
    with pytest.raises(error, match=message):
        qlinear_matmul(**kwargs)


def test_vector_operands_follow_numpy_matmul():
    rng = np.random.default_rng(7)
    a1 = rng.integers(0, 256, 6, dtype=np.uint8)
    b1 = rng.integers(-128, 128, 6, dtype=np.int8)
    b2 = rng.integers(-128, 128, (3, 6, 2), dtype=np.int8)
    if not (onnxruntime_exact_for_weights(b1) and onnxruntime_exact_for_weights(b2)):
        b1, b2 = b1 >> 1, b2 >> 1  # into [-64, 63], where onnxruntime is exact without VNNI too
    for a, b in ((a1, b2), (a1, b1), (rng.integers(0, 256, (2, 5, 6), dtype=np.uint8), b1)):
        args = (a, f32(0.05), np.uint8(3), b, f32(0.02), np.int8(-4), f32(0.5), np.uint8(128))
        got = qlinear_matmul(*args)
        assert got.shape == np.matmul(a.astype(np.int32), b.astype(np.int32)).shape
        np.testing.assert_array_equal(got, run_reference(model_of(args, 21), a)[0].reshape(got.shape), strict=True)
        np.testing.assert_array_equal(qlinear_matmul(*args, requantize="float32"), run_onnxruntime(model_of(args, 21), a)[0], strict=True)


SHAPES = {  # a shape, b shape: large enough to reach onnxruntime's production GEMM kernels
    "gemm": ((96, 256), (256, 80)),
    "batched": ((3, 40, 128), (3, 128, 70)),
    "broadcast_b": ((2, 3, 33, 65), (65, 47)),
    "gemv": ((1, 300), (300, 64)),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("types", ONNXRUNTIME_TYPES, ids=lambda t: "".join("u8" if d == U8 else "s8" for d in t))
@pytest.mark.parametrize("per_column", [False, True])
def test_realistic_shapes_match_both_peers(shape, types, per_column):
    a_shape, b_shape = SHAPES[shape]
    a_t, b_t, y_t = types
    rng = np.random.default_rng([sorted(SHAPES).index(shape), ONNXRUNTIME_TYPES.index(types), per_column])
    ai, bi = np.iinfo(a_t), np.iinfo(b_t)
    a = rng.integers(ai.min, ai.max + 1, a_shape).astype(a_t)
    b = rng.integers(bi.min, bi.max + 1, b_shape).astype(b_t)
    n = b_shape[-1]
    param_shape = b_shape[:-2] + (1, n) if per_column else ()
    b_scale = (rng.uniform(0.5, 1.5, param_shape) * 0.004).astype(f32)
    b_zp = rng.integers(bi.min, bi.max + 1, param_shape).astype(b_t)
    y_scale = f32(0.03 * 0.004 * 74 * 74 * np.sqrt(a_shape[-1]) / 64)
    args = (a, f32(0.03), a_t.type(rng.integers(ai.min, ai.max + 1)), b, b_scale, b_zp, y_scale, y_t.type(rng.integers(-100, 100) + (128 if y_t == U8 else 0)))
    model = model_of(args, 21)
    np.testing.assert_array_equal(qlinear_matmul(*args), run_reference(model, a)[0], strict=True)
    if onnxruntime_exact_for_weights(b, a_t):
        np.testing.assert_array_equal(qlinear_matmul(*args, requantize="float32"), run_onnxruntime(model, a)[0], strict=True)


def test_a_repeated_call_reuses_what_it_prepared_and_never_a_stale_one(monkeypatch):
    """A 2-D call with the arguments of an earlier one runs what that call prepared (qlinear_matmul._PREPARED):
    the result is the reference's every time, after the caller changes b or a scale in place too, and
    arguments that must be refused still are."""
    from qlinear.ops import qlinear_matmul as qm

    monkeypatch.setattr(qm, "_PREPARED", {})
    monkeypatch.setattr(qm, "_LAST", [None])

    rng = np.random.default_rng(21)
    a = rng.integers(0, 256, (5, 40), dtype=np.uint8)
    b = rng.integers(-128, 128, (40, 24), dtype=np.int8)
    b_scale = np.linspace(0.001, 0.003, 24).astype(np.float32)

    def expected():
        acc = matmul_accumulate(a, np.uint8(7), b, np.int8(0))
        multiplier = requantize_multiplier(np.float32(0.02), b_scale, np.float32(0.5), "float64", a.dtype)
        return requantize(acc, multiplier, np.uint8(3), "float64")

    def call():
        return qlinear_matmul(a, np.float32(0.02), np.uint8(7), b, b_scale, np.int8(0), np.float32(0.5), np.uint8(3))

    for _ in range(3):
        a[:] = rng.integers(0, 256, a.shape, dtype=np.uint8)
        np.testing.assert_array_equal(call(), expected())
    # ... and the GEMM's set-up (its GemmLaunch) with it, while the packed weights and the kernel path stay.
    from qlinear.kernels import integer_gemm

    (entry,) = qm._PREPARED.values()
    launch = entry.launch[0]
    a[:] = rng.integers(0, 256, a.shape, dtype=np.uint8)
    np.testing.assert_array_equal(call(), expected())
    assert entry.launch[0] is launch
    # a path the default run compiles anyway (suite.other_paths: AVX2), else any other
    other = next((p for p in other_paths(integer_gemm.available_paths()) + integer_gemm.available_paths()
                  if p not in (integer_gemm.current_path(), "blas")), None)
    if other is not None:  # another kernel path: its own launch (the key holds the path), the same bits
        with integer_gemm.force_path(other):
            np.testing.assert_array_equal(call(), expected())
        np.testing.assert_array_equal(call(), expected())
        assert entry.launch[0] is launch
    # New scalar objects of the same values (as call() writes them) take the last call's preparation without
    # building a key (qa.LastCall)
    keys = []
    original = qm.qa.call_key
    monkeypatch.setattr(qm.qa, "call_key", lambda *args: keys.append(args) or original(*args))
    np.testing.assert_array_equal(call(), expected())
    assert keys == []
    monkeypatch.setattr(qm.qa, "call_key", original)
    kept = len(qm._PREPARED)
    b[0, :] = 100  # in place: the packing cache sees the new values
    np.testing.assert_array_equal(call(), expected())
    b_scale[5] *= 3  # a new key
    np.testing.assert_array_equal(call(), expected())
    assert len(qm._PREPARED) == kept + 1
    with pytest.raises(TypeError, match="qlinear_matmul: a must have dtype"):
        qlinear_matmul(a.astype(np.int16), np.float32(0.02), np.uint8(7), b, b_scale, np.int8(0), np.float32(0.5),
                       np.uint8(3))
    with pytest.raises(ValueError, match="y_scale must be positive and finite"):
        qlinear_matmul(a, np.float32(0.02), np.uint8(7), b, b_scale, np.int8(0), np.float32(-1), np.uint8(3))


def test_prepacked_weights_give_the_plain_array_s_bits_and_skip_the_byte_check(monkeypatch):
    """`prepack_matmul`'s result passed as b gives the int64 reference's bits (requantized as the reference does), per
    tensor and per column, in qlinear_matmul and matmul_integer, without comparing b's bytes with the packing
    cache's copy; changing the array it was made from changes nothing; another zero point still gives the
    reference's result; the docstring's example runs."""
    import doctest

    import qlinear
    from qlinear.kernels import packing_cache
    from qlinear.ops import qlinear_matmul as qm

    assert doctest.testmod(qm, optionflags=doctest.ELLIPSIS).failed == 0
    rng = np.random.default_rng(31)
    a = rng.integers(0, 256, (5, 64), dtype=np.uint8)
    b = rng.integers(-128, 128, (64, 40), dtype=np.int8)
    b_scale = np.linspace(0.001, 0.003, 40).astype(np.float32)
    for b_zp in (np.int8(0), np.int8(3), rng.integers(-5, 5, 40).astype(np.int8)):
        packed = qlinear.prepack_matmul(b, b_zp)
        assert packed.shape == b.shape and packed.dtype == b.dtype and not packed.weights.flags.writeable
        compared = []
        original = packing_cache._same
        monkeypatch.setattr(packing_cache, "_same", lambda *args: compared.append(1) or original(*args))
        for _ in range(3):
            got = qlinear_matmul(a, np.float32(0.02), np.uint8(7), packed, b_scale, b_zp, np.float32(0.5), np.uint8(3))
            # the int64 reference's accumulator, requantized as the reference does
            multiplier = requantize_multiplier(np.float32(0.02), b_scale, np.float32(0.5), "float64", a.dtype)
            np.testing.assert_array_equal(got, requantize(matmul_accumulate(a, np.uint8(7), b, b_zp), multiplier,
                                                          np.uint8(3), "float64"))
            compared.clear()
            qlinear_matmul(a, np.float32(0.02), np.uint8(7), packed, b_scale, b_zp, np.float32(0.5), np.uint8(3))
            assert compared == []
        monkeypatch.setattr(packing_cache, "_same", original)
        np.testing.assert_array_equal(qlinear.matmul_integer(a, packed, np.uint8(7), b_zp),
                                      matmul_accumulate(a, np.uint8(7), b, b_zp))
    kept = b.copy()
    b[:] = 1  # the packed weights are a copy
    np.testing.assert_array_equal(qlinear.matmul_integer(a, packed, np.uint8(7), b_zp),
                                  matmul_accumulate(a, np.uint8(7), kept, b_zp))
    np.testing.assert_array_equal(qlinear.matmul_integer(a, packed, np.uint8(7), np.int8(1)),  # another zero point
                                  matmul_accumulate(a, np.uint8(7), kept, np.int8(1)))
    with pytest.raises(ValueError, match="prepack_matmul: b must be 2-D"):
        qlinear.prepack_matmul(np.zeros((2, 3, 4), np.int8))
    with pytest.raises(TypeError, match="prepack_matmul: b must have dtype"):
        qlinear.prepack_matmul(np.zeros((2, 3), np.int16))
